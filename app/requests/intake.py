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
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import REQUEST_CREATED, SignoffConfig
from signoff.app.db import dialect_of, emit, insert_ignoring, transaction
from signoff.app.deliveries import owed_delivery, queue_deliveries
from signoff.app.models import ConfirmationRequest, Status
from signoff.app.redaction import redact
from signoff.app.requests import grants
from signoff.app.requests.activity import gate_names, log_after_commit
from signoff.app.requests.canonical import call_digest
from signoff.app.requests.eligibility import GateSnapshot, recorded
from signoff.app.requests.kernel import idempotency_key
from signoff.app.requests.receipts import digest_of_call
from signoff.app.requests.reminders import scheduled
from signoff.app.requests.states import DECIDED_COLUMNS
from signoff.hooks import HookContext

__all__ = ["Intake", "NewRequest", "held_by", "new_request", "write_new_requests"]

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
        found = await held_by(session, agent_id, key)
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
    for n in new:
        row = n.row
        gate = gate_names(row.get("gate"), row.get("gates"))
        log_after_commit(
            session, "request created", n.id, agent=row["agent_id"], tool=row["tool_name"], gate=gate
        )
    if new:
        created = max(n.row["created_at"] for n in new)
        emit(session, REQUEST_CREATED, [n.id for n in new], now=created)
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


async def held_by(session: AsyncSession, agent_id: str, key: str) -> ConfirmationRequest | None:
    """The request of ``agent_id`` holding idempotency key ``key``, if one does."""
    stmt = select(ConfirmationRequest).where(
        col(ConfirmationRequest.agent_id) == agent_id, col(ConfirmationRequest.idempotency_key) == key
    )
    return (await session.exec(stmt)).one_or_none()


def new_request(
    ctx: HookContext, matched: Sequence[tuple[str, ConfirmationGate]], config: SignoffConfig, *, now: datetime
) -> NewRequest:
    """The request asking ``matched`` (each with its key) about the call ``ctx``, made at ``now``."""
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
        "idempotency_key": idempotency_key(ctx),
        "call_digest": call_digest(ctx.tool_name, ctx.arguments),
        # Over the arguments as sent: what the decision receipt will name (the stored ones are redacted).
        "action_digest": digest_of_call(
            ctx.agent_id, ctx.tool_name, ctx.arguments, ctx.session_id, config.version
        ),
        "request_metadata": redact(dict(ctx.metadata), words),
        "gates": gates,
        "config_version": config.version,
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
    later = scheduled(row["id"], now, row["expires_at"], [g for _, g in matched], snapshots, config)
    return NewRequest(
        row,
        detail,
        cards=tuple(ch for ch in channels if not config.is_web(ch)),
        later=later,
        gates=tuple(snapshots),
    )


def _recorded(
    key: str, gate: ConfirmationGate, arguments: Mapping[str, Any], config: SignoffConfig
) -> tuple[GateSnapshot, dict[str, object]]:
    """The gate as a request for a call with ``arguments`` records it: typed, and as stored."""
    snapshot, stored = recorded(key, gate, config)
    digests = grants.argument_digests(gate, arguments)
    if not digests:
        return snapshot, dict(stored)
    return snapshot.model_copy(update={"argument_digests": digests}), {**stored, "argument_digests": digests}
