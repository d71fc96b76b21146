"""Plain factory functions for tests."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig
from signoff.app.models import ConfirmationRequest, Delivery, Status, utcnow
from signoff.app.requests.gate import GateService
from signoff.hooks import HookContext


async def make_request(
    session: AsyncSession,
    config: SignoffConfig,
    *,
    tool: str = "pay_invoice",
    arguments: dict[str, Any] | None = None,
    agent: str = "finance-bot",
    user_id: str | None = None,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> ConfirmationRequest:
    """A pending request created the way the gate creates it (row, audit event, outbox rows),
    at ``now`` (default: the clock's)."""
    gates = [g for g in config.agents[agent].hooks if isinstance(g, ConfirmationGate)]
    ctx = HookContext(
        agent_id=agent,
        tool_name=tool,
        arguments=arguments or {"amount": 100000},
        user_id=user_id,
        idempotency_key=idempotency_key,
    )
    gate = next(g for g in gates if g.matches(ctx))
    approvals = GateService(session, config, agent, now=now)
    await approvals.ask(ctx, gate)
    assert approvals.request is not None
    return approvals.request


async def make_row(session: AsyncSession, *, status: Status, expires_in: float = 600) -> ConfirmationRequest:
    """A bare request row in any status (for walking the transition table)."""
    now = utcnow()
    req = ConfirmationRequest(
        id=uuid.uuid4().hex,
        agent_id="finance-bot",
        tool_name="t",
        arguments={},
        gate={"quorum": 1},
        channel="chat",
        status=status,
        created_at=now,
        expires_at=now + timedelta(seconds=expires_in),
    )
    session.add(req)
    session.add(Delivery(request_id=req.id, channel="chat", kind="post"))
    await session.flush()
    await audit.append(session, audit.Action.CREATED, actor=Actor("test"), request_id=req.id)
    return req
