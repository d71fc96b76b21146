"""The server side of the built-in hooks (:class:`signoff.hooks.HookServices`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.intake import Approvals
from signoff.app.models import RateBucket, Switch, utcnow
from signoff.app.redaction import redact
from signoff.hooks import HookContext, HookResult

if TYPE_CHECKING:
    from signoff.app.runtime import Runtime

__all__ = ["ServerHookServices", "is_switch_on", "set_switch"]


async def is_switch_on(session: AsyncSession, name: str) -> bool:
    on = (await session.exec(select(Switch.on).where(col(Switch.name) == name))).first()
    return bool(on)


async def set_switch(
    session: AsyncSession, name: str, *, on: bool, actor: Actor, reason: str | None = None
) -> Switch:
    """Turn a switch on or off (audited); creates it on first use."""
    row = (await session.exec(select(Switch).where(col(Switch.name) == name).with_for_update())).first()
    if row is None:
        row = Switch(name=name)
        session.add(row)
    previous = row.on
    row.on, row.updated_at, row.updated_by, row.reason = on, utcnow(), actor.name or actor.id, reason
    await audit.append(
        session,
        "switch_changed",
        actor=actor,
        detail={"switch": name, "on": on, "was": previous, "reason": reason},
    )
    return row


class ServerHookServices:
    """Writes go to the call's ``session`` (new requests through the runtime's intake
    while that session has not begun); reads of switches take a reading session, so a
    guard alone never starts the call's write transaction."""

    def __init__(self, session: AsyncSession, runtime: Runtime, agent_id: str) -> None:
        config = runtime.config
        self._session = session
        self._reads = runtime.reads
        self.approvals = Approvals(session, config, intake=runtime.intake)
        extra = config.agents[agent_id].redact if agent_id in config.agents else ()
        self._redact = config.redact | frozenset(w.lower() for w in extra)

    async def request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        return await self.approvals.request_approval(ctx, gate)

    async def is_switch_on(self, name: str) -> bool:
        if self._session.in_transaction():
            return await is_switch_on(self._session, name)
        async with self._reads() as session:
            return await is_switch_on(session, name)

    async def take_token(self, bucket: str, *, capacity: float, refill_per_second: float) -> float:
        session, now = self._session, utcnow()
        stmt = select(RateBucket).where(col(RateBucket.key) == bucket).with_for_update()
        row = (await session.exec(stmt)).first()
        if row is None:
            try:
                async with session.begin_nested():
                    session.add(RateBucket(key=bucket, tokens=capacity - 1, updated_at=now))
                    await session.flush()
                return 0.0
            except IntegrityError:  # another replica made the bucket first
                row = (await session.exec(stmt)).one()
        elapsed = max(0.0, (now - row.updated_at).total_seconds())
        tokens = min(capacity, row.tokens + elapsed * refill_per_second)
        row.updated_at = now
        if tokens >= 1:
            row.tokens = tokens - 1
            return 0.0
        row.tokens = tokens
        return (1 - tokens) / refill_per_second

    def redact(self, value: Any) -> Any:
        return redact(value, self._redact)

    async def record(self, ctx: HookContext, action: str, detail: Mapping[str, Any]) -> None:
        await audit.append(
            self._session,
            action,
            actor=Actor("agent", ctx.agent_id),
            detail=redact(dict(detail), self._redact),
        )
