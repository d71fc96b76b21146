"""Tampering with the audit log after real traffic, in the database, is found by ``signoff
audit verify`` (one line naming what is wrong, exit 1), on SQLite and PostgreSQL.

The traffic goes through the HTTP API: requests created by an agent, approved and rejected
by an operator, a call reported executed. Then rows are changed with SQL as someone with
write access to the database (but without the server's keys) would change them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor, event_hash, verify_chain
from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, AuditHead
from signoff.app.runtime import Runtime
from tests.cli import signoff
from tests.conftest import in_process_http
from tests.redteam.support import POST, agent, attack_config, decide, pending, send

pytestmark = pytest.mark.postgres

EV = AuditEvent.__table__  # type: ignore[attr-defined]
HEAD = AuditHead.__table__  # type: ignore[attr-defined]


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


class _TwoChains:
    """Stands in for ``random`` in :mod:`signoff.app.audit`: writers start at chain 1 or 2, so
    each chain holds events of several transactions and requests (as on a busy server)."""

    def __init__(self) -> None:
        self.n = 0

    def randint(self, a: int, b: int) -> int:
        self.n += 1
        return 1 + self.n % 2


@pytest.fixture(autouse=True)
def _two_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "random", _TwoChains())


async def _traffic(runtime: Runtime, key: str) -> None:
    """Requests approved, rejected and one reported executed, through the HTTP API."""
    async with in_process_http(runtime) as http:
        for i in range(4):
            call = send(1000 + i)
            rid = await pending(http, key, call)
            verdict = "approve" if i % 2 == 0 else "reject"
            assert (await decide(http, rid, verdict=verdict)).status_code == 200
            if verdict == "approve":
                r = await http.post(POST, json={**call, "result": "paid"}, headers=agent(key))
                assert r.status_code == 200, r.text


async def _chains(runtime: Runtime) -> dict[int, list[AuditEvent]]:
    async with runtime.sessions() as s:
        stmt = select(AuditEvent).order_by(col(AuditEvent.chain), col(AuditEvent.chain_seq))
        events = list((await s.exec(stmt)).all())
    chains: dict[int, list[AuditEvent]] = {}
    for e in events:
        chains.setdefault(e.chain, []).append(e)
    return chains


async def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``signoff ARGS`` on the database (in a thread: the command runs its own event loop)."""
    env = {"SIGNOFF_DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}
    return await asyncio.to_thread(signoff, *args, env=env)


async def _verify(db_url: str) -> tuple[int, str]:
    """``signoff audit verify`` on the database: its exit code and its output."""
    done = await _cli(db_url, "audit", "verify")
    return done.returncode, done.stdout + done.stderr


async def _tamper(runtime: Runtime, change: Callable[[AsyncSession], Awaitable[Any]]) -> None:
    async with transaction(runtime.sessions) as s:
        await change(s)


def _rehash(ev: AuditEvent, prev: str, **changes: Any) -> dict[str, Any]:
    """The row of ``ev`` with ``changes``, linked to ``prev`` and hashed as the server does."""
    row = {
        "request_id": ev.request_id,
        "action": ev.action,
        "actor_channel": ev.actor_channel,
        "actor_id": ev.actor_id,
        "actor_name": ev.actor_name,
        "detail": ev.detail,
        "created_at": ev.created_at,
        **changes,
    }
    digest = event_hash(
        seq=ev.chain_seq,
        prev_hash=prev,
        request_id=row["request_id"],
        action=row["action"],
        actor=Actor(row["actor_channel"] or "", row["actor_id"], row["actor_name"]),
        detail=row["detail"],
        created_at=row["created_at"],
    )
    return {**row, "prev_hash": prev, "hash": digest}


async def test_an_untouched_log_after_traffic_verifies(runtime: Runtime, agent_key: str, db_url: str) -> None:
    await _traffic(runtime, agent_key)
    total = sum(len(c) for c in (await _chains(runtime)).values())
    code, out = await _verify(db_url)
    assert code == 0, out
    assert out.strip() == f"audit chain intact: {total} events"


async def test_a_forged_event_beyond_its_head_is_found(runtime: Runtime, agent_key: str, db_url: str) -> None:
    """An event added past a chain's head (the head left as it was) is not one a transaction
    appended: a transaction moves the head in the same commit, so once the event is visible
    its head counts it. It must not pass as "committed after the heads were read"."""
    await _traffic(runtime, agent_key)
    chains = await _chains(runtime)
    chain, events = next(iter(chains.items()))
    last = events[-1]

    async def forge(s: AsyncSession) -> None:
        await s.exec(
            sa.insert(EV).values(
                chain=chain,
                chain_seq=last.chain_seq + 1,
                **_rehash(last, last.hash, action="approved", actor_name="Alice Liu"),
            )
        )

    await _tamper(runtime, forge)
    code, out = await _verify(db_url)
    assert code == 1, out
    assert out.count("\n") == 1, out
    assert f"chain {chain} event {last.chain_seq + 1}" in out
    assert "head" in out


async def test_a_truncated_tail_with_its_count_lowered_is_found_by_the_heads_hash(
    runtime: Runtime, agent_key: str, db_url: str
) -> None:
    """The last event deleted and the head's count lowered, its last hash left: the head no
    longer ends where the chain does."""
    await _traffic(runtime, agent_key)
    chain, events = max((await _chains(runtime)).items(), key=lambda c: len(c[1]))
    last = events[-1]

    async def truncate(s: AsyncSession) -> None:
        await s.exec(sa.delete(EV).where(EV.c.seq == last.seq))
        await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(seq=HEAD.c.seq - 1))

    await _tamper(runtime, truncate)
    code, out = await _verify(db_url)
    assert code == 1, out
    assert out.count("\n") == 1, out
    assert f"chain {chain}'s head" in out
    assert "last hash" in out


