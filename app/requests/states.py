"""The confirmation state machine.

``pending → approved | rejected | expired | cancelled``; terminal states never
change. Every transition is one conditional UPDATE on the current status, so
racing writers (two approvers, a double click, the expiry sweep, a cancel) get
exactly one winner; the audit event and the card updates it causes are written
in the same transaction. Nothing here commits: the caller owns the transaction.

Votes (:mod:`signoff.app.requests.votes`) and cards (:mod:`signoff.app.requests.cards`) build on it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.config import REQUEST_DECIDED
from signoff.app.db import chosen_once, dialect_of, emit, on_commit, wake_after_commit
from signoff.app.deliveries import owed_delivery, queue_deliveries  # also offered from here
from signoff.app.metrics import observe_decision
from signoff.app.models import (
    ConfirmationRequest,
    Delivery,
    DeliveryKind,
    OutboxStatus,
    Status,
    from_row,
    utcnow,
)
from signoff.app.requests.activity import gate_names, log_after_commit
from signoff.app.requests.edits import approved_changes
from signoff.app.requests.eligibility import asked, gates_of
from signoff.app.requests.receipts import Decided, sign_decisions
from signoff.channels import duration_text
from signoff.hooks import Decision, HookResult, describe_request

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DECIDED_COLUMNS",
    "EXPIRED_REASON",
    "EXPIRY",
    "NOTIFY_CHANNEL",
    "TERMINAL",
    "decided_columns",
    "decision_for",
    "expire",
    "expire_overdue",
    "expiry_reason",
    "get_request",
    "held",
    "owed_delivery",
    "queue_deliveries",
    "queue_updates",
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

NOTIFY_CHANNEL = "signoff_decided"
NOTIFY_BATCH = 200  # ids per NOTIFY payload (payloads are limited to 8000 bytes)

EXPIRY = Actor("system", "expiry")
"""Who expires a request: its deadline."""
EXPIRED_REASON = "no decision before the deadline"
"""What an expiry said before it named its time and whom it asked (see :func:`expiry_reason`)."""


DECIDED_COLUMNS = ("reason", "decided_at", "decided_by_channel", "decided_by_user_id", "decided_by_name")
"""What a transition writes besides the status: why, when and by whom (None while pending)."""


def decided_columns(actor: Actor, reason: str | None, now: datetime) -> dict[str, Any]:
    """The values of :data:`DECIDED_COLUMNS` for a transition by ``actor``."""
    return dict(zip(DECIDED_COLUMNS, (reason, now, actor.channel, actor.id, actor.name), strict=True))


_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
_DELIVERIES: sa.Table = Delivery.__table__  # type: ignore[attr-defined]
_GET = select(ConfirmationRequest).where(col(ConfirmationRequest.id) == sa.bindparam("request_id"))
_GET_FOR_UPDATE = _GET.with_for_update()
_CARDS = (
    sa.select(
        _DELIVERIES.c.channel,
        _DELIVERIES.c.kind,
        _DELIVERIES.c.status,
        _DELIVERIES.c.leased_until,
        _DELIVERIES.c.next_attempt_at,
    )
    .where(_DELIVERIES.c.request_id == sa.bindparam("request_id"))
    .with_for_update()
)


def _sources(target: Status) -> list[str]:
    return [s.value for s, targets in ALLOWED_TRANSITIONS.items() if target in targets]


async def get_request(
    session: AsyncSession, request_id: str, *, for_update: bool = False
) -> ConfirmationRequest | None:
    stmt = _GET_FOR_UPDATE if for_update else _GET
    return (await session.exec(stmt, params={"request_id": request_id})).one_or_none()


def _observe(
    session: AsyncSession,
    request_id: str,
    status: Status,
    now: datetime,
    created_at: datetime,
    *,
    agent: str,
    tool: str,
    gate: str | None,
    who: str | None,
) -> None:
    """Once the transaction commits: count the decision, and log it."""
    on_commit(session, functools.partial(observe_decision, request_id, status.value, created_at, now))
    event = "request expired" if status is Status.EXPIRED else "request decided"
    log_after_commit(
        session, event, request_id, agent=agent, tool=tool, gate=gate, who=who, verdict=status.value
    )


async def _mark_decided(
    session: AsyncSession, request_ids: Sequence[str], now: datetime, *, notified: bool = False
) -> None:
    """Wake waiters once this transaction commits: in this process, and on PostgreSQL in every
    process listening (NOTIFY is delivered at commit, and never if the transaction rolls back).
    ``notified``: the NOTIFY was already sent (within the deciding statement). The decisions
    are owed to the webhooks subscribed to ``request.decided``."""
    if not request_ids:
        return
    wake_after_commit(session, decided=request_ids)
    emit(session, REQUEST_DECIDED, request_ids, now=now)
    if not notified and _on_postgres(session):
        for i in range(0, len(request_ids), NOTIFY_BATCH):
            payload = ",".join(request_ids[i : i + NOTIFY_BATCH])
            await session.exec(select(sa.func.pg_notify(NOTIFY_CHANNEL, payload)))


def _on_postgres(session: AsyncSession) -> bool:
    return dialect_of(session) == "postgresql"


async def queue_updates(session: AsyncSession, request_id: str) -> None:
    """Owe every channel the request's card was posted to a redraw (one queued redraw each is
    enough). A ``web`` channel, whatever its name, never got a card: intake decided that, by
    the channel's type. An escalation counts once it is due: one not due yet will find the
    request decided and post nothing."""
    # Only the request's own few deliveries, by the request_id index (with the status in SQL,
    # SQLite's planner prefers the status index and scans every pending delivery), locked:
    # a dispatcher claiming one of them waits for this transaction, so it draws the card
    # as this transaction leaves it.
    # (sqlmodel's exec is typed for selects of up to four columns)
    rows = (await session.exec(_CARDS, params={"request_id": request_id})).all()  # type: ignore[call-overload]
    now = utcnow()  # due at once, whatever time the transition was given
    posted = dict.fromkeys(
        ch
        for ch, kind, status, _, due in rows
        if kind == DeliveryKind.POST
        or (
            kind == DeliveryKind.ESCALATE
            and (status == OutboxStatus.SENT or (status == OutboxStatus.PENDING and due <= now))
        )
    )
    queued = {
        ch
        for ch, kind, status, leased, _ in rows
        if kind == DeliveryKind.UPDATE and status == OutboxStatus.PENDING and leased is None
    }
    await queue_deliveries(
        session, [owed_delivery(request_id, ch, "update", now) for ch in posted if ch not in queued]
    )


_RECEIPT_COLUMNS = (
    "id",
    "agent_id",
    "tool_name",
    "session_id",
    "arguments",
    "call_digest",
    "action_digest",
    "config_version",
    "channel",
    "gate",
    "gates",
)
"""What a decision receipt says of its request: columns fixed when the request was made."""


def _decided(req: ConfirmationRequest) -> Decided:
    """The receipt's view of ``req`` (:data:`_RECEIPT_COLUMNS` are all it reads)."""
    snapshots = gates_of(req)
    return Decided(
        request_id=req.id,
        agent=req.agent_id,
        tool=req.tool_name,
        session=req.session_id,
        arguments=req.arguments or {},
        call_digest=req.call_digest,
        action_digest=req.action_digest,
        policy_version=snapshots[0].config_version if snapshots else req.config_version,
        gates=snapshots,
    )


