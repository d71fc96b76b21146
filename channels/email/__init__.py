"""The email channel: one message per approver with a signed link per choice.

``smtp_url`` says how to reach the mail server:

- ``smtps://user:password@host:465`` — TLS from the first byte (implicit TLS);
- ``smtp://user:password@host:587`` — plain connection upgraded with STARTTLS, which is
  required: a server that does not offer it is refused;
- ``smtp://host:25?starttls=false`` — no TLS at all (a relay on the same host or network).

User and password are percent-encoded in the URL (``@`` is ``%40``); without them no
``AUTH`` is sent. ``ca_file=/path/ca.pem`` trusts a private certificate authority too.

Importing this package needs only pydantic: the configuration model, the message renderer
and the link tokens are plain Python. ``aiosmtplib`` (the ``email`` extra) is imported when
:func:`create` builds a channel. Decisions come back through ``GET|POST /approve/{token}``
on the server; the channel only sends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.headerregistry import Address
from email.utils import parseaddr
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from signoff.channels._assurance import Assurance
from signoff.channels._contract import Identity
from signoff.channels.email._links import MAX_TOKEN_CHARS, LinkSigner, LinkToken
from signoff.channels.email._message import Choice, render_html, render_message, render_text, subject_of

if TYPE_CHECKING:
    from signoff.channels.email._channel import EmailChannel

__all__ = [
    "IDENTITY",
    "MAX_TOKEN_CHARS",
    "Choice",
    "EmailChannel",
    "EmailConfig",
    "LinkSigner",
    "LinkToken",
    "SmtpServer",
    "create",
    "render_html",
    "render_message",
    "render_text",
    "subject_of",
]

IDENTITY = Identity(
    user_id=re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s.]+$"), by_email=True, assurance=Assurance.EMAIL_LINK
)
"""People are addressed by the ``email`` of their directory entry (or an address written as
an approver); the address is their id on this channel type."""

_INSTALL_HINT = "the email channel needs aiosmtplib: pip install 'signoff[email]'"
_DEFAULT_PORTS = {"smtp": 587, "smtps": 465}
_QUERY_KEYS = {"starttls", "ca_file"}
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


@dataclass(frozen=True, slots=True)
class SmtpServer:
    """An ``smtp_url`` taken apart."""

    host: str
    port: int
    implicit_tls: bool
    starttls: bool
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None

    @property
    def encrypted(self) -> bool:
        return self.implicit_tls or self.starttls

    @classmethod
    def parse(cls, url: str) -> SmtpServer:
        """``ValueError`` naming what is wrong, never echoing the password."""
        parts = urlsplit(url.strip())
        if parts.scheme not in _DEFAULT_PORTS:
            raise ValueError("must start with smtp:// (STARTTLS) or smtps:// (implicit TLS)")
        try:
            port = parts.port or _DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ValueError("has a port that is not a number from 1 to 65535") from None
        if not parts.hostname:
            raise ValueError("must name the mail server's host (smtp://user:password@host:587)")
        if parts.path not in ("", "/") or parts.fragment:
            raise ValueError("takes no path or fragment, only ?starttls=… and ?ca_file=…")
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = set(query) - _QUERY_KEYS
        if unknown:
            raise ValueError(f"has unknown options {', '.join(sorted(unknown))} (known: starttls, ca_file)")
        starttls = parts.scheme == "smtp"
        if "starttls" in query:
            value = query["starttls"][-1].strip().lower()
            if value not in _BOOLEANS:
                raise ValueError("starttls is true or false")
            if parts.scheme == "smtps":
                raise ValueError("starttls applies to smtp://; smtps:// is TLS from the start")
            starttls = _BOOLEANS[value]
        ca_file = query["ca_file"][-1] if "ca_file" in query else None
        if ca_file is not None and not Path(ca_file).is_file():
            raise ValueError(f"ca_file {ca_file!r} is not a readable file")
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        return cls(
            host=parts.hostname,
            port=port,
            implicit_tls=parts.scheme == "smtps",
            starttls=starttls,
            username=username,
            password=password,
            ca_file=ca_file,
        )


class EmailConfig(BaseModel):
    """One email channel in the configuration file."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    type: Literal["email"]
    smtp_url: SecretStr
    """``smtps://user:password@host:465``, ``smtp://user:password@host:587`` (STARTTLS, required) or
    ``smtp://host:25?starttls=false``; write it as ``${SMTP_URL}``."""
    sender: str = Field(alias="from")
    """The ``From`` address (``signoff@example.com`` or ``Signoff <signoff@example.com>``)."""
    timeout_seconds: float = Field(default=15.0, gt=0, le=120)
    """How long connecting and each SMTP command may take."""

    @field_validator("smtp_url")
    @classmethod
    def _valid_url(cls, value: SecretStr) -> SecretStr:
        SmtpServer.parse(value.get_secret_value())
        return value

    @field_validator("sender")
    @classmethod
    def _valid_sender(cls, value: str) -> str:
        value = value.strip()
        _, address = parseaddr(value)
        if not IDENTITY.is_user_id(address) or any(c in value for c in "\r\n"):
            raise ValueError("must be an email address (signoff@example.com)")
        try:
            Address(addr_spec=address)
        except (ValueError, IndexError):
            raise ValueError("must be an email address (signoff@example.com)") from None
        return value

    @property
    def server(self) -> SmtpServer:
        return SmtpServer.parse(self.smtp_url.get_secret_value())

    @property
    def sender_domain(self) -> str:
        return parseaddr(self.sender)[1].rsplit("@", 1)[1]

    def warnings(self) -> list[str]:
        """What this channel's settings weaken (shown by ``signoff config check`` and at start)."""
        server = self.server
        if server.encrypted or server.host in ("localhost", "127.0.0.1", "::1"):
            return []
        what = "the password and the approval links" if server.username else "the approval links"
        return [f"smtp_url: starttls=false sends {what} unencrypted to {server.host}; use TLS"]


def create(name: str, config: EmailConfig, links: LinkSigner) -> EmailChannel:
    """Build the channel called ``name``; raises :class:`ImportError` without the ``email`` extra."""
    try:
        from signoff.channels.email._channel import EmailChannel
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return EmailChannel(name, config, links)


def __getattr__(attr: str) -> object:
    # EmailChannel needs aiosmtplib; resolve it on first use so the config model imports without it.
    if attr == "EmailChannel":
        try:
            from signoff.channels.email._channel import EmailChannel
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        return EmailChannel
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
