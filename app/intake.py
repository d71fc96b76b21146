"""New requests: the server side of the confirmation gate.

A gated call becomes a pending :class:`ConfirmationRequest`, its ``created``
audit event and, for a chat channel, the outbox's ``post`` delivery — all
committed before the agent hears ``pending``. An idempotency key already used
by the agent answers with the request that holds it instead (a replay), and
never for a different call, nor for the same call on behalf of someone else.

One call writes a request: :meth:`Intake.create_request`, as part of the call's
unit of work. Calls that arrive together are written together (group commit):
the intake writes whatever calls are waiting in one transaction of a few
multi-row statements, so a busy server pays for one transaction and one turn
of the audit chain's head-row lock per batch rather than per call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit, edits, grants, webhooks
from signoff.app.audit import Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig, identity_key
from signoff.app.db import dialect_of, insert_ignoring, transaction
from signoff.app.deliveries import owed_delivery, queue_deliveries
from signoff.app.eligibility import EscalationStep, GateSnapshot, gates_of
from signoff.app.models import ConfirmationRequest, Grant, Status, from_row, utcnow
from signoff.app.redaction import redact
from signoff.app.single_use import spent
from signoff.app.state_machine import DECIDED_COLUMNS, decision_for
from signoff.hooks import Decision, HookContext, HookResult

__all__ = ["Approvals", "Intake", "NewRequest", "write_new_requests"]

MAX_BATCH = 256
"""Calls written in one transaction at most."""

_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
_IDEMPOTENCY_KEY = ("agent_id", "idempotency_key")
_UNDECIDED = dict.fromkeys(DECIDED_COLUMNS)


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request ready to be written: its row (every column), the ``created`` event's details
    and the channels owed its card."""

    row: dict[str, Any]
    detail: dict[str, Any]
    cards: tuple[str, ...] = ()
    """Channels to post the card to: the gates' channels but those of type ``web``, whose
    requests are shown and decided in Signoff itself."""
    later: tuple[dict[str, Any], ...] = ()
    """The outbox rows due later: the gates' reminders and escalations, earliest first."""
    gates: tuple[GateSnapshot, ...] = ()
    """The row's ``gates``, typed."""

    @property
    def id(self) -> str:
        return str(self.row["id"])


async def write_new_requests(
    session: AsyncSession, batch: Sequence[NewRequest]
) -> list[ConfirmationRequest | None]:
    """Write ``batch`` in the caller's transaction.

    For each entry: None if its request was written, or the existing request that
    already holds its idempotency key.
    """
    # A key already taken (by an earlier call, or by one earlier in this batch) inserts
    # nothing and returns no id.
    insert = insert_ignoring(dialect_of(session), _REQUESTS, _IDEMPOTENCY_KEY)
    result = await session.exec(insert, params=[n.row for n in batch])
    written = {str(r[0]) for r in result.all()}
    answers: list[ConfirmationRequest | None] = []
    for n in batch:
        if n.id in written:
            answers.append(None)
            continue
        # The key is taken: a replay, or the same call raced itself in; answer with the
        # request that won.
        agent_id, key = n.row["agent_id"], n.row["idempotency_key"]
        found = (
            await session.exec(
                select(ConfirmationRequest).where(
                    col(ConfirmationRequest.agent_id) == agent_id,
                    col(ConfirmationRequest.idempotency_key) == key,
                )
            )
        ).one_or_none()
        if found is None:
            raise RuntimeError(f"idempotency key {key!r} is taken, yet no request holds it")
        answers.append(found)
    new = [n for n in batch if n.id in written]
    # The posts first: a channel's card is its first card row (an escalation to a channel
    # that already has the card replies under it).
    await queue_deliveries(
        session,
        [owed_delivery(n.id, ch, "post", n.row["created_at"]) for n in new for ch in n.cards]
        + [row for n in new for row in n.later],
    )
    if new:
        created = max(n.row["created_at"] for n in new)
        webhooks.owe(session, webhooks.REQUEST_CREATED, [n.id for n in new], now=created)
    # The audit events last: on PostgreSQL the head row is locked until commit.
    await audit.append_many(
        session,
        [audit.Entry(audit.Action.CREATED, Actor("agent", n.row["agent_id"]), n.id, n.detail) for n in new],
    )
    return answers


