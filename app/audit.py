"""The audit log: append-only events in hash chains that are not one hot row.

Every event is linked into one of :data:`CHAINS` chains: it stores the hash of the event
before it in its chain, and its own hash covers its place there (``chain_seq``), that link,
what happened, who did it, to which request, the details and the time. Each chain's tip
(its length and last hash) is a row of ``audit_head``, updated in the transaction that
appends.

Why several chains: with one chain every write on every replica took the same head row's
lock until it committed (one fsync), so writers queued one behind another and a second
replica made creation slower. Here a transaction takes whichever chain no one else holds
(PostgreSQL ``FOR UPDATE SKIP LOCKED``, from a random place), so appenders wait on a head
only when all :data:`CHAINS` are taken at once; every event of one transaction goes into
the chain it took first, so a transaction holds at most one head and heads never deadlock.
On SQLite (one writer at a time anyway) the chain is picked at random.

What ``signoff audit verify`` (:func:`verify_chain`) still detects, chain by chain:

- an edited event: its hash no longer matches its contents;
- a deleted event: a gap in its chain's numbers;
- a reordering: the links (``prev_hash``) no longer follow; across chains the order of
  events is their time, which each hash covers, so moving one is an edit;
- an added event: past its chain's head (its head not moved with it), or a gap or broken
  link within the chain;
- a truncation: its chain's head counts more events than are there, or (its count lowered
  too) its last hash is not the last event's; a deleted head row (the heads are exactly
  chains 1 to :data:`CHAINS`) is named too.

The hashes are not keyed: someone who can write the database can edit, delete or cut off
events and compute the chain's hashes and its head again from there, and the log alone
cannot tell. What catches that is an anchor kept outside the database: :func:`anchor` (``signoff
audit anchor``) is each chain's length and last hash, and :func:`check_anchor` (``signoff
audit verify --anchor FILE``) finds each chain still holding the event the anchor names at
its place; with the links verified, everything up to it is as it was. Events after the
latest anchor have only the chains' own evidence. The event numbers (``seq``) come from the
database as events are inserted: they order listings, but a transaction that commits late
can add an event below a number already listed; no hash covers them (a renumbering reorders
listings and breaks nothing verified).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.db import dialect_of
from signoff.app.models import AuditEvent, AuditHead, utcnow

__all__ = [
    "CHAINS",
    "Action",
    "Actor",
    "BrokenLink",
    "Entry",
    "anchor",
    "append",
    "append_many",
    "check_anchor",
    "event_hash",
    "verify_chain",
]

CHAINS = 64
"""How many chains the log has (``audit_head`` holds one row for each, made by migration 0015)."""
GENESIS = "0" * 64
"""What the first event of every chain links to."""
_EVENTS: sa.Table = AuditEvent.__table__  # type: ignore[attr-defined]
_HEAD: sa.Table = AuditHead.__table__  # type: ignore[attr-defined]
_N = sa.bindparam("n", type_=sa.Integer)
_TAKE = (
    sa.update(_HEAD)
    .where(_HEAD.c.id == sa.bindparam("chain", type_=sa.Integer))
    .values(seq=_HEAD.c.seq + _N)
    .returning(_HEAD.c.id, _HEAD.c.seq, _HEAD.c.last_hash)
)
"""Append to a given chain, waiting for its head if another transaction holds it."""
_TAKE_FREE = (
    sa.update(_HEAD)
    .where(
        _HEAD.c.id
        == (
            sa.select(_HEAD.c.id)
            .order_by((_HEAD.c.id + CHAINS - sa.bindparam("start", type_=sa.Integer)) % CHAINS)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
    )
    .values(seq=_HEAD.c.seq + _N)
    .returning(_HEAD.c.id, _HEAD.c.seq, _HEAD.c.last_hash)
)
"""Append to the first chain from ``start`` on that no other transaction holds (PostgreSQL);
no row when all are held."""
_INSERT = sa.insert(_EVENTS)
_SET_HASH = (
    sa.update(_HEAD)
    .where(_HEAD.c.id == sa.bindparam("chain", type_=sa.Integer))
    .values(last_hash=sa.bindparam("new_hash"))
)
_HELD = "signoff.audit_chain"
"""``session.info`` key: (the transaction, the chain it holds)."""


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


async def _take(session: AsyncSession, n: int) -> tuple[int, int, str]:
    """Reserve ``n`` places in a chain for the caller's transaction: (chain, the seq before
    them, the hash they link to)."""
    tx = session.sync_session.get_transaction()
    held = session.info.get(_HELD)
    if tx is not None and held is not None and held[0] is tx:
        row = (await session.exec(_TAKE, params={"n": n, "chain": held[1]})).one()
        return int(row[0]), int(row[1]) - n, str(row[2])
    start = random.randint(1, CHAINS)  # spreads writers over the chains
    took = None
    if dialect_of(session) == "postgresql":
        took = (await session.exec(_TAKE_FREE, params={"n": n, "start": start})).one_or_none()
    if took is None:  # SQLite, or every chain held by another transaction
        took = (await session.exec(_TAKE, params={"n": n, "chain": start})).one_or_none()
    if took is None:
        raise RuntimeError(f"the audit log has no head for chain {start}: run `signoff db upgrade`")
    session.info[_HELD] = (session.sync_session.get_transaction(), int(took[0]))
    return int(took[0]), int(took[1]) - n, str(took[2])


async def append_many(session: AsyncSession, entries: Sequence[Entry]) -> None:
    """Append events, in order, in the caller's transaction: three statements however many.

    The events go into one chain, the one this transaction already appends to or one no
    other transaction holds (see the module's description).
    """
    if not entries:
        return
    chain, seq, prev = await _take(session, len(entries))
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
                "chain": chain,
                "chain_seq": seq,
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
    await session.exec(_SET_HASH, params={"new_hash": prev, "chain": chain})


@dataclass(frozen=True, slots=True)
class BrokenLink:
    """Where the log is broken: the event's number (``seq``; 0 for a chain's head) and what
    is wrong, naming the chain."""

    seq: int
    problem: str


async def _events(session: AsyncSession, batch: int = 1000) -> AsyncIterator[AuditEvent]:
    """Every event, chain by chain, each chain in order (whatever its chain and place: one
    added below chain 1 or place 1 is walked too)."""
    last: tuple[int, int] | None = None
    key = sa.tuple_(col(AuditEvent.chain), col(AuditEvent.chain_seq))
    while True:
        stmt = select(AuditEvent).order_by(col(AuditEvent.chain), col(AuditEvent.chain_seq)).limit(batch)
        if last is not None:
            stmt = stmt.where(key > sa.tuple_(sa.literal(last[0]), sa.literal(last[1])))
        rows = (await session.exec(stmt)).all()
        if not rows:
            return
        for row in rows:
            yield row
        last = (rows[-1].chain, rows[-1].chain_seq)


async def verify_chain(session: AsyncSession) -> tuple[int, BrokenLink | None]:
    """Walk every chain from its start; return the events checked and the first broken link.

    Each walk stops at its head as read first, so events appended meanwhile (by
    transactions that committed after it) are left for the next check; the heads are read
    again at the end, and an event past what its head counts then was not appended by a
    transaction (added). A value no append writes (SQLite keeps text in any column: a time
    or a number that is not one) is named as an edit too.
    """
    try:
        return await _walk(session)
    except (ValueError, TypeError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        return 0, BrokenLink(0, f"the log holds a value no event was written with ({what}) (edited)")


async def _walk(session: AsyncSession) -> tuple[int, BrokenLink | None]:
    heads = {h.id: h for h in (await session.exec(select(AuditHead))).all()}
    unknown = sorted(set(heads) - set(range(1, CHAINS + 1)))
    if unknown:
        return 0, BrokenLink(0, f"the log has a head for chain {unknown[0]}, which does not exist (added)")
    missing = sorted(set(range(1, CHAINS + 1)) - set(heads))
    if missing:
        return 0, BrokenLink(0, f"chain {missing[0]}'s head is missing (deleted)")
    count, chain, prev, seen = 0, 0, GENESIS, 0
    beyond: list[tuple[int, int, int]] = []
    """The events past their head as read first: (chain, place, seq), in order."""

    def short(c: int, n: int, last: str) -> BrokenLink | None:
        """Chain ``c``'s end, after ``n`` events of it were seen, the last hashed ``last``."""
        if heads[c].seq != n:
            return BrokenLink(0, f"chain {c}'s head says {heads[c].seq} events but {n} exist (deleted)")
        if heads[c].last_hash != last:
            of = f"its event {n}'s" if n else "an empty chain's"
            return BrokenLink(0, f"chain {c}'s head's last hash is not {of} (edited or truncated)")
        return None

    def ends(upto: int) -> BrokenLink | None:
        """The chains after ``chain`` and before ``upto`` are empty, and ``chain`` ends here."""
        for c, n, last in [(chain, seen, prev), *((c, 0, GENESIS) for c in range(chain + 1, upto))]:
            if c and (broken := short(c, n, last)) is not None:
                return broken
        return None

    async for ev in _events(session):
        if ev.chain not in heads:
            return count, BrokenLink(ev.seq, f"event {ev.seq} is in chain {ev.chain}, which does not exist")
        if ev.chain != chain:
            if (broken := ends(ev.chain)) is not None:
                return count, broken
            chain, prev, seen = ev.chain, GENESIS, 0
        if ev.chain_seq > heads[chain].seq:
            # Committed after the heads were read, or added by hand: checked below.
            beyond.append((chain, ev.chain_seq, ev.seq))
            continue
        where = f"chain {chain} event {seen + 1}"
        if ev.chain_seq != seen + 1:
            return count, BrokenLink(ev.seq, f"{where} is missing (the next is {ev.chain_seq})")
        if ev.prev_hash != prev:
            return count, BrokenLink(ev.seq, f"{where}: prev_hash does not match the previous event's hash")
        actual = event_hash(
            seq=ev.chain_seq,
            prev_hash=ev.prev_hash,
            request_id=ev.request_id,
            action=ev.action,
            actor=Actor(ev.actor_channel or "", ev.actor_id, ev.actor_name),
            detail=ev.detail,
            created_at=ev.created_at,
        )
        if actual != ev.hash:
            return count, BrokenLink(ev.seq, f"{where}: its contents do not match its hash (edited)")
        prev, seen, count = ev.hash, seen + 1, count + 1
    if (broken := ends(CHAINS + 1)) is not None:
        return count, broken
    if beyond:
        # A transaction moves its chain's head in the commit that adds its events: any event
        # seen after the heads were first read is counted by its head now.
        # Columns, not the rows as objects: the session's identity map keeps those as first read.
        rows = (await session.exec(select(col(AuditHead.id), col(AuditHead.seq)))).all()
        now = dict(rows)
        for c, n, seq in beyond:
            if n > now.get(c, 0):
                return count, BrokenLink(
                    seq, f"chain {c} event {n} is past its chain's head ({now.get(c, 0)} events) (added)"
                )
    return count, None


