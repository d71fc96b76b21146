"""The registry of channel types: a literal dict from ``type:`` to config model, factory and
the rules by which the channel type names people."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from signoff.channels import Channel, Identity, email, fake, feishu, ntfy, slack, teams, web
from signoff.channels.email import LinkSigner

__all__ = [
    "CHANNEL_TYPES",
    "ChannelConfig",
    "ChannelType",
    "build_channel",
    "identity_of",
    "is_chat",
    "needs_links",
]


class ChannelConfig(Protocol):
    @property
    def type(self) -> str: ...


@dataclass(frozen=True)
class ChannelType:
    config: type[BaseModel]
    create: Callable[[str, Any], Channel] | None = None
    identity: Identity = field(default_factory=Identity)
    create_linked: Callable[[str, Any, LinkSigner], Channel] | None = None
    """For a channel type whose messages carry signed links back to this server (email, ntfy):
    built with the server's :class:`LinkSigner` instead of by ``create``."""
    chat: bool = False
    """Its cards are chat messages, redrawn as votes arrive: a decision's reason shows on them."""


CHANNEL_TYPES: dict[str, ChannelType] = {
    "web": ChannelType(web.WebConfig, web.create, web.IDENTITY),
    "fake": ChannelType(fake.FakeConfig, fake.create, fake.IDENTITY, chat=True),
    "feishu": ChannelType(feishu.FeishuConfig, feishu.create, feishu.IDENTITY, chat=True),
    "slack": ChannelType(slack.SlackConfig, slack.create, slack.IDENTITY, chat=True),
    "teams": ChannelType(teams.TeamsConfig, teams.create, teams.IDENTITY, chat=True),
    "email": ChannelType(email.EmailConfig, identity=email.IDENTITY, create_linked=email.create),
    "ntfy": ChannelType(ntfy.NtfyConfig, identity=ntfy.IDENTITY, create_linked=ntfy.create),
}

_ANYONE = Identity()


def needs_links(config: ChannelConfig) -> bool:
    """Whether a channel of this configuration can only be built with a link signer."""
    return CHANNEL_TYPES[config.type].create_linked is not None


def build_channel(name: str, config: ChannelConfig, *, links: LinkSigner | None = None) -> Channel:
    """The channel ``name``; ``ValueError`` when it needs ``links`` and has none."""
    kind = CHANNEL_TYPES[config.type]
    if kind.create_linked is not None:
        if links is None:
            raise ValueError(f"channel {name!r} of type {config.type} needs signed links")
        return kind.create_linked(name, config, links)
    if kind.create is None:
        raise ValueError(f"channel type {config.type} has no factory")
    return kind.create(name, config)


def is_chat(channel_type: str) -> bool:
    """Whether ``channel_type``'s cards are chat messages (Slack, Feishu), not a page or a mail."""
    known = CHANNEL_TYPES.get(channel_type)
    return known is not None and known.chat


def identity_of(channel_type: str) -> Identity:
    """How ``channel_type`` names people (a type not registered here has no rules of its own)."""
    known = CHANNEL_TYPES.get(channel_type)
    return known.identity if known is not None else _ANYONE