@functools.cache
def _transition_statement(target: Status, *, notify: bool) -> sa.Update:
    """The conditional UPDATE moving a request to ``target``, built once (Core, with binds).

    ``notify`` (PostgreSQL): the statement sends the NOTIFY itself, one round trip
    fewer, still only at commit and only for a row it changed.
    """
    r = _REQUESTS.c
    written: dict[str, Any] = {c: sa.bindparam(f"new_{c}") for c in (*DECIDED_COLUMNS, "receipt")}
    stmt = (
        sa.update(_REQUESTS)
        .where(r.id == sa.bindparam("request_id"), r.status.in_(_sources(target)))
        .values(status=target.value, **written)
        .returning(r.id)
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
    changes: Mapping[str, Any] | None = None,
) -> bool:
    """Move request ``request_id`` to ``target`` if the table allows it from its current status,
    with its signed decision receipt (every status ``target`` may be is terminal), in one
    statement. The request is read under lock here unless this transaction holds it already
    (read under lock: :func:`get_request` with ``for_update``), and is kept as written.

    Returns False when another writer got there first (the request is no longer
    in a status that allows ``target``); nothing is written then but the audit
    events ``along`` (a vote, say), which are otherwise appended just before the
    transition's own, in the same statements. ``changes``: an approval with these argument
    fields changed (the receipt names the call as approved).
    """
    now = now or utcnow()
    req = held(session, request_id) or await get_request(session, request_id, for_update=True)
    if req is None or target not in ALLOWED_TRANSITIONS[Status(req.status)]:
        await audit.append_many(session, along)
        return False
    receipts = await sign_decisions(
        session, [_decided(req)], target.value, actor=actor, reason=reason, decided_at=now, changes=changes
    )
    written = {**decided_columns(actor, reason, now), "receipt": receipts[request_id]}
    postgres = _on_postgres(session)
    stmt = _transition_statement(target, notify=postgres)
    params = {"request_id": request_id, **{f"new_{c}": v for c, v in written.items()}}
    if (await session.exec(stmt, params=params)).first() is None:
        # Read under lock as pending, so only a writer outside the state machine could have.
        await session.refresh(req)
        await audit.append_many(session, along)
        return False
    _keep_loaded(session, request_id, {"status": target.value, **written})
    _observe(
        session,
        request_id,
        target,
        now,
        req.created_at,
        agent=req.agent_id,
        tool=req.tool_name,
        gate=gate_names(req.gate, req.gates),
        who=actor.name or actor.id,
    )
    await queue_updates(session, request_id)
    await _mark_decided(session, [request_id], now, notified=postgres)
    # The audit events last: on PostgreSQL the head row stays locked until commit.
    await audit.append_many(
        session, [*along, audit.Entry(audit.Action(target.value), actor, request_id, {"reason": reason})]
    )
    return True


def expiry_reason(req: ConfirmationRequest) -> str:
    """Why ``req`` expired, in plain words: nobody decided in its time, and whom it asked
    (``nobody decided within 30m; asked Alice, Bob``). Not a refusal: nobody refused."""
    within = max(0.0, (req.expires_at - req.created_at).total_seconds())
    names = asked(gates_of(req), within=within)
    text = f"nobody decided within {duration_text(round(within))}"
    if names:
        return f"{text}; asked {', '.join(names)}"
    return f"{text}; anyone who could see the card could have"


_SET_REASON = (
    sa.update(_REQUESTS)
    .where(_REQUESTS.c.id == sa.bindparam("rid"))
    .values(reason=sa.bindparam("new_reason"), receipt=sa.bindparam("new_receipt"))
)
_EXPIRED_COLUMNS = (*_RECEIPT_COLUMNS, "created_at", "expires_at")
"""What the sweep's UPDATE returns of each request it expires: for its reason and receipt."""


async def expire_overdue(
    session: AsyncSession, *, now: datetime | None = None, batch: int = 500
) -> list[str]:
    """Expire pending requests past their deadline; safe to run on every replica at once."""
    now = now or utcnow()
    overdue = (
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
                col(ConfirmationRequest.id).in_(sa.select(chosen_once(overdue).c.id)),
                col(ConfirmationRequest.status).in_(_sources(Status.EXPIRED)),
            )
            .values(status=Status.EXPIRED.value, **decided_columns(EXPIRY, EXPIRED_REASON, now))
            .returning(*(_REQUESTS.c[name] for name in _EXPIRED_COLUMNS))
            .execution_options(synchronize_session=False)
        )
    ).all()
    requests = {
        str(r[0]): from_row(ConfirmationRequest, dict(zip(_EXPIRED_COLUMNS, r, strict=True))) for r in rows
    }
    reasons: dict[str, str] = {}
    for rid, req in requests.items():
        _observe(
            session,
            rid,
            Status.EXPIRED,
            now,
            req.created_at,
            agent=req.agent_id,
            tool=req.tool_name,
            gate=gate_names(req.gate, req.gates),
            who=EXPIRY.id,
        )
        reasons[rid] = expiry_reason(req)
    expired = sorted(reasons)
    if expired:
        # These rows are this transaction's now (expired by it): each gets its own words and
        # receipt.
        receipts = await sign_decisions(
            session,
            [_decided(requests[rid]) for rid in expired],
            Status.EXPIRED.value,
            actor=EXPIRY,
            reason=reasons,
            decided_at=now,
        )
        await session.exec(
            _SET_REASON,
            params=[
                {"rid": rid, "new_reason": reasons[rid], "new_receipt": receipts[rid]} for rid in expired
            ],
        )
        for rid in expired:
            written = decided_columns(EXPIRY, reasons[rid], now)
            _keep_loaded(session, rid, {"status": Status.EXPIRED.value, **written, "receipt": receipts[rid]})
    for rid in expired:
        await audit.append(
            session, audit.Action.EXPIRED, actor=EXPIRY, request_id=rid, detail={"reason": reasons[rid]}
        )
        await queue_updates(session, rid)
    await _mark_decided(session, expired, now)
    return expired


async def expire(session: AsyncSession, req: ConfirmationRequest, *, now: datetime) -> None:
    """Expire the (locked) ``req``, past its deadline (:func:`transition` brings it up to date)."""
    await transition(session, req.id, Status.EXPIRED, actor=EXPIRY, reason=expiry_reason(req), now=now)


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
    changes = [{"field": name, "approved": value} for name, value in approved_changes(req).items()]
    text = describe_request(
        {
            "id": req.id,
            "status": Status(req.status).value,
            "reason": req.reason,
            "decided_by": decided_by,
            "changes": changes,
        }
    )
    if req.status == Status.APPROVED:
        return HookResult(decision=Decision.ALLOW, reason=text, request_id=req.id)
    return HookResult.deny(text, request_id=req.id)


def held(session: AsyncSession, request_id: str) -> ConfirmationRequest | None:
    """The session's copy of request ``request_id``, if it holds one: as this transaction
    wrote it (every write of the state machine keeps it so), never to be read again."""
    sync = session.sync_session
    found = sync.identity_map.get(sync.identity_key(ConfirmationRequest, request_id))
    return found if isinstance(found, ConfirmationRequest) else None


def _keep_loaded(session: AsyncSession, request_id: str, written: Mapping[str, Any]) -> None:
    """Keep the session's copy of request ``request_id`` (:func:`held`) as this transaction
    wrote it (``written``)."""
    loaded = held(session, request_id)
    if loaded is not None:
        for name, value in written.items():
            set_committed_value(loaded, name, value)
