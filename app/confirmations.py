"""The confirmation state machine.

``pending → approved | rejected | expired | cancelled``; terminal states never
change. Every transition is one conditional UPDATE on the current status, so
racing writers (two approvers, a double click, the expiry sweep, a cancel) get
exactly one winner; the audit event and the card updates it causes are written
in the same transaction. Nothing here commits: the caller owns the transaction.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig
from signoff.app.db import dialect_of, insert_ignoring
from signoff.app.metrics import DECISION_SECONDS, DECISIONS
from signoff.app.models import ConfirmationRequest, Delivery, OutboxStatus, Status, Vote, utcnow
from signoff.app.redaction import redact
from signoff.app.votes import NOT_AN_APPROVER, Voter, eligible_gates, gates_of
from signoff.channels import Card, GateProgress, Person, Verdict
from signoff.hooks import Decision, HookResult
from signoff.hooks._gate import describe_request

__all__ = [
    "ALLOWED_TRANSITIONS",
    "TERMINAL",
    "VoteResult",
    "Voter",
    "build_card",
    "cast_vote",
    "expire_overdue",
    "get_request",
    "redact",
    "refuse_vote",
    "transition",
]

ALLOWED_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.APPROVED, Status.REJECTED, Status.EXPIRED, Status.CANCELLED}),
    Status.APPROVED: frozenset(),
    Status.REJECTED: frozenset(),
    Status.EXPIRED: frozenset(),
    Status.CANCELLED: frozenset(),
}
TERMINAL = frozenset(s for s, targets in ALLOWED_TRANSITIONS.items() if not targets)

DECIDED_KEY = "signoff.decided"
NOTIFY_CHANNEL = "signoff_decided"
NOTIFY_BATCH = 200  # ids per NOTIFY payload (payloads are limited to 8000 bytes)
OUTBOX_KEY = "signoff.outbox"


_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
_DELIVERIES: sa.Table = Delivery.__table__  # type: ignore[attr-defined]
_INSERT_DELIVERY = sa.insert(_DELIVERIES)
_GET = select(ConfirmationRequest).where(col(ConfirmationRequest.id) == sa.bindparam("request_id"))
_GET_FOR_UPDATE = _GET.with_for_update()
_VOTES_OF = select(Vote).where(col(Vote.request_id) == sa.bindparam("request_id")).order_by(col(Vote.id))
_CARDS = (
    select(_DELIVERIES.c.channel, _DELIVERIES.c.kind, _DELIVERIES.c.status, _DELIVERIES.c.leased_until)
    .where(_DELIVERIES.c.request_id == sa.bindparam("request_id"))
    .with_for_update()
)
_VOTES: sa.Table = Vote.__table__  # type: ignore[attr-defined]
_VOTE_KEY = ("request_id", "gate", "voter")


def _row(obj: Any, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A model instance's column values, for a Core INSERT (no unit-of-work flush)."""
    return {c.name: getattr(obj, c.name) for c in obj.__table__.columns if c.name not in skip}


def _sources(target: Status) -> list[str]:
    return [s.value for s, targets in ALLOWED_TRANSITIONS.items() if target in targets]


async def get_request(
    session: AsyncSession, request_id: str, *, for_update: bool = False
) -> ConfirmationRequest | None:
    stmt = _GET_FOR_UPDATE if for_update else _GET
    return (await session.exec(stmt, params={"request_id": request_id})).one_or_none()


def _observe(status: Status, now: datetime, created_at: datetime) -> None:
    DECISIONS.labels(status.value).inc()
    DECISION_SECONDS.labels(status.value).observe(max(0.0, (now - created_at).total_seconds()))


async def _mark_decided(session: AsyncSession, request_ids: Sequence[str], *, notified: bool = False) -> None:
    """Wake waiters once this transaction commits: in this process, and on PostgreSQL in every
    process listening (NOTIFY is delivered at commit, and never if the transaction rolls back).
    ``notified``: the NOTIFY was already sent (within the deciding statement)."""
    if not request_ids:
        return
    session.sync_session.info.setdefault(DECIDED_KEY, set()).update(request_ids)
    if not notified and _on_postgres(session):
        for i in range(0, len(request_ids), NOTIFY_BATCH):
            payload = ",".join(request_ids[i : i + NOTIFY_BATCH])
            await session.exec(select(sa.func.pg_notify(NOTIFY_CHANNEL, payload)))


