"""The SQLite serving tweaks use private parts of aiosqlite and SQLAlchemy: they run only on the
releases they were written for, which pyproject.toml pins."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
import tomllib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import aiosqlite
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import AsyncAdaptedQueuePool
from sqlalchemy.util.queue import AsyncAdaptedQueue

from signoff.app import sqlite
from signoff.app.db import create_engine, transaction
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.conftest import in_process_http
from tests.waiting import eventually


def test_the_installed_libraries_are_the_releases_the_sqlite_tweaks_were_written_for() -> None:
    problems = sqlite.unsupported()
    assert not problems, "\n".join(problems)


def test_pyproject_pins_the_releases_the_sqlite_tweaks_were_written_for(repo_root: Path) -> None:
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    pins = {}
    for requirement in project["project"]["dependencies"]:
        name = re.split(r"[\[<>=~! ]", requirement, maxsplit=1)[0].lower()
        pins[name] = requirement[len(name) :].split("]")[-1]
    for name, series in sqlite.WRITTEN_FOR.items():
        pin = pins.get(name, "")
        assert re.fullmatch(rf"~={re.escape(series)}\.\d+", pin), (
            f"pyproject.toml must pin {name} to the release series signoff.app.sqlite was written "
            f"for ({name}~={series}.N), not {name}{pin or ' (unpinned)'}"
        )


async def test_the_private_parts_used_are_there(tmp_path: Path) -> None:
    """What InlineSQLite and _FairQueue reach into, by name: a release that renames one fails here."""
    conn = aiosqlite.Connection(lambda: sqlite3.connect(tmp_path / "x.db"), iter_chunk_size=64)
    for name in ("_connection", "_running", "_thread"):
        assert hasattr(conn, name), f"aiosqlite {version('aiosqlite')}: Connection has no {name}"
    assert callable(aiosqlite.Connection._execute), "aiosqlite: Connection has no _execute"
    assert isinstance(aiosqlite.Connection._conn, property), "aiosqlite: Connection has no _conn"
    assert hasattr(AsyncAdaptedQueue(), "_queue"), f"SQLAlchemy {sa.__version__}: no AsyncAdaptedQueue._queue"
    assert issubclass(AsyncAdaptedQueuePool._queue_class, AsyncAdaptedQueue), (
        f"SQLAlchemy {sa.__version__}: AsyncAdaptedQueuePool no longer takes its queue from _queue_class"
    )


async def _write_and_read(url: str) -> tuple[bool, int]:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            await conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        async with engine.connect() as conn:
            inline = isinstance((await conn.get_raw_connection()).driver_connection, sqlite.InlineSQLite)
            count = (await conn.execute(sa.text("SELECT count(*) FROM t"))).scalar_one()
        return inline, int(count)
    finally:
        await engine.dispose()


async def test_the_tweaks_serve_sqlite_on_the_releases_they_were_written_for(tmp_path: Path) -> None:
    assert await _write_and_read(f"sqlite:///{tmp_path / 'tuned.db'}") == (True, 1)


async def test_other_releases_serve_sqlite_the_standard_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sqlite.WRITTEN_FOR, "aiosqlite", "0.1")
    sqlite.unsupported.cache_clear()
    try:
        assert await _write_and_read(f"sqlite:///{tmp_path / 'standard.db'}") == (False, 1)
    finally:
        monkeypatch.undo()
        sqlite.unsupported.cache_clear()
    assert "serving SQLite the standard way" in caplog.text
    assert f"aiosqlite {version('aiosqlite')} is installed" in caplog.text
    assert "written for aiosqlite 0.1.x" in caplog.text


async def test_a_connection_closed_after_it_was_stopped_does_not_wait_for_ever(tmp_path: Path) -> None:
    """SQLAlchemy ends a connection whose task was cancelled mid-query by ``stop()`` while its
    shielded graceful ``close()`` still runs; aiosqlite's ``close()`` then stops the worker a
    second time and waits for an answer the stopped worker never sends, which held the event
    loop's shutdown (``asyncio.run``'s cancelling of the tasks left) for ever."""
    connect = sqlite._inline_connector(f"sqlite:///{tmp_path / 'x.db'}", writer=True, sync="full")
    conn = await connect()
    busy = threading.Event()  # the worker thread is mid-query: the stop below waits behind it
    query = asyncio.ensure_future(aiosqlite.Connection._execute(conn, busy.wait, 10))
    await asyncio.sleep(0)  # queued
    conn.stop()  # SQLAlchemy's force close, first
    with pytest.raises(ValueError, match="closed"):
        await asyncio.wait_for(conn.close(), 5)  # the graceful close, after: refused at once
    busy.set()
    assert await query is True
    await asyncio.wait_for(asyncio.to_thread(conn._thread.join, 5), 6)
    assert not conn._thread.is_alive()


class _Clock:
    """``time`` for signoff.app.sqlite whose ``perf_counter`` moves 50 µs a reading: each timed
    commit takes 50 µs, however long the disk took."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.00005
        return self.now


