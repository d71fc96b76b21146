"""Process settings from the environment (``SIGNOFF_*``)."""

from __future__ import annotations

import hashlib
import hmac
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_PLACEHOLDERS = {"", "changeme", "change-me", "secret", "admin", "password", "token"}
MIN_ADMIN_TOKEN_CHARS = 24
"""Outside development, shorter admin tokens are refused (``token_urlsafe(24)`` gives 32)."""
_MAKE_ONE = "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SIGNOFF_", extra="ignore")

    environment: str = "production"
    """``development`` allows an unset admin token; anything else refuses placeholders."""
    database_url: str = Field(default_factory=lambda: f"sqlite+aiosqlite:///{Path.cwd() / 'signoff.db'}")
    database_pooling: Literal["none", "transaction"] = "none"
    """``transaction``: SIGNOFF_DATABASE_URL reaches PostgreSQL through a pooler in transaction
    pooling (PgBouncer's ``pool_mode = transaction``), so no prepared statement may outlive its
    transaction (``SIGNOFF_DATABASE_POOLING``). LISTEN needs a session of its own: set
    ``SIGNOFF_LISTEN_DATABASE_URL`` to PostgreSQL itself."""
    listen_database_url: str | None = None
    """Where the server LISTENs for the decisions other processes commit: PostgreSQL itself,
    never a transaction pooler (``SIGNOFF_LISTEN_DATABASE_URL``). Unset: SIGNOFF_DATABASE_URL,
    unless that is pooled; without LISTEN, waiters hear of those decisions by the 1 s poll."""
    sqlite_sync: Literal["full", "normal"] = "full"
    """On SQLite, how a commit reaches the disk (``SIGNOFF_SQLITE_SYNC``): ``full`` syncs every
    request and decision before anyone is told; ``normal`` is faster but may lose the last
    decisions and requests on a power loss or an OS crash (see signoff.app.sqlite.Sync)."""
    config: Path | None = None
    """The YAML file with channels, people and agents (``SIGNOFF_CONFIG``)."""
    admin_token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    migrate_on_start: bool = True
    log_format: Literal["json", "text"] = "json"
    log_level: str = "INFO"

    max_body_bytes: int = 64 * 1024
    max_argument_depth: int = 32
    max_argument_bytes: int = 32 * 1024
    max_wait_seconds: float = 60.0
    sweep_interval_seconds: float = 1.0
    outbox_poll_seconds: float = 1.0
    outbox_lease_seconds: float = Field(default=30.0, gt=0)
    """How long a delivery is held by the dispatcher sending it; after a crash it is sent again
    once this runs out. Keep it well above the chat platform's slowest answer."""
    shutdown_seconds: int = Field(default=5, ge=1, le=300)
    """How long a stopping server (SIGTERM) gives requests in flight and the outbox's sends to
    finish; it exits within this and the time to close its connections (see signoff.app.drain)."""
    cross_process_poll_seconds: float = 1.0
    """How often a waiter re-reads its request, to learn of decisions made by another process."""
    session_secret: SecretStr | None = None
    """Signs the console's session cookies; unset: a random key per process (sign-ins end on restart)."""
    session_max_age_seconds: float = Field(default=12 * 3600, gt=0)
    """How long a console sign-in lasts."""
    receipt_key: SecretStr | None = None
    """The Ed25519 key receipts are signed with, for operators who manage keys
    (``SIGNOFF_RECEIPT_KEY``: the raw 32-byte private key in base64url, or PEM); unset: a key
    of the database's own, made on first start (see signoff.app.receipt_keys)."""
    receipt_key_file: Path | None = None
    """The same, from a file (``SIGNOFF_RECEIPT_KEY_FILE``)."""
    public_url: str | None = None
    """Where people reach this server (``SIGNOFF_PUBLIC_URL``, ``https://signoff.example.com``):
    the base of the links in emails. Links are signed with a key derived from
    ``SIGNOFF_SESSION_SECRET``, so every replica accepts them and they outlive restarts."""

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(
                "SIGNOFF_PUBLIC_URL must be the server's http(s) address without query or fragment "
                "(https://signoff.example.com)"
            )
        return value.strip().rstrip("/")

    def link_key(self) -> bytes | None:
        """The key that signs email links, derived from ``SIGNOFF_SESSION_SECRET`` (None: unset)."""
        if self.session_secret is None:
            return None
        secret = self.session_secret.get_secret_value().encode()
        return hmac.new(secret, b"signoff.email.links", hashlib.sha256).digest()

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Settings:
        token = self.admin_token.get_secret_value() if self.admin_token else None
        if token is None or self.environment == "development":
            return self
        if token.strip().lower() in _PLACEHOLDERS:
            raise ValueError(f"SIGNOFF_ADMIN_TOKEN is a placeholder; set a long random value {_MAKE_ONE}")
        if len(token.strip()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"SIGNOFF_ADMIN_TOKEN is too short ({len(token.strip())} of the {MIN_ADMIN_TOKEN_CHARS} "
                f"characters needed outside development); set a long random value {_MAKE_ONE}"
            )
        return self

    @model_validator(mode="after")
    def _refuse_weak_session_secret(self) -> Settings:
        secret = self.session_secret.get_secret_value() if self.session_secret else None
        if secret is None or self.environment == "development":
            return self
        if secret.strip().lower() in _PLACEHOLDERS:
            raise ValueError(f"SIGNOFF_SESSION_SECRET is a placeholder; set a long random value {_MAKE_ONE}")
        if len(secret.strip()) < 16:
            raise ValueError(f"SIGNOFF_SESSION_SECRET is too short; set a long random value {_MAKE_ONE}")
        return self

    @model_validator(mode="after")
    def _readable_receipt_key(self) -> Settings:
        if self.receipt_key is None and self.receipt_key_file is None:
            return self
        from signoff.app.receipt_keys import operator_key

        secret = self.receipt_key.get_secret_value() if self.receipt_key is not None else None
        try:
            operator_key(secret, self.receipt_key_file)
        except ValueError as exc:
            raise ValueError(
                f"SIGNOFF_RECEIPT_KEY: {exc}; give the raw 32-byte Ed25519 private key in base64url, "
                "or a PEM (PKCS#8), or unset it to let Signoff keep a key in the database"
            ) from None
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