def _on_postgres(session: AsyncSession) -> bool:
    return dialect_of(session) == "postgresql"


async def _queue_updates(session: AsyncSession, request_id: str) -> None:
    """Owe every channel the request's card was posted to a redraw (one queued redraw each is
    enough). A ``web`` channel, whatever its name, never got a card: intake decided that, by
    the channel's type."""
    # Only the request's own few deliveries, by the request_id index (with the status in SQL,
    # SQLite's planner prefers the status index and scans every pending delivery), locked:
    # a dispatcher claiming one of them waits for this transaction, so it draws the card
    # as this transaction leaves it.
    rows = (await session.exec(_CARDS, params={"request_id": request_id})).all()
    posted = dict.fromkeys(ch for ch, kind, _, _ in rows if kind == "post")
    queued = {
        ch
        for ch, kind, status, leased in rows
        if kind == "update" and status == OutboxStatus.PENDING and leased is None
    }
    owed = [
        _row(Delivery(request_id=request_id, channel=ch, kind="update"), skip=("id",))
        for ch in posted
        if ch not in queued
    ]
    if owed:
        await session.exec(_INSERT_DELIVERY, params=owed)
        session.sync_session.info[OUTBOX_KEY] = True


@functools.cache
def _transition_statement(target: Status, *, notify: bool) -> sa.Update:
    """The conditional UPDATE moving a request to ``target``, built once (Core, with binds).

    ``notify`` (PostgreSQL): the statement sends the NOTIFY itself, one round trip
    fewer, still only at commit and only for a row it changed.
    """
    r = _REQUESTS.c
    stmt = (
        sa.update(_REQUESTS)
        .where(r.id == sa.bindparam("request_id"), r.status.in_(_sources(target)))
        .values(
            status=target.value,
            reason=sa.bindparam("new_reason"),
            decided_at=sa.bindparam("new_decided_at"),
            decided_by_channel=sa.bindparam("new_channel"),
            decided_by_user_id=sa.bindparam("new_user_id"),
            decided_by_name=sa.bindparam("new_name"),
        )
        .returning(r.created_at)
    )
    return stmt.returning(sa.func.pg_notify(NOTIFY_CHANNEL, r.id)) if notify else stmt


async def transition(
    session: AsyncSession,
    request_id: str,
    target: Status,
    *,
    actor: Actor,
    reason: str | None = None,
    now: datetime | None = None,
    along: Sequence[audit.Entry] = (),
) -> bool:
    """Move a request to ``target`` if the table allows it from its current status.

    Returns False when another writer got there first (the request is no longer
    in a status that allows ``target``); nothing is written then but the audit
    events ``along`` (a vote, say), which are otherwise appended just before the
    transition's own, in the same statements.
    """
    now = now or utcnow()
    postgres = _on_postgres(session)
    params = {
        "request_id": request_id,
        "new_reason": reason,
        "new_decided_at": now,
        "new_channel": actor.channel,
        "new_user_id": actor.id,
        "new_name": actor.name,
    }
    stmt = _transition_statement(target, notify=postgres)
    row = (await session.exec(stmt, params=params)).first()
    if row is None:
        await audit.append_many(session, along)
        return False
    _observe(target, now, row[0])
    await _queue_updates(session, request_id)
    await _mark_decided(session, [request_id], notified=postgres)
    # The audit events last: on PostgreSQL the head row stays locked until commit.
    await audit.append_many(
        session, [*along, audit.Entry(target.value, actor, request_id, {"reason": reason})]
    )
    return True


