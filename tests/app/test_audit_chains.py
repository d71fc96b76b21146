"""The audit log's chains: every kind of tampering is found by ``verify_chain``, and writers
in different transactions take different chains without waiting on one another."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import CHAINS, Action, Actor, Entry, verify_chain
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, AuditHead
from signoff.app.runtime import Runtime

pytestmark = pytest.mark.postgres  # row locks, SKIP LOCKED, timestamps after a round trip

PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
EV = AuditEvent.__table__  # type: ignore[attr-defined]
HEAD = AuditHead.__table__  # type: ignore[attr-defined]


async def _write_log(runtime: Runtime, transactions: int = 8, per: int = 3) -> list[AuditEvent]:
    """``transactions`` units of work of ``per`` events each, two at a time (on PostgreSQL they
    overlap, so they hold different chains); every event, chain by chain."""

    async def one(i: int) -> None:
        async with transaction(runtime.sessions) as s:
            for j in range(per):
                await audit.append(
                    s, Action.TOOL_CALL, actor=Actor("agent", f"a{i}"), detail={"i": i, "j": j, "ü": "ß"}
                )
                await asyncio.sleep(0)

    for start in range(0, transactions, 2):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 2, transactions))))
    async with runtime.sessions() as s:
        stmt = select(AuditEvent).order_by(col(AuditEvent.chain), col(AuditEvent.chain_seq))
        return list((await s.exec(stmt)).all())


async def _verify_tampered(runtime: Runtime, tamper: Callable[[AsyncSession], Awaitable[Any]]) -> Any:
    """``verify_chain`` after ``tamper`` in the same transaction, which is then rolled back."""
    async with runtime.sessions() as s:
        try:
            await tamper(s)
            return await verify_chain(s)
        finally:
            await s.rollback()


async def test_an_untouched_log_of_several_chains_verifies(runtime: Runtime) -> None:
    events = await _write_log(runtime)
    assert len({e.chain for e in events}) > 1
    async with runtime.sessions() as s:
        assert await verify_chain(s) == (len(events), None)
    # One transaction's events are in one chain, in order.
    by_tx: dict[str, set[int]] = {}
    for e in events:
        by_tx.setdefault(str(e.actor_id), set()).add(e.chain)
    assert all(len(chains) == 1 for chains in by_tx.values())


KINDS = [
    "edit",
    "edit_time",
    "delete",
    "swap_in_chain",
    "swap_across_chains",
    "truncate",
    "drop_chain",
    "move",
]


@PROPERTY
@given(data=st.data())
async def test_each_kind_of_tampering_is_detected(runtime: Runtime, data: st.DataObject) -> None:
    async with runtime.sessions() as s:
        events = list(
            (
                await s.exec(select(AuditEvent).order_by(col(AuditEvent.chain), col(AuditEvent.chain_seq)))
            ).all()
        )
    if not events:
        events = await _write_log(runtime)
    chains: dict[int, list[AuditEvent]] = {}
    for e in events:
        chains.setdefault(e.chain, []).append(e)
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    victim = data.draw(st.sampled_from(events), label="event")
    mine = chains[victim.chain]
    by_seq = EV.c.seq == victim.seq

    async def tamper(s: AsyncSession) -> None:
        if kind == "edit":
            field = data.draw(
                st.sampled_from(["detail", "action", "actor_name", "request_id"]), label="field"
            )
            value = {"detail": {"i": -1}, "action": "vote", "actor_name": "Mallory", "request_id": "r" * 32}[
                field
            ]
            await s.exec(sa.update(EV).where(by_seq).values({field: value}))
        elif kind == "edit_time":
            await s.exec(sa.update(EV).where(by_seq).values(created_at=victim.created_at.replace(year=2001)))
        elif kind == "delete":
            await s.exec(sa.delete(EV).where(by_seq))
        elif kind == "swap_in_chain":
            other = data.draw(
                st.sampled_from([e for e in mine if e.seq != victim.seq] or [victim]), label="other"
            )
            if other is victim:  # a chain of one event: move it behind itself instead
                await s.exec(sa.update(EV).where(by_seq).values(chain_seq=2))
                return
            await _swap(s, victim, other)
        elif kind == "swap_across_chains":
            others = [e for e in events if e.chain != victim.chain]
            await _swap(s, victim, data.draw(st.sampled_from(others), label="other"))
        elif kind == "truncate":
            n = data.draw(st.integers(1, len(mine)), label="n")
            await s.exec(sa.delete(EV).where(EV.c.seq.in_([e.seq for e in mine[-n:]])))
        elif kind == "drop_chain":
            await s.exec(sa.delete(EV).where(EV.c.chain == victim.chain))
            await s.exec(sa.delete(HEAD).where(HEAD.c.id == victim.chain))
        else:  # move to an empty chain
            empty = next(c for c in range(1, CHAINS + 1) if c not in chains)
            await s.exec(sa.update(EV).where(by_seq).values(chain=empty, chain_seq=1))

    count, broken = await _verify_tampered(runtime, tamper)
    assert broken is not None, (kind, victim.seq)
    assert count < len(events)
    async with runtime.sessions() as s:
        assert (await verify_chain(s))[1] is None, "the rollback left the log as it was"


async def _swap(s: AsyncSession, a: AuditEvent, b: AuditEvent) -> None:
    """Exchange two events' places (chain and number within it)."""
    await s.exec(sa.update(EV).where(EV.c.seq == a.seq).values(chain_seq=-1))
    await s.exec(sa.update(EV).where(EV.c.seq == b.seq).values(chain=a.chain, chain_seq=a.chain_seq))
    await s.exec(sa.update(EV).where(EV.c.seq == a.seq).values(chain=b.chain, chain_seq=b.chain_seq))


