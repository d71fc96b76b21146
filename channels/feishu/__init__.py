"""Feishu / Lark channel: approval cards in a group chat, clicks over webhook or long connection.

Importing this package does not import lark-oapi; :func:`create` does, and names
the extra to install when it is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from signoff.channels.feishu._card import MAX_ARGUMENTS_BYTES, MAX_CARD_BYTES, callback_body, render_card
from signoff.channels.feishu._channel import REPLY_BUDGET, FeishuChannel
from signoff.channels.feishu._config import FeishuConfig
from signoff.channels.feishu._errors import api_error
from signoff.channels.feishu._parse import IDENTITY, parse_click
from signoff.channels.feishu._security import (
    MAX_BODY_BYTES,
    MAX_CLOCK_SKEW,
    CallbackKind,
    VerifiedCallback,
    decrypt,
    verify_callback,
)

__all__ = [
    "IDENTITY",
    "MAX_ARGUMENTS_BYTES",
    "MAX_BODY_BYTES",
    "MAX_CARD_BYTES",
    "MAX_CLOCK_SKEW",
    "REPLY_BUDGET",
    "CallbackKind",
    "FeishuChannel",
    "FeishuConfig",
    "VerifiedCallback",
    "api_error",
    "callback_body",
    "create",
    "decrypt",
    "parse_click",
    "render_card",
    "verify_callback",
]

_API_TIMEOUT = 10.0
"""Seconds per Open API request (the SDK's default is 30)."""


def create(name: str, config: FeishuConfig, *, clock: Callable[[], float] = time.time) -> FeishuChannel:
    """Build the channel named ``name`` from its configuration.

    Raises :class:`ImportError` naming the ``feishu`` extra when lark-oapi is not installed.
    """
    try:
        import lark_oapi as lark
    except ImportError as exc:
        raise ImportError("The Feishu channel needs lark-oapi: pip install 'signoff[feishu]'") from exc

    client = (
        lark.Client.builder()
        .app_id(config.app_id)
        .app_secret(config.app_secret.get_secret_value())
        .domain(config.api_origin)
        .timeout(_API_TIMEOUT)
        .build()
    )
    return FeishuChannel(name, config, client, clock=clock)
