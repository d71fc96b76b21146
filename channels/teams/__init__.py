"""The Microsoft Teams channel: Adaptive Cards with ``Action.Execute``, invokes verified as Bot
Framework JWTs, cards kept current through the Bot Connector.

Its dependencies (PyJWT with cryptography, the ``teams`` extra) are imported when
:func:`create` builds a channel; the configuration model and the card renderer are plain
Python. docs/teams.md says why this is PyJWT and two REST calls rather than the Teams SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from signoff.channels.teams._card import (
    CARD_CONTENT_TYPE,
    GRANT_INPUT,
    MAX_CARD_BYTES,
    REASON_INPUT,
    edit_input_id,
    invoke_response,
    message_activity,
    render_card,
    render_reminder,
)
from signoff.channels.teams._config import BOT_FRAMEWORK_METADATA, BOT_FRAMEWORK_SCOPE, TeamsConfig
from signoff.channels.teams._parse import IDENTITY, EditRefused, base_conversation, parse_invoke

if TYPE_CHECKING:
    from signoff.channels.teams._channel import TeamsChannel

__all__ = [
    "BOT_FRAMEWORK_METADATA",
    "BOT_FRAMEWORK_SCOPE",
    "CARD_CONTENT_TYPE",
    "GRANT_INPUT",
    "IDENTITY",
    "MAX_CARD_BYTES",
    "REASON_INPUT",
    "EditRefused",
    "TeamsChannel",
    "TeamsConfig",
    "base_conversation",
    "create",
    "edit_input_id",
    "invoke_response",
    "message_activity",
    "parse_invoke",
    "render_card",
    "render_reminder",
]

_INSTALL_HINT = "the teams channel needs PyJWT with cryptography: pip install 'signoff[teams]'"


def create(name: str, config: TeamsConfig) -> TeamsChannel:
    """Build the channel called ``name``; raises :class:`ImportError` without the ``teams`` extra."""
    try:
        from signoff.channels.teams._channel import TeamsChannel
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return TeamsChannel(name, config)


def __getattr__(attr: str) -> object:
    if attr == "TeamsChannel":
        try:
            from signoff.channels.teams._channel import TeamsChannel
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        return TeamsChannel
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
