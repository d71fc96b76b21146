"""Clicks applied beside a callback that the platform wants answered within its own deadline
(Feishu waits 3 s, Teams about 5 s).

A click is applied in a task of its own: a redelivery of the same event (by the platform's
event id) shares the first delivery's task instead of voting again; the callback answers with
the outcome if it comes within the channel's budget, and else says the decision is being
recorded, while the task goes on. Once a click is accepted, the clicker's name and e-mail are
looked up after the answer (:meth:`ClickTasks.enrichment`). Used by the Feishu and Teams channels; Slack
answers its clicks at once and learns the outcome from the card's update.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from signoff.channels._contract import ClickHandler, ClickOutcome, DeliveryError

__all__ = ["NOT_RECORDED", "RECORDING", "ClickTasks"]

RECORDING = "Your click is still being checked; if it counts, the card will update shortly."
"""What a callback answers when its click takes longer than the channel's budget: whether it
will count (the clicker may not be an approver) is not known yet."""
NOT_RECORDED = (
    "Something went wrong applying your click, and it may not have counted; "
    "try again (a click that did count is not counted twice)."
)
"""What a callback answers when applying its click failed: the failure may have come after
the vote was committed (drawing the card, a connection lost at the commit)."""
_SEEN = 4096
"""How many event ids are remembered to share a redelivery's task."""
_SHUTDOWN_GRACE = 5.0


class ClickTasks:
    """The clicks one channel is applying, and its other background work."""

    def __init__(self, kind: str, channel: str, log: logging.Logger) -> None:
        """For the channel named ``channel`` of type ``kind`` ("Feishu"), logging to ``log``."""
        self._channel = channel
        self._label = f"{kind} channel {channel}"
        self._log = log
        self._clicks: OrderedDict[str, asyncio.Task[ClickOutcome]] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(
        self, event_id: str | None, click: Callable[[], Coroutine[Any, Any, ClickOutcome]]
    ) -> tuple[asyncio.Task[ClickOutcome], bool]:
        """The task applying the click of ``event_id`` (a redelivery shares it), and whether it
        is new. A task that failed is forgotten, so a redelivery tries again."""
        if event_id is not None and (seen := self._clicks.get(event_id)) is not None:
            self._clicks.move_to_end(event_id)
            return seen, False
        task = asyncio.create_task(click())
        self._tasks.add(task)
        if event_id is not None:
            self._clicks[event_id] = task
            while len(self._clicks) > _SEEN:
                self._clicks.popitem(last=False)

        def done(finished: asyncio.Task[ClickOutcome]) -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and finished.exception() is None:
                return
            if not finished.cancelled():
                self._log.error("%s: applying a click failed", self._label, exc_info=finished.exception())
            if event_id is not None and self._clicks.get(event_id) is finished:
                del self._clicks[event_id]

        task.add_done_callback(done)
        return task, True

    async def outcome(self, task: asyncio.Task[ClickOutcome], budget: float) -> ClickOutcome | str:
        """The click's outcome if it comes within ``budget`` seconds, else the line to answer
        with (:data:`RECORDING`, or :data:`NOT_RECORDED` when applying it failed)."""
        try:
            return await asyncio.wait_for(asyncio.shield(task), budget)
        except TimeoutError:
            return RECORDING
        except Exception:
            return NOT_RECORDED

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` in the background, logging its failure."""

        async def run() -> None:
            try:
                await work
            except Exception:
                self._log.exception("%s: background work failed", self._label)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Let the clicks and work in flight finish, for a few seconds at most."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=_SHUTDOWN_GRACE)

    def enrichment(
        self,
        handler: ClickHandler,
        user_id: str,
        lookup: Callable[[str], Awaitable[tuple[str | None, str | None]]],
    ) -> Callable[[], Awaitable[None]]:
        """The work that records ``user_id``'s name and e-mail, looked up with ``lookup``,
        after an accepted click (a failed lookup is logged and changes nothing)."""

        async def enrich() -> None:
            try:
                name, email = await lookup(user_id)
            except DeliveryError as exc:
                self._log.warning("%s: looking up %s failed: %s", self._label, user_id, exc.reason)
                return
            if name is not None or email is not None:
                await handler.enrich_identity(self._channel, user_id, name=name, email=email)

        return enrich