async def test_a_head_added_or_rewound_is_named(runtime: Runtime) -> None:
    events = await _write_log(runtime, transactions=2)
    chain = events[-1].chain

    async def rewind(s: AsyncSession) -> None:
        await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(seq=HEAD.c.seq + 1))

    _, broken = await _verify_tampered(runtime, rewind)
    assert broken is not None
    assert f"chain {chain}'s head says" in broken.problem

    async def add(s: AsyncSession) -> None:
        await s.exec(sa.insert(HEAD).values(id=CHAINS + 1, seq=0, last_hash=audit.GENESIS))

    _, broken = await _verify_tampered(runtime, add)
    assert broken is not None
    assert "does not exist" in broken.problem


async def test_events_committed_after_the_heads_were_read_are_left_for_the_next_check(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event committed after ``verify_chain`` read the heads (with its head moved, as every
    append does) is not counted and not an error; one past its head with the head left as it
    was was not appended by a transaction, and is named."""
    events = await _write_log(runtime, transactions=2)
    chain = events[0].chain
    async with runtime.sessions() as s:
        head = (await s.exec(select(AuditHead).where(col(AuditHead.id) == chain))).one()
    walk = audit._events

    def committed_meanwhile(move_head: bool) -> Callable[..., Any]:
        async def events_after(s: AsyncSession, batch: int = 1000) -> Any:
            await s.exec(
                sa.insert(EV).values(
                    chain=chain,
                    chain_seq=head.seq + 1,
                    action="tool_call",
                    detail={},
                    created_at=events[0].created_at,
                    prev_hash=head.last_hash,
                    hash="y" * 64,
                )
            )
            if move_head:
                await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(seq=head.seq + 1))
            async for ev in walk(s, batch):
                yield ev

        return events_after

    async def nothing(s: AsyncSession) -> None:
        return None

    monkeypatch.setattr(audit, "_events", committed_meanwhile(move_head=True))
    assert await _verify_tampered(runtime, nothing) == (len(events), None)
    monkeypatch.setattr(audit, "_events", committed_meanwhile(move_head=False))
    count, broken = await _verify_tampered(runtime, nothing)
    assert count == len(events)
    assert broken is not None
    assert broken.problem == (
        f"chain {chain} event {head.seq + 1} is past its chain's head ({head.seq} events) (added)"
    )


async def test_overlapping_writers_take_different_chains_without_waiting(runtime: Runtime) -> None:
    """Ten transactions hold their chain at once; each appends without waiting for another
    (on SQLite, one writer at a time, they run one after another)."""
    if runtime.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    held = asyncio.Event()
    took: list[int] = []
    ready = 0

    async def writer(i: int) -> None:
        nonlocal ready
        async with transaction(runtime.sessions) as s:
            await audit.append_many(s, [Entry(Action.TOOL_CALL, detail={"i": i})])
            await audit.append(s, Action.TOOL_CALL, detail={"i": i, "again": True})
            took.append(s.info["signoff.audit_chain"][1])
            ready += 1
            if ready == 10:
                held.set()
            await held.wait()  # every one holds its chain until all have appended

    await asyncio.wait_for(asyncio.gather(*(writer(i) for i in range(10))), 20)
    assert len(set(took)) == 10
    async with runtime.sessions() as s:
        assert await verify_chain(s) == (20, None)
        rows = (await s.exec(select(AuditEvent.chain, AuditEvent.chain_seq))).all()
    assert sorted(rows) == sorted((c, n) for c in took for n in (1, 2))