def _isolate(exc: BaseException) -> bool:
    """Whether a failed batch is worth writing again one call at a time: the error may lie
    with one call's data, not with the database being unreachable."""
    if isinstance(exc, sa.exc.DataError | sa.exc.IntegrityError):
        return True
    return not isinstance(exc, sa.exc.DBAPIError | sa.exc.TimeoutError | OSError)


_Waiting = tuple[NewRequest, "asyncio.Future[ConfirmationRequest | None]"]


class Intake:
    """Writes new requests (see the module's description).

    The first call to arrive starts a writer; calls arriving while it writes wait
    for the next batch. An idle server writes a lone call at once, so nothing
    waits for a batch to fill. When a batch fails with an error that may belong
    to one call (a value the database refuses), its calls are written again one
    by one, so each gets its own answer. Without ``sessions`` (tests, tools), each
    request is written in its call's unit of work alone.
    """

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession] | None = None, *, max_batch: int = MAX_BATCH
    ) -> None:
        self._sessions = sessions
        self._max_batch = max_batch
        self._queue: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None

    async def create_request(self, session: AsyncSession, new: NewRequest) -> ConfirmationRequest | None:
        """Write ``new`` as part of the call's unit of work ``session``: None, or the request
        that already holds its idempotency key.

        Either way the request is committed by the time the call's unit of work has. While
        that unit of work has written nothing, the request is written with the other calls'
        arriving at once in one transaction of the intake's, committed before this returns:
        nothing else of the call's is in it, so nothing is left for the call to commit.
        Once it has begun (a rate limit took a token), the request is written in it: a
        transaction of the intake's would wait for its locks (on SQLite, its connection).
        """
        if self._sessions is None or session.in_transaction():
            return (await write_new_requests(session, [new]))[0]
        future: asyncio.Future[ConfirmationRequest | None] = asyncio.get_running_loop().create_future()
        self._queue.append((new, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(self._sessions))
        return await future

    async def _drain(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        await asyncio.sleep(0)  # let calls already under way join the first batch
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            try:
                await self._write(sessions, batch)
            finally:
                for _, future in batch:
                    if not future.done():
                        future.cancel()

    async def _write(self, sessions: async_sessionmaker[AsyncSession], batch: list[_Waiting]) -> None:
        try:
            async with transaction(sessions) as session:
                answers = await write_new_requests(session, [n for n, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and _isolate(exc):
                for item in batch:
                    await self._write(sessions, [item])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)


class Approvals:
    """The server side of the confirmation gate for one call (see :class:`signoff.hooks.HookServices`).

    A gate with an active grant covering the call lets it on at once (the grant is recorded
    in ``granted``; its use is counted once every hook has allowed the call, see
    :meth:`signoff.app.hook_services.ServerHookServices.conclude`). Otherwise one request asks
    every matching gate without such a grant. Its request is written by ``intake`` as part of the
    call's unit of work ``session``; grants are looked up in ``reads`` (default: ``session``).
    """

    def __init__(
        self,
        session: AsyncSession,
        config: SignoffConfig,
        *,
        intake: Intake | None = None,
        reads: async_sessionmaker[AsyncSession] | None = None,
        now: datetime | None = None,
    ) -> None:
        self._session = session
        self._config = config
        self._intake = intake or Intake()
        self._reads = reads
        self._now = now
        self.created: ConfirmationRequest | None = None
        self.request: ConfirmationRequest | None = None
        self.gates: list[GateSnapshot] = []
        """The gates of ``request``, typed (read once)."""
        self._grants: dict[str, Grant] | None = None
        self.granted: dict[str, Grant] = {}
        """The grants that let this call through their gates, by gate key, in the order used."""
        self._edited: tuple[dict[str, Any], dict[str, Any]] | None = None
        """Answered with the approver's changes: the call's arguments, and those it runs with."""

    @staticmethod
    def idempotency_key(ctx: HookContext) -> str | None:
        if ctx.idempotency_key:
            return ctx.idempotency_key
        if ctx.session_id and ctx.tool_call_id:
            return f"{ctx.session_id}:{ctx.tool_call_id}"
        return None

    def _replay(
        self,
        found: ConfirmationRequest,
        digest: str,
        key: str,
        arguments: Mapping[str, Any],
        ctx: HookContext,
    ) -> HookResult:
        """The answer for gate ``key`` from the request already holding the call's key."""
        if found.call_digest != digest:
            # Never let an approval for one call stand in for another.
            return HookResult.deny(
                f"idempotency key {found.idempotency_key!r} was already used for a different call "
                f"(request {found.id}); send a new key for a new call"
            )
        if not _same_user(found.user_id, ctx.user_id, self._config):
            # Its approvers decided a call made on someone else's behalf (and may not approve
            # one made on their own).
            return HookResult.deny(
                f"idempotency key {found.idempotency_key!r} was already used for a call on behalf of "
                f"another user (request {found.id}); send a new key for a new call"
            )
        if self.request is not found:
            self.request, self.gates = found, gates_of(found)
        if key not in {g.key for g in self.gates}:
            # Its approval never asked this gate (the configuration changed since, or a grant
            # that stood in for it has ended).
            return HookResult.deny(
                f"gate {key!r} was not asked in request {found.id} under idempotency key "
                f"{found.idempotency_key!r}; send a new key to ask every gate again",
                request_id=found.id,
            )
        answer = decision_for(found)
        if answer.decision is Decision.ALLOW:
            if (why := spent(found, self._now)) is not None:
                return HookResult.deny(why, request_id=found.id)
            # Approved with changes: the call runs as approved.
            modified = edits.modified_arguments(found, arguments)
            if modified is not None:
                # Earlier gates of the chain saw the call as proposed: every gate that was not
                # asked is asked of the call as approved, in this replay's context.
                if (
                    why := edits.replay_refusal(found, ctx.with_arguments(modified), self._config)
                ) is not None:
                    return HookResult.deny(why, request_id=found.id)
                self._edited = (dict(arguments), modified)
                return replace(answer, modified_arguments=modified)
        return answer

    async def _active_grants(
        self, ctx: HookContext, matched: list[tuple[str, ConfirmationGate]]
    ) -> dict[str, Grant]:
        """The active grant covering the call for each matching gate that has one (looked up
        once per call, and only when a matching gate offers grants)."""
        if self._grants is None:
            if not any(gate.grants for _, gate in matched):
                self._grants = {}
            elif self._reads is None or self._session.in_transaction():
                self._grants = await grants.find_for_call(
                    self._session, ctx, matched, self._config, now=self._now
                )
            else:
                async with self._reads() as session:
                    self._grants = await grants.find_for_call(
                        session, ctx, matched, self._config, now=self._now
                    )
        return self._grants

    def _matching(self, ctx: HookContext, gate: ConfirmationGate) -> list[tuple[str, ConfirmationGate]]:
        """Every confirmation gate of the agent that matches the call (``gate`` among them),
        in the order they run, with the keys requests record them by."""
        keyed = self._config.confirmation_gates(ctx.agent_id)
        if not any(g is gate for _, g in keyed):
            return [(gate.label, gate)]  # a gate from outside the configuration asks alone
        return [(key, g) for key, g in keyed if g is gate or _matches(g, ctx)]

    def _prepare(
        self,
        ctx: HookContext,
        gate: ConfirmationGate,
        matched: list[tuple[str, ConfirmationGate]] | None = None,
    ) -> NewRequest:
        """The request ``gate`` asks for: one for every gate that matches the call."""
        config = self._config
        matched = matched or self._matching(ctx, gate)
        now = self._now or utcnow()
        words = config.redact_words(ctx.agent_id)
        recorded = [_recorded(key, gate, ctx.arguments, config) for key, gate in matched]
        snapshots = [snapshot for snapshot, _ in recorded]
        gates = [stored for _, stored in recorded]
        first = matched[0][1]
        row: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "agent_id": ctx.agent_id,
            "tool_name": ctx.tool_name,
            "arguments": redact(dict(ctx.arguments), words),
            "user_id": ctx.user_id,
            "session_id": ctx.session_id,
            "tool_call_id": ctx.tool_call_id,
            "idempotency_key": self.idempotency_key(ctx),
            "call_digest": call_digest(ctx.tool_name, ctx.arguments),
            "request_metadata": redact(dict(ctx.metadata), words),
            "gate": {**gates[0], "config_version": config.version},
            "gates": gates,
            "channel": first.channel,
            "requester": config.recognise(ctx.user_id) or ctx.user_id,
            "created_at": now,
            # The shortest deadline of the gates: each gate's approvers get no more than theirs.
            "expires_at": now + min(gate.timeout for _, gate in matched),
            "status": Status.PENDING,
            **_UNDECIDED,
        }
        detail = {
            "tool": ctx.tool_name,
            "gate": first.label,
            "gates": [s.name for s in snapshots],
            "channel": first.channel,
            "user_id": ctx.user_id,
            "config_version": config.version,
        }
        channels = dict.fromkeys(gate.channel for _, gate in matched)
        later = _later(row["id"], now, row["expires_at"], [g for _, g in matched], snapshots, config)
        return NewRequest(
            row,
            detail,
            cards=tuple(ch for ch in channels if not config.is_web(ch)),
            later=later,
            gates=tuple(snapshots),
        )

    async def request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        """One request for every gate the call matches: the first gate to ask makes it (or
        finds the one its idempotency key holds); each later gate's answer is that request's."""
        assert isinstance(gate, ConfirmationGate)
        matched = self._matching(ctx, gate)
        key = next(k for k, g in matched if g is gate)
        active = await self._active_grants(ctx, matched)
        if key in active:
            grant = self.granted[key] = active[key]
            return HookResult(decision=Decision.ALLOW, reason=grants.describe(grant))
        digest = call_digest(ctx.tool_name, ctx.arguments)
        if self.request is not None:
            # A later gate of this same call (an Approvals serves one call): the earlier gate
            # let the call on by this request, which holds every gate that matched (the call
            # as approved, when the approver changed it).
            arguments = ctx.arguments
            if self._edited is not None and self._edited[1] == dict(ctx.arguments):
                arguments = self._edited[0]
                digest = call_digest(ctx.tool_name, arguments)
            return self._replay(self.request, digest, key, arguments, ctx)
        for _, other in matched:
            # A gate that cannot evaluate its condition denies the call rather than asking
            # (this gate checked its own before asking).
            if other is not gate and (refused := await other.refusal(ctx)) is not None:
                return refused
        # A grant stands in for its own gate only: the request asks every other gate.
        new = self._prepare(ctx, gate, [(k, g) for k, g in matched if k not in active])
        found = await self._intake.create_request(self._session, new)
        if found is not None:
            return self._replay(found, digest, key, ctx.arguments, ctx)
        req = from_row(ConfirmationRequest, new.row)
        self.created = self.request = req
        self.gates = list(new.gates)
        where = ", ".join(dict.fromkeys(g.channel for _, g in matched))
        return HookResult(
            decision=Decision.PENDING,
            reason=f"waiting for approval in {where} (request {req.id})",
            request_id=req.id,
        )


def _same_user(recorded: str | None, given: str | None, config: SignoffConfig) -> bool:
    """Whether ``given`` (a replay's ``user_id``) names whoever ``recorded`` (the request's) did:
    the same id in any spelling, or two ids of one person of the directory."""
    if identity_key(recorded or "") == identity_key(given or ""):
        return True
    person = config.recognise(recorded)
    return person is not None and person == config.recognise(given)


def _matches(gate: ConfirmationGate, ctx: HookContext) -> bool:
    try:
        return gate.matches(ctx)
    except Exception:
        return True  # a gate that cannot tell asks its approvers (fail closed)


def _later(
    request_id: str,
    now: datetime,
    expires_at: datetime,
    gates: Sequence[ConfirmationGate],
    snapshots: Sequence[GateSnapshot],
    config: SignoffConfig,
) -> tuple[dict[str, Any], ...]:
    """The outbox rows of the gates' reminders (under a card: none on a ``web`` channel) and
    escalations that fall before the request expires, earliest first."""
    rows: list[tuple[datetime, dict[str, Any]]] = []
    for i, (gate, snapshot) in enumerate(zip(gates, snapshots, strict=True)):
        if not config.is_web(gate.channel):
            for j, point in enumerate(gate.remind):
                due = now + point.due(gate.timeout)
                rows.append((due, owed_delivery(request_id, gate.channel, "remind", due, gate=i, step=j)))
        for j, step in enumerate(snapshot.escalations):
            due = now + timedelta(seconds=step.after_seconds)
            rows.append((due, owed_delivery(request_id, step.channel, "escalate", due, gate=i, step=j)))
    rows.sort(key=lambda r: r[0])
    return tuple(row for due, row in rows if due < expires_at)


_Recorded = tuple[ConfirmationGate, GateSnapshot, dict[str, object]]
_RECORDED: weakref.WeakKeyDictionary[SignoffConfig, dict[str, _Recorded]] = weakref.WeakKeyDictionary()
"""Per configuration, by gate key: each gate as requests record it but for the call's argument
digests (made once; a configuration never changes, a reload makes a new one)."""


def _recorded(
    key: str, gate: ConfirmationGate, arguments: Mapping[str, Any], config: SignoffConfig
) -> tuple[GateSnapshot, dict[str, object]]:
    """The gate as a request for a call with ``arguments`` records it: typed, and as stored."""
    made = _RECORDED.setdefault(config, {})
    entry = made.get(key)
    if entry is None or entry[0] is not gate:
        snapshot = _snapshot(key, gate, config)
        entry = made[key] = (gate, snapshot, snapshot.stored())
    _, snapshot, stored = entry
    digests = grants.argument_digests(gate, arguments)
    if not digests:
        return snapshot, dict(stored)
    return snapshot.model_copy(update={"argument_digests": digests}), {**stored, "argument_digests": digests}


def _snapshot(key: str, gate: ConfirmationGate, config: SignoffConfig) -> GateSnapshot:
    """The gate as requests record it (with the grants it offers, its escalations earliest
    first, the names of everyone it may ask and the configuration's version), but for the
    call's argument digests."""
    steps = sorted(gate.escalate, key=lambda e: e.after)
    everyone = [*gate.approvers, *(a for e in steps for a in e.approvers)]
    return GateSnapshot(
        key=key,
        name=gate.label,
        channel=gate.channel,
        approvers=gate.approvers,
        quorum=gate.quorum,
        allow_self_approval=gate.allow_self_approval,
        require_reject_reason=gate.require_reject_reason,
        timeout_seconds=gate.timeout.total_seconds(),
        approval_valid_for_seconds=gate.approval_valid_for.total_seconds(),
        grants=tuple(offer.choice for offer in gate.grants),
        editable=gate.editable,
        escalations=tuple(
            EscalationStep(after_seconds=e.after.total_seconds(), channel=e.channel, approvers=e.approvers)
            for e in steps
        ),
        names={a: config.display_name(a) for a in everyone},
        config_version=config.version,
    )


def call_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    body = json.dumps([tool_name, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()