async def test_the_last_event_edited_and_rehashed_is_found_by_the_heads_hash(
    runtime: Runtime, agent_key: str, db_url: str
) -> None:
    await _traffic(runtime, agent_key)
    chain, events = max((await _chains(runtime)).items(), key=lambda c: len(c[1]))
    last = events[-1]

    async def edit(s: AsyncSession) -> None:
        row = _rehash(last, last.prev_hash, actor_name="Mallory")
        await s.exec(sa.update(EV).where(EV.c.seq == last.seq).values(**row))

    await _tamper(runtime, edit)
    code, out = await _verify(db_url)
    assert code == 1, out
    assert f"chain {chain}'s head" in out
    assert "last hash" in out


async def test_a_rewritten_chain_is_found_against_an_anchor_taken_before(
    runtime: Runtime, agent_key: str, db_url: str, tmp_path: Any
) -> None:
    """The hashes are not keyed: whoever writes the database can edit an event and rehash
    its chain from there, head included, and the log alone cannot tell. An anchor (each
    chain's length and last hash, kept outside the database) taken before can."""
    await _traffic(runtime, agent_key)
    anchor = await _cli(db_url, "audit", "anchor")
    assert anchor.returncode == 0, anchor.stderr
    path = tmp_path / "anchor.json"
    path.write_text(anchor.stdout)
    assert (await _cli(db_url, "audit", "verify", "--anchor", str(path))).returncode == 0

    async with in_process_http(runtime) as http:  # more traffic after the anchor is fine
        rid = await pending(http, agent_key, send(5000))
        assert (await decide(http, rid)).status_code == 200
    done = await _cli(db_url, "audit", "verify", "--anchor", str(path))
    assert done.returncode == 0, done.stderr
    assert "anchor" in done.stdout

    chain, events = max((await _chains(runtime)).items(), key=lambda c: len(c[1]))
    anchored = json.loads(path.read_text())["chains"][str(chain)]["seq"]
    victim = events[0]

    async def rewrite(s: AsyncSession) -> None:
        prev = victim.prev_hash
        for i, ev in enumerate(events):
            row = _rehash(ev, prev, **({"actor_name": "Mallory"} if i == 0 else {}))
            await s.exec(sa.update(EV).where(EV.c.seq == ev.seq).values(**row))
            prev = row["hash"]
        await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(last_hash=prev))

    await _tamper(runtime, rewrite)
    code, _ = await _verify(db_url)
    assert code == 0, "without an anchor, a chain rewritten with its head verifies (stated limit)"
    done = await _cli(db_url, "audit", "verify", "--anchor", str(path))
    assert done.returncode == 1, done.stdout
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"chain {chain}" in done.stderr
    assert "anchor" in done.stderr

    async def truncate(s: AsyncSession) -> None:  # below the anchor, head and all
        await s.exec(sa.delete(EV).where(EV.c.chain == chain))
        await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(seq=0, last_hash="0" * 64))

    await _tamper(runtime, truncate)
    assert (await _verify(db_url))[0] == 0
    done = await _cli(db_url, "audit", "verify", "--anchor", str(path))
    assert done.returncode == 1
    assert f"chain {chain}" in done.stderr
    assert f"{anchored}" in done.stderr


@pytest.mark.parametrize(
    "kind",
    [
        "edit_detail",
        "edit_actor",
        "edit_time",
        "move_request",
        "swap_order",
        "delete_middle",
        "delete_tail",
        "delete_request_events",
        "delete_head",
        "edit_head",
        "reinsert_old",
    ],
)
async def test_each_tampering_after_traffic_is_one_line_and_exit_1(
    runtime: Runtime, agent_key: str, db_url: str, kind: str
) -> None:
    await _traffic(runtime, agent_key)
    chains = await _chains(runtime)
    chain, events = max(chains.items(), key=lambda c: len(c[1]))
    assert len(events) >= 3, "several transactions share a chain on this traffic"
    middle = events[len(events) // 2]
    others = [e for c in chains.values() for e in c if e.request_id and e.request_id != middle.request_id]

    async def change(s: AsyncSession) -> None:
        by_seq = EV.c.seq == middle.seq
        if kind == "edit_detail":
            await s.exec(sa.update(EV).where(by_seq).values(detail={**middle.detail, "reason": "x"}))
        elif kind == "edit_actor":
            await s.exec(sa.update(EV).where(by_seq).values(actor_name="Mallory", actor_id="mallory"))
        elif kind == "edit_time":
            await s.exec(sa.update(EV).where(by_seq).values(created_at=middle.created_at.replace(year=2020)))
        elif kind == "move_request":
            await s.exec(sa.update(EV).where(by_seq).values(request_id=others[0].request_id))
        elif kind == "swap_order":
            a, b = events[0], events[1]
            await s.exec(sa.update(EV).where(EV.c.seq == a.seq).values(chain_seq=-1))
            await s.exec(sa.update(EV).where(EV.c.seq == b.seq).values(chain_seq=a.chain_seq))
            await s.exec(sa.update(EV).where(EV.c.seq == a.seq).values(chain_seq=b.chain_seq))
        elif kind == "delete_middle":
            await s.exec(sa.delete(EV).where(by_seq))
        elif kind == "delete_tail":
            await s.exec(sa.delete(EV).where(EV.c.seq.in_([e.seq for e in events[-2:]])))
        elif kind == "delete_request_events":
            await s.exec(sa.delete(EV).where(EV.c.request_id == middle.request_id))
        elif kind == "delete_head":
            await s.exec(sa.delete(HEAD).where(HEAD.c.id == chain))
        elif kind == "edit_head":
            await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(last_hash="f" * 64))
        else:  # an old event inserted again at the end, as a replay of it
            first = events[0]
            await s.exec(
                sa.insert(EV).values(
                    chain=chain,
                    chain_seq=events[-1].chain_seq + 1,
                    **{k: getattr(first, k) for k in _rehash(first, "").keys()},
                )
            )
            await s.exec(sa.update(HEAD).where(HEAD.c.id == chain).values(seq=HEAD.c.seq + 1))

    await _tamper(runtime, change)
    code, out = await _verify(db_url)
    assert code == 1, (kind, out)
    assert out.count("\n") == 1, out
    assert out.startswith("error: audit chain broken"), out
    assert "Traceback" not in out
    async with runtime.sessions() as s:
        _, broken = await verify_chain(s)
    assert broken is not None
    if kind == "delete_head":  # the next tests' databases are emptied, not made again
        async with transaction(runtime.sessions) as s:
            await s.exec(sa.insert(HEAD).values(id=chain, seq=0, last_hash=audit.GENESIS))


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"chains": {"65": {"seq": 1, "hash": "x"}}}', '{"chains": {"1": {"seq": "1"}}}'],
)
async def test_an_anchor_that_is_not_one_is_refused_in_one_line(
    runtime: Runtime, agent_key: str, db_url: str, tmp_path: Any, text: str
) -> None:
    await _traffic(runtime, agent_key)
    path = tmp_path / "anchor.json"
    path.write_text(text)
    done = await _cli(db_url, "audit", "verify", "--anchor", str(path))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr
    assert "signoff audit anchor" in done.stderr or "chain" in done.stderr