async def anchor(session: AsyncSession) -> dict[str, Any]:
    """Each non-empty chain's length and last hash, to keep outside the database:
    ``{"taken_at", "chains": {"3": {"seq": 12, "hash": "…"}, …}}``."""
    rows = (await session.exec(select(col(AuditHead.id), col(AuditHead.seq), col(AuditHead.last_hash)))).all()
    return {
        "taken_at": utcnow().isoformat(),
        "chains": {str(c): {"seq": n, "hash": h} for c, n, h in sorted(rows) if n},
    }


def _anchored(value: Any) -> tuple[str, dict[int, tuple[int, str]]]:
    """An anchor's time and chains; ValueError saying what is wrong with it."""
    chains = value.get("chains") if isinstance(value, dict) else None
    if not isinstance(chains, dict):
        raise ValueError(
            'it is not an anchor ({"taken_at", "chains": {...}}) as `signoff audit anchor` writes'
        )
    out: dict[int, tuple[int, str]] = {}
    for key, tip in chains.items():
        n = tip.get("seq") if isinstance(tip, dict) else None
        h = tip.get("hash") if isinstance(tip, dict) else None
        if not (str(key).isdigit() and 1 <= int(key) <= CHAINS):
            raise ValueError(f"it names chain {key!r}; the chains are 1 to {CHAINS}")
        if type(n) is not int or n < 1 or not isinstance(h, str):
            raise ValueError(f"chain {key} has no length (seq) and last hash (hash)")
        out[int(key)] = (n, h)
    return str(value.get("taken_at") or "at an unknown time"), out


async def check_anchor(session: AsyncSession, value: Any) -> BrokenLink | None:
    """Whether each chain still holds the event ``value`` (an :func:`anchor`) names at its
    place; with :func:`verify_chain` passing, every event up to it is then as anchored.
    Raises ValueError for what is not an anchor."""
    taken_at, chains = _anchored(value)
    for c, (n, h) in sorted(chains.items()):
        stmt = select(col(AuditEvent.seq), col(AuditEvent.hash)).where(
            col(AuditEvent.chain) == c, col(AuditEvent.chain_seq) == n
        )
        found = (await session.exec(stmt)).first()
        if found is None:
            return BrokenLink(
                0, f"chain {c} has no event {n}, which the anchor taken at {taken_at} holds (truncated)"
            )
        if found[1] != h:
            return BrokenLink(
                found[0],
                f"chain {c} event {n} is not the one the anchor taken at {taken_at} holds (rewritten)",
            )
    return None
