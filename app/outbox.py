"""The outbox dispatcher: delivers card posts and updates, reminders, escalations and
webhook events after commit.

Reminders and escalations are rows written with the request, due at their time: the
lease makes each go out once across replicas and restarts, and one that comes due after
the request was decided is skipped. Each sent is audited in the transaction that marks
it sent.

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
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit, webhooks
from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig
from signoff.app.db import chosen_once, log_failure, transaction
from signoff.app.deliveries import CARD_ROW, WEBHOOK
from signoff.app.metrics import DELIVERIES, WEBHOOK_DELIVERIES
from signoff.app.models import (
    ConfirmationRequest,
    Delivery,
    DeliveryKind,
    OutboxStatus,
    Status,
    Vote,
    utcnow,
)
from signoff.app.requests.cards import build_card, escalated_to, waiting_on
from signoff.app.requests.eligibility import gates_of
from signoff.app.requests.states import get_request, transition
from signoff.app.requests.tally import votes_for
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
        public_url: str | None = None,
    ) -> None:
        """``http``: the client webhooks are sent with (without one, each send opens its own);
        ``public_url``: ``SIGNOFF_PUBLIC_URL``, for the cards' links to the console."""
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
        self._public_url = public_url
        self._stopping = False

    def stop(self) -> None:
        """Claim nothing more: :meth:`run` returns once the deliveries it holds are sent and
        recorded (a graceful stop; see :mod:`signoff.app.drain`)."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Deliver until cancelled or :meth:`stop`."""
        while not self._stopping:
            try:
                sent = await self.run_once()
            except Exception:
                log_failure(log, "outbox pass failed")
                sent = 0
            if sent == 0 and not self._stopping:
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
            params = {"now": now, "until": now + self._lease}
            return sorted(int(i) for i in (await session.exec(_claiming(limit), params=params)).scalars())

    async def _deliver_guarded(self, delivery_id: int, now: datetime) -> None:
        async with self._slots:
            try:
                await self._deliver(delivery_id, now)
            except Exception:
                log_failure(log, "delivery %s failed unexpectedly", delivery_id)

    async def _deliver(self, delivery_id: int, now: datetime) -> None:
        async with self._reads() as session:
            d = await session.get(Delivery, delivery_id)
            seen = await self._card_state(session, d) if d is not None and d.kind != WEBHOOK else None
        if d is not None and d.kind == WEBHOOK:
            await self._send_webhook(d, now)
            return
        if d is None or seen is None:
            return
        req, votes, card_row = seen
        channel = self._channels.get(d.channel)
        if channel is None:
            await self._finish(delivery_id, failed=f"no channel named {d.channel!r} is configured")
            return
        config = self._config()
        card = build_card(
            req, votes, config, channel.type, channel=d.channel, now=now, public_url=self._public_url
        )
        kind = d.kind
        if kind in (DeliveryKind.REMIND, DeliveryKind.ESCALATE) and req.status != Status.PENDING:
            skipped = f"the request was {req.status} before the {kind} was due"
            await self._finish(delivery_id, skipped=skipped, now=now)
            return
        # An escalation brings the card to its channel, unless the channel has the card already
        # (an earlier row posted it): then it replies under it, naming the new approvers.
        notice = kind == DeliveryKind.ESCALATE and card_row is not None and card_row.id != d.id
        ref: dict[str, str] | None = None
        if kind in (DeliveryKind.UPDATE, DeliveryKind.REMIND) or notice:
            ref, why_not = _card_ref(card_row)
            if ref is None:
                if why_not is None:
                    # The post has not gone out yet; it will show the latest state anyway.
                    await self._retry(
                        delivery_id,
                        d.attempts,
                        "waiting for the card to be posted",
                        1.0,
                        count=False,
                        now=now,
                    )
                elif card_row is not None and card_row.status == OutboxStatus.SKIPPED:
                    await self._finish(delivery_id, skipped=why_not, now=now)
                else:
                    await self._finish(delivery_id, failed=why_not, now=now)
                return
        sending: Awaitable[dict[str, str] | None]
        along: list[audit.Entry] = []
        posting = kind == DeliveryKind.POST or (kind == DeliveryKind.ESCALATE and not notice)
        if posting:
            sending, along = channel.post(card), self._escalated(d, req, posted=True)
        elif kind == DeliveryKind.UPDATE and ref is not None:
            sending = channel.update(ref, card)
        elif kind == DeliveryKind.ESCALATE and ref is not None and d.gate is not None and d.step is not None:
            added = escalated_to(req, config, channel.type, gate=d.gate, step=d.step)
            sending, along = (
                channel.remind(ref, card, added, key=_key(d)),
                self._escalated(d, req, posted=False),
            )
        elif kind == DeliveryKind.REMIND and ref is not None and d.gate is not None:
            waiting = waiting_on(req, votes, config, channel.type, gate=d.gate, now=now)
            sending = channel.remind(ref, card, waiting, key=_key(d))
            detail = {
                "channel": d.channel,
                "gate": _gate_name(req, d.gate),
                "point": d.step,
                "waiting_on": [p.name for p in waiting],
            }
            along = [audit.Entry(audit.Action.REMINDED, _OUTBOX, req.id, detail)]
        else:
            await self._finish(delivery_id, failed=f"not a delivery Signoff can make: {d.kind!r}", now=now)
            return
        result = await self._attempt(d, sending, MAX_ATTEMPTS, now, along=along)
        if result == "sent" and posting:
            log.info("posted card for %s to %s (%s)", req.id, d.channel, kind)
        DELIVERIES.labels(d.channel, d.kind, result).inc()

    async def _card_state(
        self, session: AsyncSession, d: Delivery
    ) -> tuple[ConfirmationRequest, list[Vote], Delivery | None] | None:
        """What drawing ``d``'s card needs: the request, its votes and, for anything but the
        post itself, the channel's card row (its first post or escalation). None if the
        request is gone."""
        req = await get_request(session, d.request_id)
        if req is None:
            return None
        votes = await votes_for(session, req.id)
        card_row = None
        if d.kind != DeliveryKind.POST:
            params = {"request_id": d.request_id, "channel": d.channel}
            card_row = (await session.exec(CARD_ROW, params=params)).first()
        return req, votes, card_row

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
        self,
        d: Delivery,
        sending: Awaitable[dict[str, str] | None],
        max_attempts: int,
        now: datetime,
        *,
        along: Sequence[audit.Entry] = (),
    ) -> str:
        """Await one attempt at ``d`` and record how it went: ``sent`` (with the audit events
        ``along``), ``retry`` or ``failed``."""
        assert d.id is not None
        started = time.monotonic()
        try:
            ref = await sending
        except RetryableDeliveryError as exc:
            if d.attempts + 1 >= max_attempts:
                await self._give_up(d, exc, now)
                return "failed"
            # A provider's Retry-After counts from its answer, not from when the attempt began.
            answered = now + timedelta(seconds=time.monotonic() - started)
            delay = backoff(d.attempts, exc.retry_after)
            await self._retry(d.id, d.attempts, exc.reason, delay, now=answered)
            return "retry"
        except PermanentDeliveryError as exc:
            await self._give_up(d, exc, now)
            return "failed"
        except Exception as exc:  # an unexpected channel bug is treated as transient
            log.exception("%s %s raised", d.kind, d.channel)
            answered = now + timedelta(seconds=time.monotonic() - started)
            error = f"{type(exc).__name__}: {exc}"
            await self._retry(d.id, d.attempts, error, backoff(d.attempts), now=answered)
            return "retry"
        await self._finish(d.id, ref=ref, now=now, along=along)
        return "sent"

    @staticmethod
    def _escalated(d: Delivery, req: ConfirmationRequest, *, posted: bool) -> list[audit.Entry]:
        """The audit event of escalation ``d`` (none for a card post)."""
        if d.kind != DeliveryKind.ESCALATE or d.gate is None or d.step is None:
            return []
        step = gates_of(req)[d.gate].escalations[d.step]
        detail = {
            "channel": d.channel,
            "gate": _gate_name(req, d.gate),
            "step": d.step,
            "approvers": list(step.approvers),
            "card": "posted" if posted else "replied under the card already there",
        }
        return [audit.Entry(audit.Action.ESCALATED, _OUTBOX, req.id, detail)]

    async def _finish(
        self,
        delivery_id: int,
        *,
        ref: dict[str, str] | None = None,
        failed: str | None = None,
        skipped: str | None = None,
        along: Sequence[audit.Entry] = (),
        now: datetime | None = None,
    ) -> None:
        """Mark the row done: sent (with the card's ``ref``, and the audit events ``along`` in
        the same transaction), ``failed`` or ``skipped`` for the reason given."""
        async with transaction(self._sessions) as session:
            values: dict[str, object] = {"leased_until": None}
            if failed is not None:
                values |= {"status": OutboxStatus.FAILED.value, "last_error": failed}
            elif skipped is not None:
                values |= {"status": OutboxStatus.SKIPPED.value, "last_error": skipped}
            else:
                values |= {"status": OutboxStatus.SENT.value, "sent_at": now or utcnow(), "last_error": None}
                if ref is not None:
                    values["message_ref"] = ref
            await session.exec(_update(*values), params={"did": delivery_id, **_new(values)})
            if along:
                await audit.append_many(session, along)

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
        values = {
            "leased_until": None,
            "attempts": attempts + (1 if count else 0),
            "last_error": error,
            "next_attempt_at": (now or utcnow()) + timedelta(seconds=delay),
        }
        async with transaction(self._sessions) as session:
            await session.exec(_update(*values, counted=False), params={"did": delivery_id, **_new(values)})

    async def _give_up(self, d: Delivery, exc: DeliveryError, now: datetime) -> None:
        assert d.id is not None
        if d.kind == WEBHOOK:
            what = f"the event {d.event_id} to the webhook"
        elif d.kind in (DeliveryKind.POST, DeliveryKind.UPDATE):
            what = "the card to"
        else:
            what = f"the {d.kind} to"
        reason = f"could not deliver {what} {d.channel}: {exc.reason}"
        log.warning("%s (request %s)", reason, d.request_id)
        await self._finish(d.id, failed=exc.reason, now=now)
        # Only a card nobody can see cancels: a reminder, an escalation or a webhook that cannot
        # go out leaves the request to the cards it has.
        if d.kind == DeliveryKind.POST:
            async with transaction(self._sessions) as session:
                await transition(
                    session, d.request_id, Status.CANCELLED, actor=Actor("system", "outbox"), reason=reason
                )


_OUTBOX = Actor("system", "outbox")
_DELIVERIES: sa.Table = Delivery.__table__  # type: ignore[attr-defined]


@functools.cache
def _claiming(limit: int) -> sa.Update:
    """Lease up to ``limit`` rows due at ``now`` until ``until`` (params), in one statement; built
    once. Dispatchers claiming at once on PostgreSQL skip each other's rows; the conditions are
    checked again on the rows locked (chosen once: :func:`signoff.app.db.chosen_once`)."""
    d = _DELIVERIES.c
    now = sa.bindparam("now", type_=d.next_attempt_at.type)
    claimable = (
        d.status == OutboxStatus.PENDING.value,
        sa.or_(d.leased_until.is_(None), d.leased_until < now),
    )
    due = (
        sa.select(d.id)
        .where(*claimable, d.next_attempt_at <= now)
        .order_by(d.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        sa.update(_DELIVERIES)
        .where(d.id.in_(sa.select(chosen_once(due).c.id)), *claimable)
        .values(leased_until=sa.bindparam("until", type_=d.leased_until.type))
        .returning(d.id)
    )


@functools.cache
def _update(*columns: str, counted: bool = True) -> sa.Update:
    """Set ``columns`` of delivery ``did`` to the params ``new_<column>`` (and count the attempt
    when ``counted``); built once per set of columns."""
    values: dict[str, Any] = {c: sa.bindparam(f"new_{c}", type_=_DELIVERIES.c[c].type) for c in columns}
    if counted:
        values["attempts"] = _DELIVERIES.c.attempts + 1
    return sa.update(_DELIVERIES).where(_DELIVERIES.c.id == sa.bindparam("did")).values(**values)


def _new(values: Mapping[str, object]) -> dict[str, object]:
    return {f"new_{c}": v for c, v in values.items()}


def _card_ref(card_row: Delivery | None) -> tuple[dict[str, str] | None, str | None]:
    """The posted card's reference, or why there is none: None while it is still to be posted."""
    if card_row is None or card_row.status == OutboxStatus.FAILED:
        return None, "the card was never posted"
    if card_row.status == OutboxStatus.SKIPPED:
        return None, "the card was never posted: the request was decided first"
    if card_row.message_ref is None:
        if card_row.status == OutboxStatus.SENT:
            return None, "the card was posted without a reference"
        return None, None
    return {str(k): str(v) for k, v in card_row.message_ref.items()}, None


def _key(d: Delivery) -> str:
    """The reminder's idempotency key: one per outbox row, the same on every attempt."""
    return f"{d.request_id}-{d.kind}-{d.id}"


def _gate_name(req: ConfirmationRequest, gate: int) -> str:
    gates = gates_of(req)
    return gates[gate].name if gate < len(gates) else str(gate)