async def expire_overdue(
    session: AsyncSession, *, now: datetime | None = None, batch: int = 500
) -> list[str]:
    """Expire pending requests past their deadline; safe to run on every replica at once."""
    now = now or utcnow()
    due = (
        select(ConfirmationRequest.id)
        .where(col(ConfirmationRequest.status) == Status.PENDING, col(ConfirmationRequest.expires_at) <= now)
        .order_by(col(ConfirmationRequest.expires_at))
        .limit(batch)
        # Replicas sweeping at once skip each other's rows instead of deadlocking.
        .with_for_update(skip_locked=True)
    )
    rows = (
        await session.exec(
            sa.update(ConfirmationRequest)
            .where(
                col(ConfirmationRequest.id).in_(due.scalar_subquery()),
                col(ConfirmationRequest.status).in_(_sources(Status.EXPIRED)),
            )
            .values(
                status=Status.EXPIRED.value,
                reason="no decision before the deadline",
                decided_at=now,
                decided_by_channel="system",
                decided_by_user_id="expiry",
                decided_by_name=None,
            )
            .returning(col(ConfirmationRequest.id), col(ConfirmationRequest.created_at))
            .execution_options(synchronize_session=False)
        )
    ).all()
    for r in rows:
        _observe(Status.EXPIRED, now, r[1])
    expired = sorted(str(r[0]) for r in rows)
    for rid in expired:
        await audit.append(
            session,
            Status.EXPIRED.value,
            actor=Actor("system", "expiry"),
            request_id=rid,
            detail={"reason": "no decision before the deadline"},
        )
        await _queue_updates(session, rid)
    await _mark_decided(session, expired)
    return expired


# --- votes -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoteResult:
    accepted: bool
    message: str
    request: ConfirmationRequest
    decided: bool = False


def _describe_decided(req: ConfirmationRequest) -> str:
    who = req.decided_by_name or req.decided_by_user_id
    if req.status == Status.EXPIRED:
        return "This request has already expired."
    by = f" by {who}" if who and req.decided_by_channel != "system" else ""
    return f"This request was already {req.status}{by}."


async def cast_vote(
    session: AsyncSession,
    request_id: str,
    *,
    voter: Voter,
    verdict: Verdict,
    config: SignoffConfig,
    reason: str | None = None,
    now: datetime | None = None,
) -> VoteResult | None:
    """Record one vote and apply the transition it causes. None if there is no such request.

    Refusals (not an approver, the requester, already decided, a second vote)
    change nothing but the audit log, and say why.
    """
    now = now or utcnow()
    req = await get_request(session, request_id, for_update=True)
    if req is None:
        return None
    detail = _vote_detail(voter, verdict, reason)

    async def refuse(message: str) -> VoteResult:
        await _audit_refusal(session, req, voter, detail, message)
        return VoteResult(False, message, req)

    if req.status != Status.PENDING:
        return await refuse(_describe_decided(req))
    if req.expires_at <= now:
        expiry, late = Actor("system", "expiry"), "no decision before the deadline"
        won = await transition(session, request_id, Status.EXPIRED, actor=expiry, reason=late, now=now)
        await _settle(session, req, won, Status.EXPIRED, expiry, late, now)
        return await refuse("This request has already expired.")
    gates = gates_of(req)
    requesters = (req.requester, req.user_id)
    eligible, why = eligible_gates(gates, requesters=requesters, voter=voter, config=config)
    if not eligible:
        return await refuse(why or NOT_AN_APPROVER)
    if (
        verdict is Verdict.REJECT
        and any(gates[i].get("require_reject_reason") for i in eligible)
        and not (reason and reason.strip())
    ):
        return await refuse("A reason is required to reject this request.")

    # One row per gate the vote counts for; a gate this voter already voted on keeps that vote.
    counted = [i for i in eligible if await _insert_vote(session, request_id, i, voter, verdict, reason, now)]
    if not counted:
        return await refuse("You have already voted on this request.")
    names = [str(gates[i].get("name", "")) for i in counted]
    voted = [audit.Entry("vote", voter.actor, request_id, {**detail, "gates": names})]

    decided_by = voter.actor
    if verdict is Verdict.REJECT:
        won = await transition(
            session, request_id, Status.REJECTED, actor=decided_by, reason=reason, now=now, along=voted
        )
        await _settle(session, req, won, Status.REJECTED, decided_by, reason, now)
        return VoteResult(True, f"Rejected by {decided_by.name or decided_by.id}.", req, decided=True)

    quorums = [int(g.get("quorum", 1)) for g in gates]
    # One gate with a quorum of one: this vote is the approval (the request was pending, under lock).
    approvals = [1] if quorums == [1] else await _approvals(session, request_id, len(gates))
    if all(a >= q for a, q in zip(approvals, quorums, strict=True)):
        won = await transition(
            session, request_id, Status.APPROVED, actor=decided_by, reason=reason, now=now, along=voted
        )
        await _settle(session, req, won, Status.APPROVED, decided_by, reason, now)
        return VoteResult(True, f"Approved by {decided_by.name or decided_by.id}.", req, decided=True)
    await _queue_updates(session, request_id)
    await audit.append_many(session, voted)
    return VoteResult(True, _progress(gates, counted, approvals, quorums), req)


