"""The server side of the built-in hooks (:class:`signoff.hooks.HookServices`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DataError, IntegrityError
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.db import UNAVAILABLE
from signoff.app.models import RateBucket, utcnow
from signoff.app.redaction import redact
from signoff.app.requests import grants
from signoff.app.requests.intake import Approvals
from signoff.app.switches import is_switch_on
from signoff.hooks import Decision, HookContext, HookResult, ServiceUnavailable

if TYPE_CHECKING:
    from signoff.app.runtime import Runtime

__all__ = ["ServerHookServices"]

log = logging.getLogger("signoff")


@contextmanager
def _reachable() -> Iterator[None]:
    """Turn "the database cannot be reached" into :class:`ServiceUnavailable`, which the hook
    registry lets through (the agent is told to retry) instead of denying the call."""
    try:
        yield
    except DataError:
        raise  # a value the database refuses: the hook fails, the call is denied
    except UNAVAILABLE as exc:
        raise ServiceUnavailable(f"the database is unavailable ({type(exc).__name__})") from exc


class _GrantEnded(Exception):
    """A grant the call rested on was revoked or expired before its use was counted."""


class ServerHookServices:
    """Writes go to the call's ``session`` (new requests through the runtime's intake
    while that session has not begun); reads of switches take a reading session, so a
    guard alone never starts the call's write transaction."""

    def __init__(self, session: AsyncSession, runtime: Runtime, agent_id: str) -> None:
        config = runtime.config
        self._session = session
        self._reads = runtime.reads
        self.approvals = Approvals(session, config, intake=runtime.intake, reads=runtime.reads)
        self._redact = config.redact_words(agent_id)
        self._unsettled: asyncio.Task[HookResult] | None = None

    async def request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        # The write runs in a task of its own that the gate's timeout cannot cut short. Were
        # it cancelled, the request and its card post could be committed all the same (the
        # intake writes batches in a transaction of its own) while the agent hears "deny":
        # state and answer would disagree. Cancelling the committed request instead would
        # take a second write, which can fail or lose the race to an approver's click. So
        # once a request is being written its outcome is the answer: a timeout leaves the
        # write to `settle`, which the route awaits before answering.
        task = asyncio.ensure_future(self._request_approval(ctx, gate))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._unsettled = task
            raise

    async def _request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        with _reachable():
            return await self.approvals.request_approval(ctx, gate)

    async def settle(self) -> HookResult | None:
        """The answer of a request write that outlived its hook's timeout, once it has ended.

        None when there was none, or when the write failed for a reason other than the
        database being unavailable (nothing was written, so the timeout's deny stands).
        Raises :class:`ServiceUnavailable` when the database could not be reached.
        """
        task, self._unsettled = self._unsettled, None
        if task is None:
            return None
        try:
            return await task
        except ServiceUnavailable:
            raise
        except Exception:
            log.exception("writing a new request failed after its hook timed out")
            return None

    @property
    def grant_id(self) -> str | None:
        """The grant the call was allowed by (the first, when grants stood in for several gates)."""
        return next((g.id for g in self.approvals.granted.values()), None)

    async def conclude(self, ctx: HookContext, result: HookResult) -> HookResult:
        """The answer once every hook has run. An allow that grants let through their gates
        uses them: each grant's row is checked again as the use is counted (audited
        ``grant_used``), so one revoked on any replica meanwhile denies instead."""
        used = self.approvals.granted
        if result.decision is not Decision.ALLOW or not used:
            return result
        with _reachable():
            ended = await self._use_grants(ctx)
        if ended is not None:
            self.approvals.granted = {}
            return HookResult.deny(
                f"grant {ended} ended (revoked or expired) as the call was answered; "
                "call again to ask for approval",
                request_id=result.request_id,
            )
        reasons = [grants.describe(g) for g in used.values()]
        if result.reason:
            reasons.insert(0, result.reason)
        return replace(result, reason="; ".join(reasons))

    async def _use_grants(self, ctx: HookContext) -> str | None:
        """Count a use of every grant the call rests on; the id of one that had ended (then no
        use of any is counted)."""
        detail = {"tool": ctx.tool_name, "session_id": ctx.session_id, "tool_call_id": ctx.tool_call_id}
        used = list(self.approvals.granted.items())
        if len(used) == 1:
            key, grant = used[0]
            done = await grants.use(self._session, grant, agent=ctx.agent_id, detail={**detail, "gate": key})
            return None if done else grant.id
        try:
            async with self._session.begin_nested():
                for key, grant in used:
                    if not await grants.use(
                        self._session, grant, agent=ctx.agent_id, detail={**detail, "gate": key}
                    ):
                        raise _GrantEnded(grant.id)
        except _GrantEnded as exc:
            return str(exc)
        return None

    async def is_switch_on(self, name: str) -> bool:
        with _reachable():
            if self._session.in_transaction():
                return await is_switch_on(self._session, name)
            async with self._reads() as session:
                return await is_switch_on(session, name)

    async def take_token(self, bucket: str, *, capacity: float, refill_per_second: float) -> float:
        with _reachable():
            return await self._take_token(bucket, capacity=capacity, refill_per_second=refill_per_second)

    async def _take_token(self, bucket: str, *, capacity: float, refill_per_second: float) -> float:
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
        with _reachable():
            await audit.append(
                self._session,
                Action(action),
                actor=Actor("agent", ctx.agent_id),
                detail=redact(dict(detail), self._redact),
            )
