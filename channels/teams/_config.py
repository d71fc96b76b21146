"""Configuration of one Microsoft Teams channel (one bot registration, one conversation)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator

__all__ = ["BOT_FRAMEWORK_METADATA", "BOT_FRAMEWORK_SCOPE", "GUID", "TeamsConfig", "checked_url"]

BOT_FRAMEWORK_METADATA = "https://login.botframework.com/v1/.well-known/openidconfiguration"
"""The OpenID metadata of the Bot Connector service (public cloud): its issuer and signing keys."""
BOT_FRAMEWORK_SCOPE = "https://api.botframework.com/.default"
"""The scope of the client-credentials token the connector takes (public cloud)."""
GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def checked_url(value: str) -> str:
    """``value`` if it is an https URL (http only to loopback) with a host and no credentials;
    ``ValueError`` naming what is wrong otherwise."""
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    host = (parts.hostname or "").lower()
    if parts.scheme == "http":
        if not _is_loopback(host):
            raise ValueError("must use https (http is allowed for loopback only)")
    elif parts.scheme != "https":
        raise ValueError("must be an https:// URL")
    if not host or parts.username is not None or parts.password is not None:
        raise ValueError("must name a host and no credentials")
    return value.strip()


class TeamsConfig(BaseModel):
    """``type: teams`` under ``channels:`` in the YAML configuration (docs/teams.md).

    ``app_id`` and ``app_password`` are the bot's Microsoft Entra app registration (its client
    id and a client secret), ``tenant_id`` the tenant it is registered in and whose people
    click. Cards go to ``conversation_id`` (a channel ``19:…@thread.tacv2`` or a group chat)
    through the Bot Connector at ``service_url``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["teams"]
    app_id: str
    """The bot's Microsoft App ID (a GUID): the audience every invoke's token must carry."""
    app_password: SecretStr
    """A client secret of the app registration (``${TEAMS_APP_PASSWORD}``)."""
    tenant_id: str
    """The Microsoft Entra tenant (a GUID): tokens are asked of it, and clicks from others are refused."""
    conversation_id: str
    """Where cards are posted: a Teams channel's or a group chat's conversation id."""
    service_url: str = "https://smba.trafficmanager.net/teams/"
    """The Bot Connector endpoint cards are posted through (an invoke's ``serviceUrl`` says it too)."""
    openid_metadata_url: str = BOT_FRAMEWORK_METADATA
    """The OpenID metadata naming the issuer and signing keys of invokes (sovereign clouds, tests)."""
    token_url: str | None = None
    """The client-credentials token endpoint; default
    ``https://login.microsoftonline.com/<tenant_id>/oauth2/v2.0/token`` (a single-tenant bot)."""
    token_scope: str = BOT_FRAMEWORK_SCOPE
    """The scope asked for (``https://api.botframework.us/.default`` in the US government clouds)."""

    @field_validator("app_id", "tenant_id")
    @classmethod
    def _guid(cls, value: str) -> str:
        value = value.strip()
        if not GUID.match(value):
            raise ValueError(
                "must be a GUID like 00000000-0000-0000-0000-000000000000 (from the app registration)"
            )
        return value.lower()

    @field_validator("app_password")
    @classmethod
    def _secret(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        if not raw.strip():
            raise ValueError("must not be empty; set it to a client secret of the app registration")
        if raw != raw.strip():
            raise ValueError("has leading or trailing whitespace; paste the client secret alone")
        return value

    @field_validator("conversation_id")
    @classmethod
    def _conversation(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c in value for c in "/?#") or any(c.isspace() for c in value):
            raise ValueError("must be a Teams conversation id like 19:…@thread.tacv2 (no spaces, / ? or #)")
        return value

    @field_validator("service_url", "openid_metadata_url", "token_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else checked_url(value)

    @property
    def token_endpoint(self) -> str:
        """Where the client-credentials token is asked for."""
        return self.token_url or f"https://login.microsoftonline.com/{self.tenant_id}/oauth2/v2.0/token"

    @property
    def connector(self) -> str:
        """``service_url`` without its trailing slash."""
        return self.service_url.rstrip("/")
