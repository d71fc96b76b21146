"""The gate service: the server side of the built-in hooks for one call
(:class:`signoff.hooks.HookServices`).

A confirmation gate asks :meth:`GateService.request_approval`: the first gate of a call
reads the call's :class:`~signoff.app.requests.kernel.Snapshot` (the request holding its
idempotency key and the grants covering it, in one reading unit of work) and asks the kernel;
every gate of the call is answered from that one answer. Once every hook has run the route
hands the chain's result to :meth:`GateService.conclude`, which applies the kernel's answer:
it writes the new request the answer asks for, or counts the use of the grants an allow rests
on. A deny from any hook is final, and a write that outlives its time limit is never the answer:
the call is denied, naming the gate, and the write finishes on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig
from signoff.app.db import UNAVAILABLE
from signoff.app.models import ConfirmationRequest, Grant, RateBucket, from_row, utcnow
from signoff.app.redaction import redact
from signoff.app.requests import grants
from signoff.app.requests.canonical import call_digest
from signoff.app.requests.eligibility import GateSnapshot, gates_of
from signoff.app.requests.intake import Intake, held_by, new_request
from signoff.app.requests.kernel import Answer, KeyedGate, Snapshot, decide, idempotency_key, same_user
from signoff.app.switches import is_switch_on
from signoff.hooks import DEFAULT_HOOK_TIMEOUT, Decision, HookContext, HookResult, ServiceUnavailable

if TYPE_CHECKING:
    from signoff.app.runtime import Runtime

__all__ = ["CutShort", "GateService"]

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


class CutShort(Exception):
    """The call's own unit of work was cut short (a hook's time limit struck in the middle of
    one of its statements): it must be rolled back, and the call is answered ``result``."""

    def __init__(self, result: HookResult) -> None:
        super().__init__(result.reason)
        self.result = result


class _Late(Exception):
    """A write outlived its time limit: the call is answered ``result`` (a deny)."""

    def __init__(self, result: HookResult) -> None:
        super().__init__(result.reason)
        self.result = result


class _GrantEnded(Exception):
    """A grant the call rested on was revoked or expired before its use was counted."""


class GateService:
    """The server side of the built-in hooks for one call of ``agent_id``.

    Writes go to the call's unit of work ``session`` (new requests through ``intake`` while
    that unit of work has not begun); reads take a unit of work of ``reads`` (default:
    ``session``), so a gate or a guard alone never starts the call's write transaction. A write
    the gate service makes once the hooks have run takes at most ``time_limit`` seconds.
    """

    def __init__(
        self,
        session: AsyncSession,
        config: SignoffConfig,
        agent_id: str,
        *,
        intake: Intake | None = None,
        reads: async_sessionmaker[AsyncSession] | None = None,
        time_limit: float = DEFAULT_HOOK_TIMEOUT,
        now: datetime | None = None,
    ) -> None:
        self._session = session
        self._config = config
        self._intake = intake or Intake()
        self._reads = reads
        self._time_limit = time_limit
        self._now = now
        self._redact = config.redact_words(agent_id)
        self._call: HookContext | None = None
        self._matched: Sequence[KeyedGate] = ()
        self._snapshot: Snapshot | None = None
        self._cut_short = False
        self.answer: Answer | None = None
        """The kernel's answer for the call (once a confirmation gate has asked)."""
        self.request: ConfirmationRequest | None = None
        """The request the answer rests on."""
        self.created: ConfirmationRequest | None = None
        """The request this call wrote (it has no votes)."""
        self.gates: list[GateSnapshot] = []
        """The gates of ``request``, typed (read once)."""
        self.granted: dict[str, Grant] = {}
        """The grants whose use this call counted, by gate key."""

    @classmethod
    def for_call(
        cls, session: AsyncSession, runtime: Runtime, agent_id: str, *, time_limit: float
    ) -> GateService:
        return cls(
            session,
            runtime.config,
            agent_id,
            intake=runtime.intake,
            reads=runtime.reads,
            time_limit=time_limit,
        )

    @property
    def grant_id(self) -> str | None:
        """The grant the call was allowed by (the first, when grants stood in for several gates)."""
        return next((g.id for g in self.granted.values()), None)

    # -- the confirmation gate --------------------------------------------------------------

    async def request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        """The kernel's answer for the call ``gate`` is one of the gates of (see the module)."""
        if self.answer is None:
            assert isinstance(gate, ConfirmationGate)
            matched = self._matching(ctx, gate)
            with self._watched(mine=self._session.in_transaction()):
                snapshot = await self._read_snapshot(ctx, matched)
            self._call, self._matched, self._snapshot = ctx, matched, snapshot
            self._adopt(decide(ctx, matched, snapshot, self._config))
        assert self.answer is not None
        return _result(self.answer)

    async def ask(self, ctx: HookContext, gate: ConfirmationGate) -> HookResult:
        """The gate alone, answered and applied (for tools and tests: a chain of one gate)."""
        return await self.conclude(ctx, await self.request_approval(ctx, gate))

    def _adopt(self, answer: Answer) -> None:
        self.answer = answer
        if answer.request is not None and answer.request is not self.request:
            self.request, self.gates = answer.request, gates_of(answer.request)

    def _matching(self, ctx: HookContext, gate: ConfirmationGate) -> list[KeyedGate]:
        """Every confirmation gate of the agent that matches the call (``gate`` among them),
        in the order they run, with the keys requests record them by."""
        keyed = self._config.confirmation_gates(ctx.agent_id)
        if not any(g is gate for _, g in keyed):
            return [(gate.label, gate)]  # a gate from outside the configuration asks alone
        return [(key, g) for key, g in keyed if g is gate or _matches(g, ctx)]

    async def _read_snapshot(self, ctx: HookContext, matched: Sequence[KeyedGate]) -> Snapshot:
        """What the database holds for the call. Without a gate offering grants nothing is
        read: the write that claims the call's key finds the request holding it, if any."""
        now = self._now or utcnow()
        if not any(gate.grants for _, gate in matched):
            return Snapshot(now)
        key = idempotency_key(ctx)
        with _reachable():
            if self._reads is None or self._session.in_transaction():
                return await _read(self._session, ctx, key, matched, self._config, now)
            async with self._reads() as session:
                return await _read(session, ctx, key, matched, self._config, now)

    # -- once every hook has run ------------------------------------------------------------

    async def conclude(self, ctx: HookContext, result: HookResult) -> HookResult:
        """The call's answer once every hook has run and answered ``result``: the kernel's
        answer applied (see the module).

        Raises :class:`CutShort` when a statement of the call's unit of work was cut short,
        by a hook's time limit or by this one's; the unit of work must then be rolled back.
        """
        if self._cut_short:
            raise CutShort(result if result.decision is Decision.DENY else _cut_short())
        answer = self.answer
        if answer is None or result.decision is Decision.DENY:
            return result
        try:
            if answer.ask and result.decision is Decision.PENDING:
                answer = await self._write_request(answer)
                # The request written, or the one that held the key, answers; the arguments
                # the hooks rewrote stand unless the approver changed them.
                result = replace(
                    _result(answer),
                    modified_arguments=(
                        answer.modified_arguments
                        if answer.modified_arguments is not None
                        else result.modified_arguments
                    ),
                )
                if answer.decision is not Decision.ALLOW:
                    return result
            if result.decision is not Decision.ALLOW:
                return result
            if answer.grants:
                async with self._within_limit("count the use of its grant", in_call=True):
                    ended = await self._use_grants(ctx, answer.grants)
                if ended is not None:
                    return HookResult.deny(
                        f"grant {ended} ended (revoked or expired) as the call was answered; "
                        "call again to ask for approval",
                        request_id=answer.request_id,
                    )
                self.granted = dict(answer.grants)
        except _Late as late:
            return late.result
        return replace(result, reason=answer.reason or result.reason, request_id=answer.request_id)

    async def _write_request(self, answer: Answer) -> Answer:
        """Write the request ``answer`` asks for; the kernel's answer again over the request
        holding the call's key, when one already did."""
        call, snapshot = self._call, self._snapshot
        assert call is not None
        assert snapshot is not None
        asked = [(key, gate) for key, gate in self._matched if key in answer.ask]
        new = new_request(call, asked, self._config, now=snapshot.now)
        # Written by the intake in a transaction of its own unless the call's has begun.
        async with self._within_limit("record its request", in_call=self._session.in_transaction()):
            with _reachable():
                found = await self._intake.create_request(self._session, new)
        if found is not None:
            self._adopt(decide(call, self._matched, replace(snapshot, request=found), self._config))
            assert self.answer is not None
            return self.answer
        req = from_row(ConfirmationRequest, new.row)
        self.created = self.request = req
        self.gates = list(new.gates)
        where = ", ".join(dict.fromkeys(gate.channel for _, gate in asked))
        self.answer = replace(
            answer, request=req, reason=f"waiting for approval in {where} (request {req.id})"
        )
        return self.answer

    @asynccontextmanager
    async def _within_limit(self, what: str, *, in_call: bool) -> AsyncIterator[None]:
        """At most the time limit; past it the call is denied, naming the gate. Work in the
        call's unit of work is cut short (:class:`CutShort`: it is rolled back); a request the
        intake writes in a transaction of its own is written all the same, but never answers
        this call (a retry under the same key finds it)."""
        try:
            async with asyncio.timeout(self._time_limit):
                yield
        except TimeoutError:
            gate = self._matched[0][1].label if self._matched else "confirmation gate"
            denied = HookResult.deny(f"gate {gate!r} could not {what} within {self._time_limit:g}s")
            if in_call:
                raise CutShort(denied) from None
            raise _Late(denied) from None

    async def _use_grants(self, ctx: HookContext, used: Mapping[str, Grant]) -> str | None:
        """Count a use of every grant the call rests on; the id of one that had ended (then no
        use of any is counted)."""
        detail = {"tool": ctx.tool_name, "session_id": ctx.session_id, "tool_call_id": ctx.tool_call_id}
        with _reachable():
            if len(used) == 1:
                ((key, grant),) = used.items()
                done = await grants.use(
                    self._session, grant, agent=ctx.agent_id, detail={**detail, "gate": key}
                )
                return None if done else grant.id
            try:
                async with self._session.begin_nested():
                    for key, grant in used.items():
                        if not await grants.use(
                            self._session, grant, agent=ctx.agent_id, detail={**detail, "gate": key}
                        ):
                            raise _GrantEnded(grant.id)
            except _GrantEnded as exc:
                return str(exc)
            return None

    @contextmanager
    def _watched(self, *, mine: bool) -> Iterator[None]:
        """Note a statement of the call's unit of work (``mine``) cut short by a hook's time limit."""
        try:
            yield
        except asyncio.CancelledError:
            self._cut_short = self._cut_short or mine
            raise

    # -- the other built-in hooks -----------------------------------------------------------

    async def is_switch_on(self, name: str) -> bool:
        with _reachable(), self._watched(mine=self._session.in_transaction()):
            if self._reads is None or self._session.in_transaction():
                return await is_switch_on(self._session, name)
            async with self._reads() as session:
                return await is_switch_on(session, name)

    async def take_token(
        self, bucket: str, *, capacity: float, refill_per_second: float, call: HookContext | None = None
    ) -> float:
        with _reachable(), self._watched(mine=True):
            if call is not None and await self._asked_before(call):
                return 0.0
            return await self._take_token(bucket, capacity=capacity, refill_per_second=refill_per_second)

    async def _asked_before(self, call: HookContext) -> bool:
        """Whether ``call`` is a gated call sent before under its idempotency key: a gate of the
        agent catches it now, and the request holding the key was made for this very call on
        behalf of the same user. The same call again takes no second token; any other pays."""
        key = idempotency_key(call)
        if key is None or not any(
            _matches(g, call) for _, g in self._config.confirmation_gates(call.agent_id)
        ):
            return False
        held = await held_by(self._session, call.agent_id, key)
        return (
            held is not None
            and held.call_digest == call_digest(call.tool_name, call.arguments)
            and same_user(held.user_id, call.user_id, self._config)
        )

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
        with _reachable(), self._watched(mine=True):
            await audit.append(
                self._session,
                Action(action),
                actor=Actor("agent", ctx.agent_id),
                detail=redact(dict(detail), self._redact),
            )


def _result(answer: Answer) -> HookResult:
    """The kernel's answer as a gate of the call answers it."""
    return HookResult(
        decision=answer.decision,
        reason=answer.reason,
        request_id=answer.request_id,
        modified_arguments=answer.modified_arguments,
    )


def _cut_short() -> HookResult:
    return HookResult.deny("a hook was cut short by its time limit; call again")


def _matches(gate: ConfirmationGate, ctx: HookContext) -> bool:
    try:
        return gate.matches(ctx)
    except Exception:
        return True  # a gate that cannot tell asks its approvers (fail closed)


async def _read(
    session: AsyncSession,
    ctx: HookContext,
    key: str | None,
    matched: Sequence[KeyedGate],
    config: SignoffConfig,
    now: datetime,
) -> Snapshot:
    found = await grants.find_for_call(session, ctx, matched, config, now=now)
    request = await held_by(session, ctx.agent_id, key) if key is not None else None
    return Snapshot(now, request=request, grants=found)