async def test_a_writer_commits_on_the_event_loop_while_commits_are_fast_and_on_its_thread_while_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast sync costs less than the hand-off to the worker thread and back; a slow disk must
    not hold the event loop. Commits on the thread are timed there, so they come back to the
    loop once the disk is fast again."""
    threads: list[int] = []
    timed = sqlite.InlineSQLite._timed

    def recording(self: sqlite.InlineSQLite, fn: object, *args: object) -> None:
        threads.append(threading.get_ident())
        timed(self, fn, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite.InlineSQLite, "_timed", recording)
    monkeypatch.setattr(sqlite, "time", _Clock())
    connect = sqlite._inline_connector(f"sqlite:///{tmp_path / 'x.db'}", writer=True, sync="full")
    conn = await connect()
    assert isinstance(conn, sqlite.InlineSQLite)
    loop_thread = threading.get_ident()

    async def commit_one(n: int) -> int:
        await conn.execute("BEGIN IMMEDIATE")
        await conn.execute("INSERT INTO t VALUES (?)", (n,))
        await conn.commit()
        return threads[-1]

    try:
        await conn.execute("CREATE TABLE t (x INTEGER)")
        await conn.commit()
        assert await commit_one(1) == loop_thread
        slow = 10 * sqlite.SLOW_SECONDS  # as after a run of slow syncs
        conn.commit_seconds = slow
        assert await commit_one(2) != loop_thread
        assert conn.commit_seconds == pytest.approx(slow + (0.00005 - slow) * sqlite.COMMIT_WEIGHT)
        places = [await commit_one(n) for n in range(3, 60)]
        back = places.index(loop_thread)  # raises if the fast commits never came back
        assert back > 5, "one fast commit does not outweigh a run of slow ones"
        assert all(p != loop_thread for p in places[:back])
        assert all(p == loop_thread for p in places[back:])
        rows = await (await conn.execute("SELECT count(*) FROM t")).fetchone()
        assert rows is not None
        assert rows[0] == 59
    finally:
        await conn.close()


# A commit that succeeded is reported as it ended ----------------------------------------------

CALL = {"tool_name": "pay_x", "arguments": {"amount": 90000}}


async def _pending_and_its_waiter(
    runtime: Runtime, http: httpx.AsyncClient, key: str
) -> tuple[str, asyncio.Task[httpx.Response]]:
    headers = {"Authorization": f"Bearer {key}"}
    r = await http.post("/v1/hooks/pre-tool-use", json=CALL, headers=headers)
    assert r.json()["decision"] == "pending", r.text
    rid = r.json()["request_id"]
    waiter = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait", params={"timeout": 20}, headers=headers)
    )
    await eventually(lambda: runtime.hub.waiting == 1)
    return rid, waiter


async def _approve(runtime: Runtime, rid: str) -> None:
    async with transaction(runtime.sessions) as session:
        await decide(session, rid, verdict=Verdict.APPROVE, operator="alice", config=runtime.config)


async def _statuses(runtime: Runtime) -> list[str]:
    async with transaction(runtime.sessions) as session:
        return [
            str(s) for s in (await session.exec(sa.text("SELECT status FROM confirmation_request"))).scalars()
        ]


@pytest.mark.parametrize("checkpoint", ["fails", "is cancelled"])
async def test_a_checkpoint_never_turns_a_durable_decision_into_a_failed_one(
    runtime: Runtime,
    agent_key: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    checkpoint: str,
) -> None:
    """The WAL's checkpoint (a full disk cannot grow the main file; a stop cancels the task
    waiting for it) runs before the writer's next transaction, not as part of a commit: the
    decision is answered as committed and its agent woken."""
    monkeypatch.setattr(sqlite, "CHECKPOINT_EVERY", 1)
    started = threading.Event()

    def checkpoint_now(self: sqlite.InlineSQLite) -> None:
        started.set()
        if checkpoint == "fails":
            raise sqlite3.OperationalError("database or disk is full")
        time.sleep(0.3)

    async with in_process_http(runtime) as http:
        rid, waiter = await _pending_and_its_waiter(runtime, http, agent_key)
        monkeypatch.setattr(sqlite.InlineSQLite, "_checkpoint_now", checkpoint_now)
        if checkpoint == "fails":
            await _approve(runtime, rid)  # the checkpoint owed by the pending request's commit fails first
            assert "checkpointing the WAL failed (database or disk is full)" in caplog.text
        else:
            deciding = asyncio.create_task(_approve(runtime, rid))
            await eventually(started.is_set)
            deciding.cancel()  # while the checkpoint owed runs: before the decision begins
            with pytest.raises(asyncio.CancelledError):
                await deciding
            assert await _statuses(runtime) == ["pending"]
            assert not waiter.done()
            monkeypatch.undo()
            await _approve(runtime, rid)
        woken = await asyncio.wait_for(waiter, 5)
    assert woken.json()["status"] == "approved"
    assert await _statuses(runtime) == ["approved"]


async def test_a_commit_on_the_thread_ends_as_the_database_says_for_a_task_cancelled_meanwhile(
    runtime: Runtime, agent_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a slow disk a commit runs on the connection's thread; the task waiting for it may be
    cancelled (a stop's end) while the disk syncs. The commit ends; its agent is woken at once,
    and the event loop never runs a rollback on the connection the thread is committing on."""
    monkeypatch.setattr(sqlite, "SLOW_SECONDS", -1.0)  # every commit on the thread
    timed = sqlite.InlineSQLite._timed
    syncing = threading.Event()

    def slow_sync(self: sqlite.InlineSQLite, fn: Callable[..., object], *args: object) -> None:
        syncing.set()
        time.sleep(0.3)
        timed(self, fn, *args)

    async with in_process_http(runtime) as http:
        rid, waiter = await _pending_and_its_waiter(runtime, http, agent_key)
        monkeypatch.setattr(sqlite.InlineSQLite, "_timed", slow_sync)
        deciding = asyncio.create_task(_approve(runtime, rid))
        await eventually(syncing.is_set)
        deciding.cancel()
        with pytest.raises(asyncio.CancelledError):  # the cancellation, after the commit
            await deciding
        assert waiter.done(), "the commit's agent was not woken by it"
        woken = await waiter
    assert woken.json()["status"] == "approved"
    assert await _statuses(runtime) == ["approved"]


async def test_a_gated_call_is_answered_pending_once_whatever_the_checkpoint_after_it(
    runtime: Runtime, agent_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call answered 503 would be sent again by the agent's client: a second request, a
    second card for the same call."""
    monkeypatch.setattr(sqlite, "CHECKPOINT_EVERY", 1)

    def full_disk(self: sqlite.InlineSQLite) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(sqlite.InlineSQLite, "_checkpoint_now", full_disk)
    headers = {"Authorization": f"Bearer {agent_key}"}
    async with in_process_http(runtime) as http:
        first = await http.post("/v1/hooks/pre-tool-use", json=CALL, headers=headers)
        second = await http.post(
            "/v1/hooks/pre-tool-use", json={**CALL, "arguments": {"amount": 90001}}, headers=headers
        )
    assert [first.status_code, second.status_code] == [200, 200]
    assert [first.json()["decision"], second.json()["decision"]] == ["pending", "pending"]
    assert await _statuses(runtime) == ["pending", "pending"]
