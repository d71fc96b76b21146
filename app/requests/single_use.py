"""One approval, one call.

An approval covers the exact call it was asked for (its ``call_digest``), once: replays of the
call's idempotency key answer ``allow`` until the call is reported executed
(``POST /v1/hooks/post-tool-use`` with the same key) or until the gates'
``approval_valid_for`` (the shortest of them; 10 minutes unless configured) has passed since
the decision, whichever comes first; after that they deny, saying which. Lapse is computed
from ``decided_at`` on each replay, so nothing has to sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.metrics import EXECUTED_MISMATCHES
from signoff.app.models import ConfirmationRequest, Status, utcnow
from signoff.app.requests.edits import same_call
from signoff.app.requests.eligibility import gates_of
from signoff.app.requests.receipts import issue_execution
from signoff.channels import duration_text

__all__ = ["DEFAULT_VALID_FOR", "record_executed", "spent", "valid_for"]

DEFAULT_VALID_FOR = timedelta(minutes=10)
_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]


def valid_for(req: ConfirmationRequest) -> timedelta:
    """How long after its decision the request's approval allows its call: the shortest of its
    gates' ``approval_valid_for``."""
    seconds = [g.approval_valid_for_seconds for g in gates_of(req)]
    known = [timedelta(seconds=s) for s in seconds if s is not None and s > 0]
    return min(known) if len(known) == len(seconds) else min([DEFAULT_VALID_FOR, *known])


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def spent(req: ConfirmationRequest, now: datetime | None = None) -> str | None:
    """Why the approval of ``req`` (approved) allows nothing more, or None while it still does."""
    if req.status != Status.APPROVED:
        return None
    if req.executed_at is not None:
        return (
            f"the approval of request {req.id} was used: the call was reported executed at "
            f"{_when(req.executed_at)}; a new call needs a new idempotency key (and a new approval)"
        )
    if req.decided_at is None:
        return None
    window = valid_for(req)
    if (now or utcnow()) >= req.decided_at + window:
        return (
            f"the approval of request {req.id} lapsed at {_when(req.decided_at + window)} "
            f"({duration_text(int(window.total_seconds()))} after the decision) before the call was "
            "reported executed; a new call needs a new idempotency key (and a new approval)"
        )
    return None


_APPROVED_UNEXECUTED = select(col(ConfirmationRequest.id)).where(
    col(ConfirmationRequest.agent_id) == sa.bindparam("agent_id"),
    col(ConfirmationRequest.idempotency_key) == sa.bindparam("key"),
    col(ConfirmationRequest.status) == Status.APPROVED.value,
    col(ConfirmationRequest.executed_at).is_(None),
)


async def record_executed(
    session: AsyncSession,
    reads: async_sessionmaker[AsyncSession],
    *,
    agent_id: str,
    key: str | None,
    tool_name: str,
    arguments: Mapping[str, Any],
    redact: Callable[[Any], Any],
    now: datetime | None = None,
    result: Any = None,
    error: str | None = None,
    session_id: str | None = None,
) -> dict[str, Any] | None:
    """Record that the approved call holding ``key`` ran (once: a second report changes
    nothing), audited ``executed`` with the arguments it ran with (redacted), and also
    ``executed_mismatch`` (counted in ``/metrics``) when those are not the approved ones; sign
    its execution receipt (over the arguments as sent and ``result``). The receipt, or None
    when the report closed no request."""
    if key is None:
        return None
    params = {"agent_id": agent_id, "key": key}
    # The usual post-tool-use (a call no approval was asked for) only reads.
    async with reads() as look:
        if (await look.exec(_APPROVED_UNEXECUTED, params=params)).first() is None:
            return None
    now = now or utcnow()
    shown = redact(dict(arguments))
    r = _REQUESTS.c
    row = (
        await session.exec(
            sa.update(_REQUESTS)
            .where(
                r.agent_id == agent_id,
                r.idempotency_key == key,
                r.status == Status.APPROVED.value,
                r.executed_at.is_(None),
            )
            .values(executed_at=now, executed_arguments=shown)
            .returning(r.id, r.arguments, r.approved_arguments, r.receipt, r.config_version, r.gate)
        )
    ).first()
    if row is None:
        return None  # another report (or replica) recorded it first
    request_id, proposed, approved = str(row[0]), row[1], row[2]
    decision = row[3] if isinstance(row[3], dict) else None
    actor = Actor("agent", agent_id)
    entries = [audit.Entry(Action.EXECUTED, actor, request_id, {"tool": tool_name, "arguments": shown})]
    mismatch = not same_call(proposed, approved, shown)
    if mismatch:
        # Run otherwise than approved: the approval is used all the same, and it is on record.
        entries.append(
            audit.Entry(
                Action.EXECUTED_MISMATCH,
                actor,
                request_id,
                {
                    "tool": tool_name,
                    "proposed": proposed,
                    "approved": approved if approved is not None else proposed,
                    "executed": shown,
                },
            )
        )
        EXECUTED_MISMATCHES.labels(agent_id).inc()
    decided: dict[str, Any] = decision.get("payload", {}) if decision else {}
    version = decided.get("policy_version") or row[4] or (row[5] or {}).get("config_version")
    receipt = await issue_execution(
        session,
        request_id=request_id,
        agent=agent_id,
        tool=tool_name,
        arguments=arguments,
        result=result,
        error=error,
        # The approved call's session: the report names the call by its key.
        session_id=decided.get("session", session_id),
        decision_receipt=decision,
        policy_version=version,
        approved_digest=decided.get("approved_digest"),
        mismatch=mismatch,
        executed_at=now,
    )
    await audit.append_many(session, entries)
    return receipt
