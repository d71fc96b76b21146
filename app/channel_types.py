"""The registry of channel types: a literal dict from ``type:`` to config model and factory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from signoff.channels import Channel, fake, feishu, slack, web

__all__ = ["CHANNEL_TYPES", "ChannelConfig", "ChannelType", "build_channel"]


class ChannelConfig(Protocol):
    @property
    def type(self) -> str: ...


@dataclass(frozen=True)
class ChannelType:
    config: type[BaseModel]
    create: Callable[[str, Any], Channel]


CHANNEL_TYPES: dict[str, ChannelType] = {
    "web": ChannelType(web.WebConfig, web.create),
    "fake": ChannelType(fake.FakeConfig, fake.create),
    "feishu": ChannelType(feishu.FeishuConfig, feishu.create),
    "slack": ChannelType(slack.SlackConfig, slack.create),
}


def build_channel(name: str, config: ChannelConfig) -> Channel:
    return CHANNEL_TYPES[config.type].create(name, config)
