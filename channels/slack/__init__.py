"""The Slack channel: Block Kit approval cards, a signed interactivity webhook, Socket Mode.

Importing this package needs only pydantic: the configuration model, the card
renderer and the callback verification are plain Python. ``slack-sdk`` and
``aiohttp`` (the ``slack`` extra) are imported when :func:`create` builds a
channel.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

from signoff.channels._assurance import Assurance
from signoff.channels._contract import Identity
from signoff.channels.slack._blocks import (
    ACTION_APPROVE,
    ACTION_EDIT,
    ACTION_GRANT,
    ACTION_REJECT,
    EDIT_ACTION_ID,
    EDIT_MODAL_CALLBACK_ID,
    REASON_ACTION_ID,
    REASON_BLOCK_ID,
    REJECT_MODAL_CALLBACK_ID,
    edit_block_id,
    grant_value,
    render_card,
    render_edit_modal,
    render_reject_modal,
)
from signoff.channels.slack._payload import (
    MAX_BODY_BYTES,
    SIGNATURE_WINDOW_SECONDS,
    click_from_block_actions,
    click_from_view_submission,
    edit_from_view_submission,
    edit_press,
    parse_payload,
    verify_request,
)

if TYPE_CHECKING:
    from signoff.channels.slack._channel import SlackChannel

__all__ = [
    "ACTION_APPROVE",
    "ACTION_EDIT",
    "ACTION_GRANT",
    "ACTION_REJECT",
    "EDIT_ACTION_ID",
    "EDIT_MODAL_CALLBACK_ID",
    "IDENTITY",
    "MAX_BODY_BYTES",
    "REASON_ACTION_ID",
    "REASON_BLOCK_ID",
    "REJECT_MODAL_CALLBACK_ID",
    "SIGNATURE_WINDOW_SECONDS",
    "SlackChannel",
    "SlackConfig",
    "click_from_block_actions",
    "click_from_view_submission",
    "create",
    "edit_block_id",
    "edit_from_view_submission",
    "edit_press",
    "grant_value",
    "parse_payload",
    "render_card",
    "render_edit_modal",
    "render_reject_modal",
    "verify_request",
]

IDENTITY = Identity(user_id=re.compile(r"^[UW][A-Z0-9]{2,}$"), assurance=Assurance.SLACK_SIGNED)
"""Slack user ids: ``U…`` (or ``W…`` on Enterprise Grid)."""

_INSTALL_HINT = "the slack channel needs slack-sdk and aiohttp: pip install 'signoff[slack]'"


class SlackConfig(BaseModel):
    """One Slack channel in the configuration file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["slack"]
    bot_token: SecretStr
    """Bot token (``xoxb-…``) with ``chat:write``, ``users:read`` and ``users:read.email``."""
    signing_secret: SecretStr | None = None
    """The app's signing secret, for verifying the interactivity callbacks Slack posts to this
    server; not needed with ``app_token`` (Socket Mode), where the callback URL refuses every post."""
    channel: str
    """The Slack channel id cards are posted to (``C0123ABCD``)."""
    base_url: str | None = None
    """Web API base URL; ``None`` means ``https://slack.com/api/``. Tests point it at a fake."""
    app_token: SecretStr | None = None
    """App-level token (``xapp-…``, scope ``connections:write``): receive clicks over Socket Mode."""

    @field_validator("bot_token", "signing_secret")
    @classmethod
    def _not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("channel")
    @classmethod
    def _channel_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a Slack channel id")
        return value.strip()

    @field_validator("app_token")
    @classmethod
    def _app_level_token(cls, value: SecretStr | None) -> SecretStr | None:
        # A bot token pasted here fails only later, inside Socket Mode's reconnect loop.
        if value is not None and not value.get_secret_value().startswith("xapp-"):
            raise ValueError("must be an app-level token (xapp-…)")
        return value

    @model_validator(mode="after")
    def _clicks_reach_us(self) -> SlackConfig:
        if self.signing_secret is None and self.app_token is None:
            raise ValueError(
                "needs signing_secret, to verify the clicks Slack posts to the callback URL, "
                "or app_token (xapp-…), to receive them over Socket Mode"
            )
        return self


def create(name: str, config: SlackConfig) -> SlackChannel:
    """Build the channel called ``name``; raises :class:`ImportError` without the ``slack`` extra."""
    try:
        from signoff.channels.slack._channel import SlackChannel
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return SlackChannel(name, config)


def __getattr__(attr: str) -> object:
    # SlackChannel needs slack-sdk; resolve it on first use so the config model imports without it.
    if attr == "SlackChannel":
        try:
            from signoff.channels.slack._channel import SlackChannel
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        return SlackChannel
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
