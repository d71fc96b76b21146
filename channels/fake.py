"""A channel that keeps its cards in memory, for flow tests and local demos.

``failures`` lets a test script what the next deliveries do: raise a retryable
or permanent error before succeeding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from signoff.channels._contract import Card, DeliveryError, Identity, MessageRef, Person

__all__ = ["IDENTITY", "FakeChannel", "FakeConfig", "create"]

IDENTITY = Identity()
"""No form of user id of its own: a gate's approvers here are people of the directory or
operators, never raw ids."""


class FakeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["fake"] = "fake"


@dataclass
class FakeChannel:
    name: str
    type: str = "fake"
    posts: list[Card] = field(default_factory=list)
    updates: list[tuple[MessageRef, Card]] = field(default_factory=list)
    failures: list[DeliveryError] = field(default_factory=list)
    reminders: list[tuple[MessageRef, Card, tuple[Person, ...]]] = field(default_factory=list)

    def _maybe_fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    async def post(self, card: Card) -> MessageRef:
        self._maybe_fail()
        self.posts.append(card)
        return {"message_id": f"fake-{len(self.posts)}", "request_id": card.request_id}

    async def update(self, ref: MessageRef, card: Card) -> None:
        self._maybe_fail()
        self.updates.append((ref, card))

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        self._maybe_fail()
        self.reminders.append((ref, card, waiting_on))

    async def aclose(self) -> None:
        return None

    def cards_for(self, request_id: str) -> list[Card]:
        """Every rendering of one request, posts then updates, in order."""
        return [c for c in self.posts if c.request_id == request_id] + [
            c for _, c in self.updates if c.request_id == request_id
        ]


def create(name: str, config: FakeConfig) -> FakeChannel:
    return FakeChannel(name)