def _progress(
    gates: Sequence[Mapping[str, Any]],
    counted: Sequence[int],
    approvals: Sequence[int],
    quorums: Sequence[int],
) -> str:
    """What an approval that did not decide the request changed, and what it still waits for."""
    if len(gates) == 1:
        return f"Approval recorded ({approvals[0]} of {quorums[0]})."

    def state(i: int) -> str:
        return f"{gates[i].get('name', '')} {approvals[i]} of {quorums[i]}"

    waiting = [i for i in range(len(gates)) if approvals[i] < quorums[i]]
    recorded = ", ".join(state(i) for i in counted)
    return f"Approval recorded ({recorded}); still waiting for {', '.join(state(i) for i in waiting)}."


async def _insert_vote(
    session: AsyncSession,
    request_id: str,
    gate: int,
    voter: Voter,
    verdict: Verdict,
    reason: str | None,
    now: datetime,
) -> bool:
    """Record ``voter``'s vote for gate ``gate``; False if they already voted on it."""
    vote = Vote(
        request_id=request_id,
        gate=gate,
        voter=voter.key,
        verdict=verdict.value,
        channel=voter.channel,
        user_id=voter.user_id,
        name=voter.name,
        email=voter.email,
        reason=reason,
        identity=dict(voter.identity or {}),
        created_at=now,
    )
    return await _insert_unless_taken(session, _VOTES, _VOTE_KEY, _row(vote, skip=("id",)))


def _vote_detail(voter: Voter, verdict: Verdict, reason: str | None) -> dict[str, Any]:
    identity = dict(voter.identity or {})
    if voter.email:
        identity["email"] = voter.email
    return {"verdict": verdict.value, "reason": reason, "identity": identity}


async def _audit_refusal(
    session: AsyncSession, req: ConfirmationRequest, voter: Voter, detail: dict[str, Any], why: str
) -> None:
    await audit.append(
        session, "vote_refused", actor=voter.actor, request_id=req.id, detail={**detail, "why": why}
    )


async def refuse_vote(
    session: AsyncSession,
    request_id: str,
    *,
    voter: Voter,
    verdict: Verdict,
    why: str,
    reason: str | None = None,
) -> VoteResult | None:
    """Refuse a vote for a reason found before voting (where the click came from, who the
    clicker is): only the audit log changes. None if there is no such request."""
    req = await get_request(session, request_id)
    if req is None:
        return None
    await _audit_refusal(session, req, voter, _vote_detail(voter, verdict, reason), why)
    return VoteResult(False, why, req)


async def _approvals(session: AsyncSession, request_id: str, gates: int) -> list[int]:
    """Approving votes per gate (index), for a request of ``gates`` gates."""
    rows = await session.exec(
        select(col(Vote.gate), sa.func.count())
        .where(col(Vote.request_id) == request_id, col(Vote.verdict) == "approve")
        .group_by(col(Vote.gate))
    )
    counts = dict(rows.all())
    return [int(counts.get(i, 0)) for i in range(gates)]


# --- cards -------------------------------------------------------------------------------------


async def votes_for(session: AsyncSession, request_id: str) -> list[Vote]:
    return list((await session.exec(_VOTES_OF, params={"request_id": request_id})).all())


