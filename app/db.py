"""Engines, the request-scoped session (the one place that commits) and migrations."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import aiosqlite
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool
from sqlalchemy.util import await_
from sqlalchemy.util.queue import AsyncAdaptedQueue, Empty
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.bodies import read_json

__all__ = [
    "RETRY_AFTER_SECONDS",
    "UNAVAILABLE",
    "YIELD_AFTER_COMMIT",
    "async_url",
    "create_engine",
    "dialect_of",
    "insert_ignoring",
    "is_sqlite",
    "migrate",
    "sessionmaker",
    "transaction",
]

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"

UNAVAILABLE: tuple[type[Exception], ...] = (DBAPIError, OSError, PoolTimeout)
"""What the database raises when it cannot be reached: a driver error, a refused connection,
an exhausted pool. (Its ``DataError``, a value it refuses, is the client's fault instead.)"""
RETRY_AFTER_SECONDS = 1
"""The ``Retry-After`` of a 503 while the database is unavailable."""


def async_url(url: str) -> str:
    """Accept plain ``sqlite:///`` and ``postgresql://`` URLs and pick the async drivers."""
    u = make_url(url)
    if u.drivername in ("sqlite", "sqlite+pysqlite"):
        u = u.set(drivername="sqlite+aiosqlite")
    elif u.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        u = u.set(drivername="postgresql+asyncpg")
    return u.render_as_string(hide_password=False)


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _in_memory(url: str) -> bool:
    u = make_url(url)
    return u.database in (None, "", ":memory:") or u.query.get("mode") == "memory"


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
      transaction waits for a lock, and ``COMMIT`` (no automatic checkpoint, see
      below) only appends to the WAL without syncing (``synchronous=NORMAL``);
    - a statement that once took longer than :data:`SLOW_SECONDS` inline (a table
      scan, not a look-up) runs on the worker thread from then on;
    - the writer checkpoints the WAL (``PASSIVE``: it never waits) on the worker
      thread every :data:`CHECKPOINT_EVERY` commits, so the event loop never does
      that file I/O; pragmas and closing also go to the thread.

    One session uses a connection at a time, so the two threads never use it at once.
    """

    def __init__(self, connector: Callable[[], sqlite3.Connection], *, writer: bool) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self.writer = writer
        self._commits = 0

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._connection is None or not self._running:
            return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
        kind = _kind(fn, args)
        if kind == "inline":
            if args and args[0] in _SLOW:
                return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]
            started = time.perf_counter()
            result = fn(*args, **kwargs)
            slow = time.perf_counter() - started > SLOW_SECONDS
            if slow and args and isinstance(args[0], str) and len(_SLOW) < 1000:
                # A scan, not a look-up: from now on it runs on the worker thread.
                _SLOW.add(args[0])
            return result
        if kind == "begin" and self.writer:
            try:
                return fn(*args, **kwargs)
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            return await super()._execute(self._begin_waiting, fn, args)  # type: ignore[no-untyped-call]
        if kind == "commit" and self.writer:
            fn(*args, **kwargs)
            self._commits += 1
            if self._commits % CHECKPOINT_EVERY == 0:
                await super()._execute(self._checkpoint)  # type: ignore[no-untyped-call]
            return None
        return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    def _begin_waiting(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        try:
            return fn(*args)
        finally:
            conn.execute("PRAGMA busy_timeout=0")

    def _checkpoint(self) -> None:
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


SLOW_SECONDS = 0.002
_SLOW: set[str] = set()
"""SQL texts seen to take longer than SLOW_SECONDS inline (at most 1000 remembered)."""
BUSY_TIMEOUT_MS = 30_000
CHECKPOINT_EVERY = 200
"""Commits between WAL checkpoints of a writer connection (SQLite's own default is ~1000 pages)."""


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


def _inline_connector(url: str, *, writer: bool) -> Callable[[], Awaitable[aiosqlite.Connection]]:
    from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite

    args, params = SQLiteDialect_aiosqlite().create_connect_args(make_url(url))
    params = {**params, "timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}

    async def connect() -> aiosqlite.Connection:
        conn = InlineSQLite(partial(sqlite3.connect, *args, **params), writer=writer)
        conn._thread.daemon = True  # as SQLAlchemy does for aiosqlite
        return await conn

    return connect


def create_engine(url: str, *, readonly: bool = False, **kw: Any) -> AsyncEngine:
    """An engine; on SQLite, ``readonly`` engines take no write lock when they begin.

    A SQLite writer engine holds one connection: SQLite lets one writer in at a
    time anyway, and writers queued on the pool are handed the connection the
    moment it is free, where writers on several connections would sleep in
    SQLite's busy handler (1, 2, 5 … 100 ms naps) and leave the lock idle.
    Other processes (the CLI, another server) still wait on ``busy_timeout``.
    """
    url = async_url(url)
    # Rows stored before the input rules (or edited by hand) read as what can be shown.
    kw.setdefault("json_deserializer", read_json)
    if not is_sqlite(url):
        kw.setdefault("pool_size", 20)
        kw.setdefault("max_overflow", 20)
        kw.setdefault("pool_pre_ping", True)
        return create_async_engine(url, **kw)

    if _in_memory(url):
        engine = create_async_engine(url, connect_args={"timeout": 30}, **kw)
    else:
        if not readonly:
            kw.setdefault("poolclass", _FairPool)
            kw.setdefault("pool_size", 1)
            kw.setdefault("max_overflow", 0)
        engine = create_async_engine(url, async_creator=_inline_connector(url, writer=not readonly), **kw)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take BEGIN into our own hands so writers start with BEGIN IMMEDIATE:
        # a deferred transaction that reads and then writes can fail with
        # SQLITE_BUSY_SNAPSHOT instead of waiting for the lock.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
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


def dialect_of(session: AsyncSession) -> str:
    """``sqlite`` or ``postgresql``."""
    return str(session.sync_session.get_bind().dialect.name)


@functools.cache
def insert_ignoring(dialect: str, table: sa.Table, unique: tuple[str, ...]) -> sa.Insert:
    """``INSERT … ON CONFLICT (unique) DO NOTHING RETURNING <primary key>``, built once.

    A row whose ``unique`` columns are taken inserts nothing and returns nothing; on
    PostgreSQL a racing insert of the same key waits for the other transaction, then
    does nothing.
    """
    dialects = {"postgresql": postgresql, "sqlite": sqlite}
    if dialect not in dialects:  # pragma: no cover - the two supported databases
        raise RuntimeError(f"unsupported database {dialect!r}")
    pk = next(iter(table.primary_key.columns))
    stmt: sa.Insert = (
        dialects[dialect].insert(table).on_conflict_do_nothing(index_elements=list(unique)).returning(pk)
    )
    return stmt


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


YIELD_AFTER_COMMIT = "signoff.yield_after_commit"
"""Set in a session's ``info`` by an after-commit hook that woke other tasks (agents waiting on
a decision): the transaction then yields once, so they answer before its caller goes on."""


@asynccontextmanager
async def transaction(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """One transaction: commit on success, roll back on any exception."""
    session = factory()
    try:
        yield session
        if session.in_transaction():
            await session.commit()
            if session.info.pop(YIELD_AFTER_COMMIT, False):
                await asyncio.sleep(0)
    except BaseException:
        await session.rollback()
        await session.close()
        raise
    # After the commit (or with no transaction at all) the session holds no connection:
    # closing it would only cost a greenlet hop on every request of the allow path.


def migrate(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations to ``url`` (call outside a running event loop)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = async_url(url)
    command.upgrade(cfg, revision)


def core_row(obj: Any, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A model instance's column values, for a Core INSERT (no unit-of-work flush)."""
    return {c.name: getattr(obj, c.name) for c in obj.__table__.columns if c.name not in skip}


async def insert_unless_taken(
    session: AsyncSession, table: sa.Table, unique: tuple[str, ...], row: dict[str, Any]
) -> bool:
    """INSERT ``row`` unless a row with the same ``unique`` columns exists; True if inserted.

    One statement (``ON CONFLICT DO NOTHING``) instead of a look-up or a savepoint and a
    flush: on PostgreSQL a racing insert of the same key waits for the other
    transaction, then does nothing.
    """
    stmt = insert_ignoring(dialect_of(session), table, unique)
    return (await session.exec(stmt, params=row)).first() is not None
