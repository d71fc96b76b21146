"""The audit log: append-only events, each holding the hash of the one before it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.models import AuditEvent, AuditHead, utcnow

__all__ = ["Action", "Actor", "BrokenLink", "Entry", "append", "append_many", "event_hash", "verify_chain"]

GENESIS = "0" * 64
_EVENTS: sa.Table = AuditEvent.__table__  # type: ignore[attr-defined]
_HEAD: sa.Table = AuditHead.__table__  # type: ignore[attr-defined]
_TAKE_SEQS = (
    sa.update(_HEAD)
    .where(_HEAD.c.id == 1)
    .values(seq=_HEAD.c.seq + sa.bindparam("n", type_=sa.Integer))
    .returning(_HEAD.c.seq, _HEAD.c.last_hash)
)
_INSERT = sa.insert(_EVENTS)
_SET_HASH = sa.update(_HEAD).where(_HEAD.c.id == 1).values(last_hash=sa.bindparam("new_hash"))


class Action(StrEnum):
    """Every kind of event the audit log holds: nothing is written under another name."""

    CREATED = "created"
    VOTE = "vote"
    VOTE_REFUSED = "vote_refused"
    # A request's transition, named after the status it moved to.
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    CALLBACK_REJECTED = "callback_rejected"
    """A channel callback or email-link form refused, or a tally of them
    (:mod:`signoff.app.refusals`)."""
    KEY_CREATED = "key_created"
    KEY_REVOKED = "key_revoked"
    SWITCH_CHANGED = "switch_changed"
    CONFIG_RELOADED = "config_reloaded"
    TOOL_CALL = "tool_call"
    """A call recorded by an ``audit_log`` hook."""
    EXECUTED = "executed"
    """An approved call reported executed (post-tool-use under its key), with its arguments."""
    EXECUTED_MISMATCH = "executed_mismatch"
    """An approved call reported executed with arguments other than the approved ones."""
    GRANT_CREATED = "grant_created"
    GRANT_USED = "grant_used"
    GRANT_REVOKED = "grant_revoked"
    REMINDED = "reminded"
    """A reminder sent under a card to the approvers who had not voted."""
    ESCALATED = "escalated"
    """A request escalated: its card went to another channel, and more approvers may decide."""
    CONDITION_ERROR = "condition_error"
    """A call denied because a gate's ``when`` could not be evaluated for it, with the error."""
    TOKEN_CREATED = "token_created"
    """A personal command-line token made in the console (its digest and expiry, never itself)."""
    TOKEN_REVOKED = "token_revoked"


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


@dataclass(frozen=True, slots=True)
class Entry:
    """One event to append: what happened, who did it, to which request, and the details."""

    action: Action
    actor: Actor = SYSTEM
    request_id: str | None = None
    detail: dict[str, Any] | None = None


async def append(
    session: AsyncSession,
    action: Action,
    *,
    actor: Actor = SYSTEM,
    request_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one event in the caller's transaction."""
    await append_many(session, [Entry(action, actor, request_id, detail)])


async def append_many(session: AsyncSession, entries: Sequence[Entry]) -> None:
    """Append events, in order, in the caller's transaction: three statements however many.

    Taking the sequence numbers is an UPDATE of the single head row, so
    concurrent appenders (tasks or replicas) queue on its row lock and the
    chain never forks.
    """
    if not entries:
        return
    row = (await session.exec(_TAKE_SEQS, params={"n": len(entries)})).one()
    seq, prev = int(row[0]) - len(entries), str(row[1])
    created_at = utcnow()
    rows = []
    for e in entries:
        seq += 1
        action = Action(e.action).value  # refuses a name the log does not know
        # JSON round trip so the hash covers exactly what the database will return.
        detail = json.loads(json.dumps(e.detail or {}, default=str))
        digest = event_hash(
            seq=seq,
            prev_hash=prev,
            request_id=e.request_id,
            action=action,
            actor=e.actor,
            detail=detail,
            created_at=created_at,
        )
        rows.append(
            {
                "seq": seq,
                "request_id": e.request_id,
                "action": action,
                "actor_channel": e.actor.channel,
                "actor_id": e.actor.id,
                "actor_name": e.actor.name,
                "detail": detail,
                "created_at": created_at,
                "prev_hash": prev,
                "hash": digest,
            }
        )
        prev = digest
    # Prepared Core statements, not the unit of work: no flush bookkeeping, no statement
    # to build and compile per call; several rows go in one statement.
    await session.exec(_INSERT, params=rows)
    await session.exec(_SET_HASH, params={"new_hash": prev})


@dataclass(frozen=True, slots=True)
class BrokenLink:
    seq: int
    problem: str


async def _events(session: AsyncSession, upto: int | None, batch: int = 1000) -> AsyncIterator[AuditEvent]:
    last = 0
    while True:
        stmt = select(AuditEvent).where(col(AuditEvent.seq) > last)
        if upto is not None:
            stmt = stmt.where(col(AuditEvent.seq) <= upto)
        rows = (await session.exec(stmt.order_by(col(AuditEvent.seq)).limit(batch))).all()
        if not rows:
            return
        for row in rows:
            yield row
        last = rows[-1].seq


async def verify_chain(session: AsyncSession) -> tuple[int, BrokenLink | None]:
    """Walk the chain from the start; return the events checked and the first broken link.

    The walk stops at the head as read first, so events appended meanwhile (by
    transactions that committed after it) are left for the next check.
    """
    head = (await session.exec(select(AuditHead).where(col(AuditHead.id) == 1))).one_or_none()
    prev, expected_seq, count = GENESIS, 1, 0
    async for ev in _events(session, head.seq if head is not None else None):
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
    if head is not None and head.seq != count:
        return count, BrokenLink(count + 1, f"the head says {head.seq} events but {count} exist (deleted)")
    return count, None
