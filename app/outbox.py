"""The outbox dispatcher: delivers card posts, card updates and webhook events after commit.

Rows are claimed with a lease (a conditional UPDATE), so several dispatchers,
in one process or many, never send the same row at once; a crash simply lets the
lease run out and the row is sent again. Transient failures back off
exponentially (honouring ``Retry-After``), up to a bounded number of attempts; a
permanent failure to post cancels the request, so its agent is denied with the
reason instead of waiting for a card nobody can see. A webhook that fails is
recorded as failed and changes nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, or_, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import webhooks
from signoff.app.audit import Actor
from signoff.app.cards import build_card
from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.deliveries import WEBHOOK
from signoff.app.metrics import DELIVERIES, WEBHOOK_DELIVERIES
from signoff.app.models import ConfirmationRequest, Delivery, OutboxStatus, Status, Vote, utcnow
from signoff.app.state_machine import get_request, transition
from signoff.app.votes import votes_for
from signoff.channels import Channel, DeliveryError, PermanentDeliveryError, RetryableDeliveryError

__all__ = ["Dispatcher", "backoff"]

log = logging.getLogger("signoff.outbox")

MAX_ATTEMPTS = 60
"""Attempts at a card post or update (a webhook has its own ``max_attempts``)."""


def backoff(attempts: int, retry_after: float | None = None) -> float:
    """Seconds before the next try: exponential with jitter, capped at 5 minutes."""
    base = min(300.0, 0.5 * 2 ** min(attempts, 10))
    delay = base * (0.5 + random.random() / 2)
    return float(max(delay, retry_after or 0.0))


WAKE_DELAY = 0.01
"""Seconds the dispatcher lets pass after a commit wakes it (more deliveries join the pass)."""


class Dispatcher:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        channels: Mapping[str, Channel],
        config: Callable[[], SignoffConfig],
        *,
        wake: asyncio.Event,
        reads: async_sessionmaker[AsyncSession] | None = None,
        poll_seconds: float = 1.0,
        lease_seconds: float = 30.0,
        concurrency: int = 8,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """``http``: the client webhooks are sent with (without one, each send opens its own)."""
        self._sessions = sessions
        self._http = http
        self._reads = reads or sessions
        self._channels = channels
        self._config = config
        self._wake = wake
        self._poll = poll_seconds
        self._lease = timedelta(seconds=lease_seconds)
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency

    async def run(self) -> None:
        """Deliver until cancelled."""
        while True:
            try:
                sent = await self.run_once()
            except Exception:
                log.exception("outbox pass failed")
                sent = 0
            if sent == 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self._poll)
                except TimeoutError:
                    continue
                # Woken by a commit: the agents waiting on that decision go first (their
                # answers are due now; a card redrawn a moment later looks the same).
                await asyncio.sleep(WAKE_DELAY)

    async def run_once(self, *, now: datetime | None = None) -> int:
        """Claim and deliver what is due now; returns how many rows were handled."""
        now = now or utcnow()
        ids = await self._claim(now, self._concurrency * 4)
        if ids:
            await asyncio.gather(*(self._deliver_guarded(i, now) for i in ids))
        return len(ids)

    async def _claim(self, now: datetime, limit: int) -> list[int]:
        async with transaction(self._sessions) as session:
            due = (
                await session.exec(
                    select(Delivery.id)
                    .where(
                        col(Delivery.status) == OutboxStatus.PENDING,
                        col(Delivery.next_attempt_at) <= now,
                        or_(col(Delivery.leased_until).is_(None), col(Delivery.leased_until) < now),
                    )
                    .order_by(col(Delivery.id))
                    .limit(limit)
                )
            ).all()
            claimed: list[int] = []
            for did in due:
                assert did is not None
                res = await session.exec(
                    sa.update(Delivery)
                    .where(
                        col(Delivery.id) == did,
                        col(Delivery.status) == OutboxStatus.PENDING,
                        or_(col(Delivery.leased_until).is_(None), col(Delivery.leased_until) < now),
                    )
                    .values(leased_until=now + self._lease)
                    .returning(col(Delivery.id))
                )
                if res.first() is not None:
                    claimed.append(did)
            return claimed

    async def _deliver_guarded(self, delivery_id: int, now: datetime) -> None:
        async with self._slots:
            try:
                await self._deliver(delivery_id, now)
            except Exception:
                log.exception("delivery %s failed unexpectedly", delivery_id)

    async def _deliver(self, delivery_id: int, now: datetime) -> None:
        async with self._reads() as session:
            d = await session.get(Delivery, delivery_id)
            seen = await self._card_state(session, d) if d is not None and d.kind != WEBHOOK else None
        if d is not None and d.kind == WEBHOOK:
            await self._send_webhook(d, now)
            return
        if d is None or seen is None:
            return
        req, votes, post_ref, post_failed = seen
        channel = self._channels.get(d.channel)
        if channel is None:
            await self._finish(delivery_id, failed=f"no channel named {d.channel!r} is configured")
            return
        card = build_card(req, votes, self._config(), channel.type, channel=d.channel)

        if d.kind == "update" and post_ref is None:
            if post_failed:
                await self._finish(delivery_id, failed="the card was never posted")
            else:
                # The post has not gone out yet; it will show the latest state anyway.
                await self._retry(
                    delivery_id, d.attempts, "waiting for the card to be posted", 1.0, count=False, now=now
                )
            return
        if d.kind == "post":
            result = await self._attempt(d, channel.post(card), MAX_ATTEMPTS, now)
            if result == "sent":
                log.info("posted card for %s to %s", req.id, d.channel)
        else:
            assert post_ref is not None
            result = await self._attempt(d, channel.update(post_ref, card), MAX_ATTEMPTS, now)
        DELIVERIES.labels(d.channel, d.kind, result).inc()

    async def _card_state(
        self, session: AsyncSession, d: Delivery
    ) -> tuple[ConfirmationRequest, list[Vote], dict[str, str] | None, bool] | None:
        """What drawing ``d``'s card needs: the request, its votes and, for an update, the
        posted card's reference (and whether its post failed). None if the request is gone."""
        req = await get_request(session, d.request_id)
        if req is None:
            return None
        votes = await votes_for(session, req.id)
        post_ref: dict[str, str] | None = None
        post_failed = False
        if d.kind == "update":
            post = (
                await session.exec(
                    select(Delivery).where(
                        col(Delivery.request_id) == d.request_id,
                        col(Delivery.channel) == d.channel,
                        col(Delivery.kind) == "post",
                    )
                )
            ).first()
            post_ref = post.message_ref if post is not None else None
            post_failed = post is None or post.status == OutboxStatus.FAILED
        return req, votes, post_ref, post_failed

    async def _send_webhook(self, d: Delivery, now: datetime) -> None:
        assert d.id is not None
        hook = self._config().webhooks.get(d.channel)
        if hook is None or d.event_id is None or d.payload is None:
            await self._finish(d.id, failed=f"no webhook named {d.channel!r} is configured", now=now)
            WEBHOOK_DELIVERIES.labels(d.channel, "failed").inc()
            return
        async with contextlib.AsyncExitStack() as stack:
            client = self._http
            if client is None:
                client = await stack.enter_async_context(httpx.AsyncClient())
            # Signed with the time it is sent: receivers refuse timestamps far from their clock.
            sending = webhooks.send(client, hook, event_id=d.event_id, payload=d.payload, now=utcnow())
            result = await self._attempt(d, sending, hook.max_attempts, now)
        WEBHOOK_DELIVERIES.labels(d.channel, result).inc()

    async def _attempt(
        self, d: Delivery, sending: Awaitable[dict[str, str] | None], max_attempts: int, now: datetime
    ) -> str:
        """Await one attempt at ``d`` and record how it went: ``sent``, ``retry`` or ``failed``."""
        assert d.id is not None
        try:
            ref = await sending
        except RetryableDeliveryError as exc:
            if d.attempts + 1 >= max_attempts:
                await self._give_up(d, exc, now)
                return "failed"
            delay = backoff(d.attempts, exc.retry_after)
            await self._retry(d.id, d.attempts, exc.reason, delay, now=now)
            return "retry"
        except PermanentDeliveryError as exc:
            await self._give_up(d, exc, now)
            return "failed"
        except Exception as exc:  # an unexpected channel bug is treated as transient
            log.exception("%s %s raised", d.kind, d.channel)
            await self._retry(d.id, d.attempts, f"{type(exc).__name__}: {exc}", backoff(d.attempts), now=now)
            return "retry"
        await self._finish(d.id, ref=ref, now=now)
        return "sent"

    async def _finish(
        self,
        delivery_id: int,
        *,
        ref: dict[str, str] | None = None,
        failed: str | None = None,
        now: datetime | None = None,
    ) -> None:
        async with transaction(self._sessions) as session:
            values: dict[str, object] = {"leased_until": None, "attempts": Delivery.attempts + 1}
            if failed is None:
                values |= {"status": OutboxStatus.SENT.value, "sent_at": now or utcnow(), "last_error": None}
                if ref is not None:
                    values["message_ref"] = ref
            else:
                values |= {"status": OutboxStatus.FAILED.value, "last_error": failed}
            await session.exec(sa.update(Delivery).where(col(Delivery.id) == delivery_id).values(**values))

    async def _retry(
        self,
        delivery_id: int,
        attempts: int,
        error: str,
        delay: float,
        *,
        count: bool = True,
        now: datetime | None = None,
    ) -> None:
        async with transaction(self._sessions) as session:
            await session.exec(
                sa.update(Delivery)
                .where(col(Delivery.id) == delivery_id)
                .values(
                    leased_until=None,
                    attempts=attempts + (1 if count else 0),
                    last_error=error,
                    next_attempt_at=(now or utcnow()) + timedelta(seconds=delay),
                )
            )

    async def _give_up(self, d: Delivery, exc: DeliveryError, now: datetime) -> None:
        assert d.id is not None
        what = f"the event {d.event_id} to the webhook" if d.kind == WEBHOOK else "the card to"
        reason = f"could not deliver {what} {d.channel}: {exc.reason}"
        log.warning("%s (request %s)", reason, d.request_id)
        await self._finish(d.id, failed=exc.reason, now=now)
        if d.kind == "post":
            async with transaction(self._sessions) as session:
                await transition(
                    session, d.request_id, Status.CANCELLED, actor=Actor("system", "outbox"), reason=reason
                )
