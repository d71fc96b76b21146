"""The ntfy channel: phone push with Approve / Reject on the lock screen.

`ntfy <https://ntfy.sh>`_ is an open-source, self-hostable push service; its Android and iOS
apps show a notification's action buttons without opening the app. Each approver still
waited on gets a notification of their own, published to their topic (``ntfy: <topic>`` in
``people``), carrying the call (title, tool, agent, a short form of every argument field,
time left) and three actions: Approve and Reject are ``http`` actions that POST a signed
token for that person, request and choice to ``/callbacks/ntfy/{channel}`` on this server
(like the email channel's links), and Open is a ``view`` action to the request's console
page.

A topic is a secret: on a server without access control, whoever knows a topic can read
its notifications, and with them the tokens that decide as its person. Give each person a
long random topic, and on your own ntfy server deny anonymous access and give each person
read access to their topic only, and Signoff a token that may only write
(``ntfy access``, ``ntfy token``): see docs/ntfy.md.

Importing this package needs only pydantic; the I/O (httpx) is in ``_channel``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from signoff.channels._assurance import Assurance
from signoff.channels._contract import Identity
from signoff.channels.email._links import LinkSigner
from signoff.channels.ntfy._message import Action, Notification, render_notification

if TYPE_CHECKING:
    from signoff.channels.ntfy._channel import NtfyChannel

__all__ = [
    "IDENTITY",
    "TOPIC",
    "Action",
    "Notification",
    "NtfyChannel",
    "NtfyConfig",
    "create",
    "render_notification",
]

TOPIC = re.compile(r"^[-_A-Za-z0-9]{1,64}$")
"""What ntfy accepts as a topic name (its server's ``topicRegex``)."""

IDENTITY = Identity(user_id=TOPIC, personal=True, assurance=Assurance.NTFY_LINK, secret_ids=True)
"""People are reached at their own topic (``ntfy: <topic>`` in ``people``), which is also
their id on this channel type: every approver of an ntfy gate is a person with one. A topic
is a secret (it reads its person's notifications)."""

_LOOPBACK = ("localhost", "127.0.0.1", "::1")


class NtfyConfig(BaseModel):
    """One ntfy channel in the configuration file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["ntfy"]
    server: str
    """The ntfy server's base URL (``https://ntfy.sh``, ``https://ntfy.example.com``)."""
    token: SecretStr | None = None
    """An ntfy access token (``tk_…``) sent as ``Authorization: Bearer``; write it as
    ``${NTFY_TOKEN}``. Needed when the server's access control denies anonymous writes."""
    priority: int = Field(default=4, ge=1, le=5)
    """The notifications' priority (1 min, 3 default, 4 high, 5 max)."""
    timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    """How long one publish may take."""

    @field_validator("server")
    @classmethod
    def _valid_server(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be the ntfy server's URL (https://ntfy.sh or https://ntfy.example.com)")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("takes no query, fragment or credentials; put an access token in `token`")
        return value

    @field_validator("token")
    @classmethod
    def _valid_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (
            not value.get_secret_value().strip() or any(c in value.get_secret_value() for c in "\r\n ")
        ):
            raise ValueError("must be an ntfy access token (tk_…) without spaces; or leave token out")
        return value

    def warnings(self) -> list[str]:
        """What this channel's settings weaken (shown by ``signoff config check`` and at start)."""
        parts = urlsplit(self.server)
        if parts.scheme == "https" or parts.hostname in _LOOPBACK:
            return []
        return [
            f"server: http:// sends the notifications and their approval tokens unencrypted "
            f"to {parts.hostname}; use https://"
        ]


def create(name: str, config: NtfyConfig, links: LinkSigner) -> NtfyChannel:
    """Build the channel called ``name``: its actions carry tokens ``links`` signs."""
    from signoff.channels.ntfy._channel import NtfyChannel

    return NtfyChannel(name, config, links)


def __getattr__(attr: str) -> object:
    if attr == "NtfyChannel":
        from signoff.channels.ntfy._channel import NtfyChannel

        return NtfyChannel
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
