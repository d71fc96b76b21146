"""Configuration of one Feishu / Lark channel (one app, one group chat)."""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["FeishuConfig"]

_LOOPBACK_NAMES = frozenset({"localhost"})


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class FeishuConfig(BaseModel):
    """``type: feishu`` under ``channels:`` in the YAML configuration.

    ``verification_token`` and ``encrypt_key`` come from the app's
    "Events & Callbacks → Encryption Strategy" page. With an encrypt key every
    callback must arrive encrypted and signed. Without one, Feishu signs nothing:
    callbacks carry only the verification token, so whoever learns it can forge
    clicks as anyone and replay them forever. A webhook channel without an
    encrypt key must therefore say so with ``allow_unsigned: true``.
    """

    model_config = ConfigDict(extra="forbid")

    type: Literal["feishu"]
    app_id: str = Field(min_length=1)
    app_secret: SecretStr
    verification_token: SecretStr | None = None
    encrypt_key: SecretStr | None = None
    chat_id: str = Field(min_length=1)
    """The group chat (``oc_…``) the bot posts approval cards to; the bot must be a member."""
    domain: Literal["feishu", "lark"] = "feishu"
    """``feishu`` → open.feishu.cn, ``lark`` → open.larksuite.com."""
    base_url: str | None = None
    """Another API origin (a proxy, or a local fake in tests); overrides ``domain``."""
    mode: Literal["webhook", "websocket"] = "webhook"
    """``websocket`` receives clicks over the SDK's long connection: no public URL needed."""
    allow_unsigned: bool = False
    """Accept callbacks authenticated by the verification token alone (no encrypt key): no
    signature, no time window, any ``open_id``. Off: such callbacks are refused."""

    @field_validator("app_secret", "verification_token", "encrypt_key")
    @classmethod
    def _no_padding(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value()
        if not raw:
            raise ValueError("must not be empty; leave it out instead")
        # A pasted key with a trailing newline silently breaks decryption and signatures.
        if raw != raw.strip():
            raise ValueError("has leading or trailing whitespace")
        return value

    @field_validator("base_url")
    @classmethod
    def _origin_only(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        host = (parts.hostname or "").lower()
        if parts.scheme == "http":
            if not _is_loopback(host):
                raise ValueError("must use https (http is allowed for loopback only)")
        elif parts.scheme != "https":
            raise ValueError("must be an https:// origin")
        if not host or parts.username is not None or parts.password is not None:
            raise ValueError("must name a host and no credentials")
        if parts.path or parts.query or parts.fragment:
            raise ValueError("must be an origin (scheme://host[:port]) without path, query or trailing slash")
        return value

    @model_validator(mode="after")
    def _webhook_is_authenticated(self) -> FeishuConfig:
        if self.mode == "webhook" and self.verification_token is None and self.encrypt_key is None:
            raise ValueError("a webhook channel needs verification_token or encrypt_key (preferably both)")
        if self.allow_unsigned and self.encrypt_key is not None:
            raise ValueError(
                "allow_unsigned does nothing with an encrypt_key (every callback must then be "
                "encrypted and signed); remove it"
            )
        if self.mode == "webhook" and self.encrypt_key is None and not self.allow_unsigned:
            raise ValueError(
                "without encrypt_key, Feishu callbacks are unsigned: anyone with the verification "
                "token could forge or replay clicks as anyone. Set encrypt_key (recommended), or "
                "allow_unsigned: true to accept that"
            )
        return self

    def warnings(self) -> list[str]:
        """Settings that are valid but weaken security, as ``field: message`` lines."""
        if not self.allow_unsigned:
            return []
        return [
            "allow_unsigned: callbacks are authenticated by the verification token alone: unsigned, "
            "with no time window, replayable, from any open_id; set encrypt_key instead"
        ]

    @property
    def api_origin(self) -> str:
        """Where the SDK sends Open API requests."""
        if self.base_url is not None:
            return self.base_url
        return "https://open.larksuite.com" if self.domain == "lark" else "https://open.feishu.cn"