async def test_no_anchor_is_taken_of_a_broken_log(runtime: Runtime, agent_key: str, db_url: str) -> None:
    await _traffic(runtime, agent_key)
    _, events = max((await _chains(runtime)).items(), key=lambda c: len(c[1]))

    async def edit(s: AsyncSession) -> None:
        await s.exec(sa.update(EV).where(EV.c.seq == events[0].seq).values(actor_name="Mallory"))

    await _tamper(runtime, edit)
    done = await _cli(db_url, "audit", "anchor")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "no anchor taken" in done.stderr


@pytest.mark.parametrize(("chain", "place"), [(0, 1), (0, 0), (-1, 1), (1, -1), (1, 0), (65, 1)])
async def test_an_event_added_outside_the_chains_is_named(
    runtime: Runtime, agent_key: str, db_url: str, chain: int, place: int
) -> None:
    """Chains are 1 to 64 and places count from 1: an event added anywhere else (where the
    walk would not start, or under no head) is named in one line, not a crash or a pass."""
    await _traffic(runtime, agent_key)
    first = next(iter((await _chains(runtime)).values()))[0]

    async def add(s: AsyncSession) -> None:
        await s.exec(
            sa.insert(EV).values(
                chain=chain, chain_seq=place, **_rehash(first, audit.GENESIS, action="approved")
            )
        )

    await _tamper(runtime, add)
    code, out = await _verify(db_url)
    assert code == 1, out
    assert out.count("\n") == 1, out
    assert out.startswith("error: audit chain broken"), out
    assert "Error" not in out


@pytest.mark.parametrize(
    ("column", "value"), [("created_at", "garbage"), ("chain_seq", "x"), ("created_at", "2026-13-45")]
)
async def test_a_value_sqlite_keeps_but_no_append_writes_is_an_edit(
    runtime: Runtime, agent_key: str, db_url: str, column: str, value: str
) -> None:
    """SQLite keeps text in any column: a time or a number that is not one is a broken log
    in one line, not a crash."""
    if not db_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's column types refuse the value")
    await _traffic(runtime, agent_key)
    first = next(iter((await _chains(runtime)).values()))[0]

    async def edit(s: AsyncSession) -> None:
        await s.exec(
            sa.text(f"UPDATE audit_event SET {column} = :v WHERE seq = :seq"),
            params={"v": value, "seq": first.seq},
        )

    await _tamper(runtime, edit)
    code, out = await _verify(db_url)
    assert code == 1, out
    assert out.count("\n") == 1, out
    assert out.startswith("error: audit chain broken"), out


async def test_verify_while_replicas_append_reports_nothing_broken(
    runtime: Runtime, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers on two engines (as two replicas) append while ``verify_chain`` walks in small
    batches: events committed after the heads were read are left for the next check, never
    reported as added, deleted or edited."""
    from signoff.app.db import create_engine, sessionmaker

    other = create_engine(db_url)
    engines = [runtime.sessions, sessionmaker(other)]
    stop = asyncio.Event()

    async def writer(i: int) -> int:
        n = 0
        while not stop.is_set():
            async with transaction(engines[i % 2]) as s:
                await audit.append(s, audit.Action.TOOL_CALL, actor=Actor("agent", f"w{i}"), detail={"n": n})
            n += 1
            await asyncio.sleep(0)
        return n

    real_events = audit._events

    async def small_batches(s: AsyncSession, batch: int = 1000) -> Any:
        async for ev in real_events(s, 3):
            yield ev

    monkeypatch.setattr(audit, "_events", small_batches)
    writers = [asyncio.create_task(writer(i)) for i in range(4)]
    try:
        for _ in range(15):
            async with runtime.sessions() as s:
                _, broken = await verify_chain(s)
            assert broken is None, broken
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        written = sum(await asyncio.gather(*writers))
        await other.dispose()
    assert written > 0
    async with runtime.sessions() as s:
        assert await verify_chain(s) == (written, None)
