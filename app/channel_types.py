"""The registry of channel types: a literal dict from ``type:`` to config model, factory and
the rules by which the channel type names people."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from signoff.channels import Channel, Identity, fake, feishu, slack, web

__all__ = ["CHANNEL_TYPES", "ChannelConfig", "ChannelType", "build_channel", "identity_of"]


class ChannelConfig(Protocol):
    @property
    def type(self) -> str: ...


@dataclass(frozen=True)
class ChannelType:
    config: type[BaseModel]
    create: Callable[[str, Any], Channel]
    identity: Identity = field(default_factory=Identity)


CHANNEL_TYPES: dict[str, ChannelType] = {
    "web": ChannelType(web.WebConfig, web.create),
    "fake": ChannelType(fake.FakeConfig, fake.create),
    "feishu": ChannelType(feishu.FeishuConfig, feishu.create, feishu.IDENTITY),
    "slack": ChannelType(slack.SlackConfig, slack.create, slack.IDENTITY),
}

_ANYONE = Identity()


def build_channel(name: str, config: ChannelConfig) -> Channel:
    return CHANNEL_TYPES[config.type].create(name, config)


def identity_of(channel_type: str) -> Identity:
    """How ``channel_type`` names people (a type not registered here has no rules of its own)."""
    known = CHANNEL_TYPES.get(channel_type)
    return known.identity if known is not None else _ANYONE