def build_card(
    req: ConfirmationRequest, votes: Sequence[Vote], config: SignoffConfig, channel_type: str, *, channel: str
) -> Card:
    """Plain data for ``channel`` to draw ``req`` as it stands: the card of the gates posted
    there (and, when the request needs several gates, how each one stands)."""

    def person(key: str) -> Person:
        if key in config.people:
            return Person(config.display_name(key), config.channel_id_of(key, channel_type))
        return Person(key, key)

    gates = gates_of(req)
    here = [i for i, g in enumerate(gates) if g.get("channel") == channel] or list(range(len(gates)))
    approving = [v for v in votes if v.verdict == "approve"]

    def approvals(gate: int) -> tuple[Person, ...]:
        return tuple(Person(v.name or v.voter, v.user_id) for v in approving if v.gate == gate)

    progress = tuple(
        GateProgress(str(g.get("name", "")), int(g.get("quorum", 1)), approvals(i), here=i in here)
        for i, g in enumerate(gates)
    )
    decided_by = None
    if req.status != Status.PENDING and req.decided_by_channel != "system":
        decided_by = Person(req.decided_by_name or req.decided_by_user_id or "", req.decided_by_user_id)
    approvers = dict.fromkeys(a for i in here for a in gates[i].get("approvers") or ())
    voters = {v.voter: Person(v.name or v.voter, v.user_id) for v in approving if v.gate in here}
    return Card(
        request_id=req.id,
        agent_id=req.agent_id,
        tool_name=req.tool_name,
        arguments=req.arguments,
        status=str(req.status.value if isinstance(req.status, Status) else req.status),
        created_at=req.created_at,
        expires_at=req.expires_at,
        quorum=sum(progress[i].quorum for i in here),
        approvers=tuple(person(a) for a in approvers),
        requester=person(req.requester)
        if req.requester
        else (Person(req.user_id, req.user_id) if req.user_id else None),
        approvals=tuple(voters.values()),
        decided_by=decided_by,
        decided_at=req.decided_at,
        reason=req.reason,
        require_reject_reason=any(bool(gates[i].get("require_reject_reason", False)) for i in here),
        gates=progress if len(gates) > 1 else (),
    )


# --- creating requests (the server side of the confirmation gate) ------------------------------


def decision_for(req: ConfirmationRequest) -> HookResult:
    """The hook answer for an existing request (an idempotent replay), in the words the
    client library uses for a decision it waited for."""
    if req.status == Status.PENDING:
        return HookResult(
            decision=Decision.PENDING, reason=f"waiting for approval (request {req.id})", request_id=req.id
        )
    decided_by = (
        {"channel": req.decided_by_channel, "user_id": req.decided_by_user_id, "name": req.decided_by_name}
        if req.decided_by_channel
        else None
    )
    text = describe_request(
        {"id": req.id, "status": Status(req.status).value, "reason": req.reason, "decided_by": decided_by}
    )
    if req.status == Status.APPROVED:
        return HookResult(decision=Decision.ALLOW, reason=text, request_id=req.id)
    return HookResult.deny(text, request_id=req.id)


def call_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    body = json.dumps([tool_name, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


async def _insert_unless_taken(
    session: AsyncSession, table: sa.Table, unique: tuple[str, ...], row: dict[str, Any]
) -> bool:
    """INSERT ``row`` unless a row with the same ``unique`` columns exists; True if inserted.

    One statement (``ON CONFLICT DO NOTHING``) instead of a look-up or a savepoint and a
    flush: on PostgreSQL a racing insert of the same key waits for the other
    transaction, then does nothing.
    """
    stmt = insert_ignoring(dialect_of(session), table, unique)
    return (await session.exec(stmt, params=row)).first() is not None


async def _settle(
    session: AsyncSession,
    req: ConfirmationRequest,
    won: bool,
    target: Status,
    actor: Actor,
    reason: str | None,
    now: datetime,
) -> None:
    """Bring the (locked) ``req`` up to date after a transition without reading it again."""
    if not won:
        await session.refresh(req)
        return
    values = {
        "status": target.value,
        "reason": reason,
        "decided_at": now,
        "decided_by_channel": actor.channel,
        "decided_by_user_id": actor.id,
        "decided_by_name": actor.name,
    }
    for name, value in values.items():
        set_committed_value(req, name, value)
