"""Units of work: what a transaction owes its commit runs after the commit, never after a rollback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Actor
from signoff.app.db import on_commit, transaction
from signoff.app.models import ConfirmationRequest, Status
from signoff.app.requests.states import transition
from signoff.app.runtime import Runtime
from tests.app.factories import make_request

pytestmark = pytest.mark.postgres


class Boom(Exception):
    pass


Work = Callable[[AsyncSession], Awaitable[object]]


async def _failing(runtime: Runtime, work: Work) -> None:
    """A unit of work that does ``work`` and then fails (so it rolls back)."""
    async with transaction(runtime.sessions) as s:
        await work(s)
        raise Boom


async def _failing_savepoint(s: AsyncSession, work: Work) -> None:
    async with s.begin_nested():
        await work(s)
        raise Boom


async def test_callbacks_run_once_the_transaction_has_committed(runtime: Runtime) -> None:
    ran: list[str] = []
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
        on_commit(s, lambda: ran.append("first"))
        on_commit(s, lambda: ran.append("second"))
        assert ran == []  # not before the commit
    assert ran == ["first", "second"]
    async with runtime.reads() as r:
        # By the time they run, what the transaction wrote can be read by anyone.
        assert (
            await r.exec(select(ConfirmationRequest.id).where(col(ConfirmationRequest.id) == req.id))
        ).one()


async def test_callbacks_registered_first_run_ahead_in_their_order_even_from_a_savepoint(
    runtime: Runtime,
) -> None:
    """Waking the waiting agents is registered ``first``: it runs before the logs and metrics
    registered earlier in the transaction; a first from a rolled-back savepoint never runs."""
    ran: list[str] = []
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
        on_commit(s, lambda: ran.append("log"))
        on_commit(s, lambda: ran.append("wake"), first=True)
        async with s.begin_nested():
            on_commit(s, lambda: ran.append("wake from a savepoint"), first=True)

        async def work(s: AsyncSession) -> None:
            on_commit(s, lambda: ran.append("rolled back wake"), first=True)

        with pytest.raises(Boom):
            await _failing_savepoint(s, work)
        on_commit(s, lambda: ran.append("metrics"))
    assert ran == ["wake", "wake from a savepoint", "log", "metrics"]


async def test_a_task_woken_first_answers_before_the_other_callbacks_run(runtime: Runtime) -> None:
    """Through transaction(): the agent woken at the commit has its turn before the logs and
    metrics its transaction owes, and those still run before transaction() returns."""
    ran: list[str] = []
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def agent() -> None:
        await woken
        ran.append("agent answered")

    waiting = asyncio.create_task(agent())
    await asyncio.sleep(0)
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
        on_commit(s, lambda: ran.append("log"))
        on_commit(s, lambda: (ran.append("wake"), woken.set_result(None)), first=True)
    assert ran == ["wake", "agent answered", "log"]
    await waiting


async def test_callbacks_never_run_after_a_rollback(runtime: Runtime) -> None:
    ran: list[str] = []

    async def work(s: AsyncSession) -> None:
        await make_request(s, runtime.config)
        on_commit(s, lambda: ran.append("rolled back"))

    with pytest.raises(Boom):
        await _failing(runtime, work)
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
    assert ran == []


async def test_a_savepoint_rolled_back_drops_only_its_own_callbacks(runtime: Runtime) -> None:
    ran: list[str] = []
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
        on_commit(s, lambda: ran.append("outer"))

        async def work(s: AsyncSession) -> None:
            on_commit(s, lambda: ran.append("rolled back savepoint"))

        with pytest.raises(Boom):
            await _failing_savepoint(s, work)
        async with s.begin_nested():
            async with s.begin_nested():
                on_commit(s, lambda: ran.append("released savepoint"))
            on_commit(s, lambda: ran.append("its outer savepoint"))
        assert ran == []  # releasing a savepoint commits nothing yet
    assert ran == ["outer", "released savepoint", "its outer savepoint"]


async def test_a_released_savepoint_owes_nothing_if_the_transaction_rolls_back(runtime: Runtime) -> None:
    ran: list[str] = []

    async def work(s: AsyncSession) -> None:
        await make_request(s, runtime.config)
        async with s.begin_nested():
            on_commit(s, lambda: ran.append("released savepoint"))

    with pytest.raises(Boom):
        await _failing(runtime, work)
    assert ran == []


async def test_a_session_closed_without_committing_owes_nothing_to_its_next_transaction(
    runtime: Runtime,
) -> None:
    ran: list[str] = []
    session = runtime.sessions()
    await make_request(session, runtime.config)
    on_commit(session, lambda: ran.append("abandoned"))
    await session.close()
    await make_request(session, runtime.config)
    await session.commit()
    await session.close()
    assert ran == []


async def test_a_failing_callback_leaves_the_commit_and_the_other_callbacks_alone(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def fails() -> None:
        raise Boom("the callback's own failure")

    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
        on_commit(s, fails)
        on_commit(s, lambda: ran.append("after the failure"))
    assert ran == ["after the failure"]
    assert "a callback after commit failed" in caplog.text
    async with runtime.reads() as r:
        assert (
            await r.exec(select(ConfirmationRequest.id).where(col(ConfirmationRequest.id) == req.id))
        ).one()


async def test_a_callback_needs_a_transaction(runtime: Runtime) -> None:
    session = runtime.sessions()
    with pytest.raises(RuntimeError, match="outside a transaction"):
        on_commit(session, lambda: None)
    await session.close()


async def test_a_decision_wakes_its_waiters_at_commit_and_a_rolled_back_one_never(runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
    woken, _ = runtime.hub.subscribe(req.id)
    runtime.outbox_wake.clear()

    async def approve(s: AsyncSession) -> bool:
        return await transition(s, req.id, Status.APPROVED, actor=Actor("web", "alice"))

    try:
        with pytest.raises(Boom):
            await _failing(runtime, approve)
        await asyncio.sleep(0)
        assert not woken.done()
        assert not runtime.outbox_wake.is_set()

        async with transaction(runtime.sessions) as s:
            assert await approve(s)
            await asyncio.sleep(0)
            assert not woken.done()  # the decision is not committed yet
            assert not runtime.outbox_wake.is_set()
        assert woken.done()
        assert runtime.outbox_wake.is_set()  # the card's redraw is owed
    finally:
        runtime.hub.unsubscribe(req.id, woken)


async def test_a_new_request_wakes_the_outbox_at_commit(runtime: Runtime) -> None:
    runtime.outbox_wake.clear()
    with pytest.raises(Boom):
        await _failing(runtime, lambda s: make_request(s, runtime.config))
    assert not runtime.outbox_wake.is_set()
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
        assert not runtime.outbox_wake.is_set()
    assert runtime.outbox_wake.is_set()
