"""The built-in ``web`` channel: requests are shown and decided in Signoff itself.

Operators see pending requests through the operator API (and the console) and
decide them there; nothing is sent anywhere, so posting, updating and reminding are free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from signoff.channels._contract import Card, Identity, MessageRef, Person

__all__ = ["IDENTITY", "WebChannel", "WebConfig", "create"]

IDENTITY = Identity()
"""No user ids of its own: operators decide under their directory key (or their operator
name), so a gate's approvers here are people of the directory or operators, never raw ids."""


class WebConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["web"] = "web"


class WebChannel:
    type = "web"

    def __init__(self, name: str) -> None:
        self.name = name

    async def post(self, card: Card) -> MessageRef:
        return {"request_id": card.request_id}

    async def update(self, ref: MessageRef, card: Card) -> None:
        return None

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def create(name: str, config: WebConfig) -> WebChannel:
    return WebChannel(name)
