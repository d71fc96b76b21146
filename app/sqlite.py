"""SQLite serving: statements on the event loop's thread, one writer connection handed out fairly.

Both tweaks reach into the internals of the libraries below them: :class:`InlineSQLite`
overrides ``aiosqlite.Connection``'s private ``_execute`` and its ``stop`` and reads its ``_connection``,
``_running``, ``_conn`` and ``_thread``; :class:`_FairQueue` uses SQLAlchemy's
``AsyncAdaptedQueue._queue`` and ``sqlalchemy.util.await_``. They were written for the
releases in :data:`WRITTEN_FOR`, to which ``pyproject.toml`` pins both libraries. Under any
other release :func:`create_engine` serves SQLite the standard way (slower, never broken)
and logs why; ``tests/app/test_sqlite.py`` fails, naming the library and the release to
install.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from functools import partial
from importlib.metadata import version
from typing import Any, Literal

import aiosqlite
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool
from sqlalchemy.util import await_
from sqlalchemy.util.queue import AsyncAdaptedQueue, Empty

__all__ = ["BUSY_TIMEOUT_MS", "SYNC", "WRITTEN_FOR", "InlineSQLite", "Sync", "create_engine", "unsupported"]

log = logging.getLogger("signoff")

WRITTEN_FOR = {"aiosqlite": "0.22", "sqlalchemy": "2.1"}
"""The release series (``major.minor``) whose internals this module uses, by distribution."""

SLOW_SECONDS = 0.002
"""How long one SQLite call may hold the event loop."""
_SLOW: set[str] = set()
"""SQL texts seen to take longer than SLOW_SECONDS inline (at most 1000 remembered)."""
COMMIT_WEIGHT = 0.125
"""The weight of the latest commit in a writer's running average of its commits' duration."""
BUSY_TIMEOUT_MS = 30_000
CHECKPOINT_EVERY = 200
"""Commits between WAL checkpoints of a writer connection (SQLite's own default is ~1000 pages)."""

Sync = Literal["full", "normal"]
"""How a commit reaches the disk (``SIGNOFF_SQLITE_SYNC``):

- ``full`` (the default): ``synchronous=FULL``. ``COMMIT`` syncs the WAL before it returns
  and before any other connection can read what it wrote, so a request, a vote or a
  decision anyone has been told of survives a power loss or an OS crash. Calls arriving
  together share one commit, and so one sync (the intake's group commit).
- ``normal``: ``synchronous=NORMAL``. ``COMMIT`` only appends to the WAL; the WAL is synced
  at checkpoints. A crash of Signoff loses nothing, but a power loss or an OS crash **may
  lose the last decisions and requests** — ones an agent was already told of and acted on.
"""
SYNC: dict[Sync, str] = {"full": "FULL", "normal": "NORMAL"}


@functools.cache
def unsupported() -> tuple[str, ...]:
    """One line for each library installed at a release this module was not written for."""
    problems = []
    for name, series in WRITTEN_FOR.items():
        installed = version(name)
        if installed != series and not installed.startswith(series + "."):
            problems.append(
                f"{name} {installed} is installed, but signoff.app.sqlite was written for "
                f"{name} {series}.x: install {name}~={series}.0 (the range pyproject.toml pins), or "
                "review InlineSQLite and _FairQueue against this release and update WRITTEN_FOR"
            )
    return tuple(problems)


class InlineSQLite(aiosqlite.Connection):
    """An aiosqlite connection that runs statements on the event loop's own thread
    unless they could wait.

    aiosqlite hands every call (a cursor, an execute, a fetch, a close: about four
    per statement) to its worker thread and back; those thread hand-offs cost far
    more CPU than the small statements themselves on a WAL database. So:

    - readers of a WAL database never wait for the writer: all inline;
    - a writer's ``BEGIN IMMEDIATE`` is tried inline with ``busy_timeout`` 0; only
      if another process holds the write lock does it wait, on the worker thread,
      for up to :data:`BUSY_TIMEOUT_MS`. Once it has begun, nothing in the
      transaction waits for a lock;
    - a writer's ``COMMIT`` (no automatic checkpoint, see below) syncs the WAL under
      ``synchronous=FULL``. It runs inline while commits take less than :data:`SLOW_SECONDS`
      on average (:data:`COMMIT_WEIGHT`): on a disk that syncs in a fraction of a
      millisecond the hand-off to the worker thread and back costs more than the sync
      (pending creation a fifth faster inline, ``docs/benchmarks.md``). Once they take
      longer (a slow disk), commits run on the worker thread, timed there, and the event loop
      serves others meanwhile, until their average falls below it again. Under ``normal``
      (:data:`Sync`) a commit only appends to the WAL, inline;
    - a statement that once took longer than :data:`SLOW_SECONDS` inline (a table
      scan, not a look-up) runs on the worker thread from then on;
    - the writer checkpoints the WAL (``PASSIVE``: it never waits) on the worker
      thread after every :data:`CHECKPOINT_EVERY` commits, before its next ``BEGIN``, so
      the event loop never does that file I/O and a checkpoint that fails (a full disk
      cannot grow the main file) is logged, never taken for the commit's failure;
      pragmas and closing also go to the thread.

    One session uses a connection at a time, and a call handed to the worker thread is
    waited for to its end, even by a task cancelled meanwhile (:meth:`_on_thread`), so the
    two threads never use it at once, and a ``COMMIT`` the thread ran is reported as it
    ended.
    """

    def __init__(
        self, connector: Callable[[], sqlite3.Connection], *, writer: bool, sync: Sync = "full"
    ) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self.writer = writer
        self.sync = sync
        self._commits = 0
        self._checkpoint_due = False
        self.commit_seconds = 0.0
        """The running average of this connection's commits' duration (see the class)."""

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._connection is None or not self._running:
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        kind = _kind(fn, args)
        if kind == "inline":
            if args and args[0] in _SLOW:
                return await self._on_thread(partial(fn, *args, **kwargs))
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            slow = time.perf_counter() - started > SLOW_SECONDS
            if slow and args and isinstance(args[0], str) and len(_SLOW) < 1000:
                # A scan, not a look-up: from now on it runs on the worker thread.
                _SLOW.add(args[0])
            return result
        if kind == "begin" and self.writer:
            if self._checkpoint_due:
                self._checkpoint_due = False
                await self._checkpoint()
            try:
                return fn(*args, **kwargs)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            return await self._on_thread(self._begin_waiting, fn, args)
        if kind == "commit" and self.writer:
            if self.sync == "full" and self.commit_seconds >= SLOW_SECONDS:
                await self._on_thread(partial(self._timed, fn, *args, **kwargs), commit=True)
            else:
                self._timed(fn, *args, **kwargs)
            self._commits += 1
            self._checkpoint_due = self._commits % CHECKPOINT_EVERY == 0
            return None
        return await self._on_thread(partial(fn, *args, **kwargs))

    async def _on_thread(self, fn: Callable[..., Any], *args: Any, commit: bool = False) -> Any:
        """``fn`` on the worker thread, waited for to its end even by a task cancelled
        meanwhile, so the loop's thread never uses the connection while the worker does (a
        rollback would block the event loop until the worker's call ended). The cancellation
        then goes on as it came, unless the call was a ``COMMIT``: a commit is reported as it
        ended (a durable decision is not taken for a failed one, and the agents waiting on
        it are woken) and the cancellation delivered at the task's next ``await``."""
        call = asyncio.ensure_future(super()._execute(fn, *args))  # type: ignore[no-untyped-call]
        cancelled = False
        while not call.done():
            try:
                await asyncio.wait((call,))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled and not commit:
            raise asyncio.CancelledError
        if cancelled and (task := asyncio.current_task()) is not None:
            task.uncancel()
            task.cancel()  # once more, now that the commit has ended
        return call.result()

    def stop(self) -> asyncio.Future[Any] | None:
        """Stop the worker thread once. A second stop would queue its answer behind the
        first one's, which ends the worker: nothing would ever answer it, and aiosqlite's
        ``close()`` after SQLAlchemy's ``stop()`` (a connection whose task was cancelled
        mid-query) would wait for ever, holding the event loop's shutdown."""
        if not self._running:
            return None
        future: asyncio.Future[Any] | None = super().stop()
        return future

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Commit (``fn``), counting its duration into :attr:`commit_seconds`."""
        started = time.perf_counter()
        fn(*args, **kwargs)
        self.commit_seconds += (time.perf_counter() - started - self.commit_seconds) * COMMIT_WEIGHT

    def _begin_waiting(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        try:
            return fn(*args)
        finally:
            conn.execute("PRAGMA busy_timeout=0")

    async def _checkpoint(self) -> None:
        """Checkpoint the WAL, before the writer's next transaction begins. It only bounds the
        WAL's growth: a failure is logged, and the next is tried :data:`CHECKPOINT_EVERY`
        commits later."""
        try:
            await self._on_thread(self._checkpoint_now)
        except sqlite3.Error as exc:
            log.warning(
                "SQLite: checkpointing the WAL failed (%s); the WAL grows until one succeeds: "
                "free disk space if the disk is full",
                exc,
            )

    def _checkpoint_now(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").close()


class _FairQueue(AsyncAdaptedQueue[Any]):
    """First come, first served: a connection put back goes to the longest waiter.

    SQLAlchemy's asyncio queue lets a newcomer take a connection that was just put
    back before the waiter it was meant for wakes up; with one writer connection
    that starves unlucky waiters for seconds.
    """

    _waiting = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block or self._waiting == 0:
            try:
                return self._queue.get_nowait()
            except asyncio.QueueEmpty:
                if not block:
                    raise Empty() from None
        self._waiting += 1
        try:
            return await_(asyncio.wait_for(self._queue.get(), timeout))
        except TimeoutError:
            raise Empty() from None
        finally:
            self._waiting -= 1


class _FairPool(AsyncAdaptedQueuePool):
    _queue_class = _FairQueue


def _kind(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """How a call to the sqlite3 module may behave: ``inline``, ``begin``, ``commit`` or ``thread``."""
    name = getattr(fn, "__name__", "")
    if isinstance(getattr(fn, "__self__", None), sqlite3.Connection):
        if name == "commit":
            return "commit"
        if name in ("close", "backup", "iterdump", "executescript"):
            return "thread"
    if name in ("execute", "executemany") and args and isinstance(args[0], str):
        head = args[0].lstrip()[:16].upper()
        if head.startswith(("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE")):
            return "begin"
        if head.startswith(("COMMIT", "END")):
            return "commit"
        if head.startswith(("PRAGMA", "VACUUM", "ATTACH")):
            return "thread"
    return "inline"


def _inline_connector(url: str, *, writer: bool, sync: Sync) -> Callable[[], Awaitable[aiosqlite.Connection]]:
    from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

    args, params = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
    params = {**params, "timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}

    async def connect() -> aiosqlite.Connection:
        conn = InlineSQLite(partial(sqlite3.connect, *args, **params), writer=writer, sync=sync)
        conn._thread.daemon = True  # as SQLAlchemy does for aiosqlite
        return await conn

    return connect


def _in_memory(url: str) -> bool:
    u = make_url(url)
    return u.database in (None, "", ":memory:") or u.query.get("mode") == "memory"


def create_engine(url: str, *, readonly: bool, sync: Sync = "full", **kw: Any) -> AsyncEngine:
    """An engine for the ``sqlite+aiosqlite`` ``url``; ``readonly`` engines take no write lock
    when they begin; commits reach the disk as ``sync`` says (:data:`Sync`).

    A writer engine holds one connection: SQLite lets one writer in at a time anyway,
    and writers queued on the pool are handed the connection the moment it is free,
    where writers on several connections would sleep in SQLite's busy handler (1, 2,
    5 … 100 ms naps) and leave the lock idle. Other processes (the CLI, another
    server) still wait on ``busy_timeout``.
    """
    problems = unsupported()
    if _in_memory(url) or problems:
        for problem in problems:
            log.warning("serving SQLite the standard way (slower): %s", problem)
        engine = create_async_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}, **kw)
    else:
        if not readonly:
            kw.setdefault("poolclass", _FairPool)
            kw.setdefault("pool_size", 1)
            kw.setdefault("max_overflow", 0)
        engine = create_async_engine(
            url, async_creator=_inline_connector(url, writer=not readonly, sync=sync), **kw
        )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take BEGIN into our own hands so writers start with BEGIN IMMEDIATE:
        # a deferred transaction that reads and then writes can fail with
        # SQLITE_BUSY_SNAPSHOT instead of waiting for the lock.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={SYNC[sync]}")
        cur.execute("PRAGMA foreign_keys=ON")
        if isinstance(dbapi_conn.driver_connection, InlineSQLite) and dbapi_conn.driver_connection.writer:
            # BEGIN IMMEDIATE is tried without waiting; see InlineSQLite.
            cur.execute("PRAGMA busy_timeout=0")
            cur.execute("PRAGMA wal_autocheckpoint=0")
        else:
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # WAL readers never wait for the writer; only writers queue for the lock.
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine
