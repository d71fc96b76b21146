"""The audit log: append-only events, each holding the hash of the one before it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app.models import AuditEvent, AuditHead, utcnow

__all__ = ["Actor", "BrokenLink", "append", "event_hash", "verify_chain"]

GENESIS = "0" * 64
_EVENTS: sa.Table = AuditEvent.__table__  # type: ignore[attr-defined]
_HEAD: sa.Table = AuditHead.__table__  # type: ignore[attr-defined]
_EVENT_COLUMNS = [c.name for c in _EVENTS.columns]
_TAKE_SEQ = (
    sa.update(_HEAD)
    .where(_HEAD.c.id == 1)
    .values(seq=_HEAD.c.seq + 1)
    .returning(_HEAD.c.seq, _HEAD.c.last_hash)
)
_INSERT = sa.insert(_EVENTS)
_SET_HASH = sa.update(_HEAD).where(_HEAD.c.id == 1).values(last_hash=sa.bindparam("new_hash"))


@dataclass(frozen=True, slots=True)
class Actor:
    """Who did something: a channel (``slack``, ``web``, ``agent``, ``system``), an id, a name."""

    channel: str
    id: str | None = None
    name: str | None = None


SYSTEM = Actor("system", "signoff")


def event_hash(
    *,
    seq: int,
    prev_hash: str,
    request_id: str | None,
    action: str,
    actor: Actor,
    detail: dict[str, Any],
    created_at: datetime,
) -> str:
    body = json.dumps(
        [
            seq,
            prev_hash,
            request_id,
            action,
            actor.channel,
            actor.id,
            actor.name,
            detail,
            created_at.isoformat(),
        ],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


async def append(
    session: AsyncSession,
    action: str,
    *,
    actor: Actor = SYSTEM,
    request_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event in the caller's transaction.

    Taking the next sequence number is an UPDATE of the single head row, so
    concurrent appenders (threads or replicas) queue on its row lock and the
    chain never forks.
    """
    row = (await session.exec(_TAKE_SEQ)).one()
    seq, prev = int(row[0]), str(row[1])
    # JSON round trip so the hash covers exactly what the database will return.
    detail = json.loads(json.dumps(detail or {}, default=str))
    created_at = utcnow()
    digest = event_hash(
        seq=seq,
        prev_hash=prev,
        request_id=request_id,
        action=action,
        actor=actor,
        detail=detail,
        created_at=created_at,
    )
    event = AuditEvent(
        seq=seq,
        request_id=request_id,
        action=action,
        actor_channel=actor.channel,
        actor_id=actor.id,
        actor_name=actor.name,
        detail=detail,
        created_at=created_at,
        prev_hash=prev,
        hash=digest,
    )
    # Prepared Core statements, not the unit of work: no flush bookkeeping, no statement
    # to build and compile per call.
    await session.exec(_INSERT, params={c: getattr(event, c) for c in _EVENT_COLUMNS})
    await session.exec(_SET_HASH, params={"new_hash": digest})
    return event


@dataclass(frozen=True, slots=True)
class BrokenLink:
    seq: int
    problem: str


async def _events(session: AsyncSession, batch: int = 1000) -> AsyncIterator[AuditEvent]:
    last = 0
    while True:
        rows = (
            await session.exec(
                select(AuditEvent)
                .where(col(AuditEvent.seq) > last)
                .order_by(col(AuditEvent.seq))
                .limit(batch)
            )
        ).all()
        if not rows:
            return
        for row in rows:
            yield row
        last = rows[-1].seq


async def verify_chain(session: AsyncSession) -> tuple[int, BrokenLink | None]:
    """Walk the chain from the start; return the events checked and the first broken link."""
    prev, expected_seq, count = GENESIS, 1, 0
    async for ev in _events(session):
        if ev.seq != expected_seq:
            return count, BrokenLink(ev.seq, f"event {expected_seq} is missing (next is {ev.seq})")
        if ev.prev_hash != prev:
            return count, BrokenLink(ev.seq, "prev_hash does not match the previous event's hash")
        actual = event_hash(
            seq=ev.seq,
            prev_hash=ev.prev_hash,
            request_id=ev.request_id,
            action=ev.action,
            actor=Actor(ev.actor_channel or "", ev.actor_id, ev.actor_name),
            detail=ev.detail,
            created_at=ev.created_at,
        )
        if actual != ev.hash:
            return count, BrokenLink(ev.seq, "the event's contents do not match its hash (edited)")
        prev, expected_seq, count = ev.hash, ev.seq + 1, count + 1
    head = (await session.exec(select(AuditHead).where(col(AuditHead.id) == 1))).one_or_none()
    if head is not None and head.seq != count:
        return count, BrokenLink(count + 1, f"the head says {head.seq} events but {count} exist (deleted)")
    return count, None
