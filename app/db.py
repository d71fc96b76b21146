"""Engines, units of work (the one place that commits) and migrations.

:func:`transaction` is the one way to open a unit of work: it commits on success and rolls
back on any exception. What a commit owes the rest of the process (waking the agents waiting
on a decision, the outbox dispatcher) is registered with :func:`on_commit` as the
transaction goes: it runs once the transaction has committed, never if it rolls back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
import sqlmodel
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import SessionTransaction
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.bodies import read_json
from signoff.app.sqlite import Sync
from signoff.app.sqlite import create_engine as sqlite_engine

__all__ = [
    "RETRY_AFTER_SECONDS",
    "UNAVAILABLE",
    "Events",
    "Pooling",
    "SchemaError",
    "Session",
    "Subscribers",
    "Wakeups",
    "async_url",
    "before_commit",
    "chosen_once",
    "create_engine",
    "current_revision",
    "dialect_of",
    "downgrade",
    "emit",
    "head_revision",
    "insert_ignoring",
    "is_sqlite",
    "log_failure",
    "migrate",
    "on_commit",
    "revisions",
    "schema_revision",
    "sessionmaker",
    "subscribers",
    "transaction",
    "wake_after_commit",
]

log = logging.getLogger("signoff")

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"

UNAVAILABLE: tuple[type[Exception], ...] = (DBAPIError, OSError, PoolTimeout)
"""What the database raises when it cannot be reached: a driver error, a refused connection,
an exhausted pool. (Its ``DataError``, a value it refuses, is the client's fault instead.)"""
RETRY_AFTER_SECONDS = 1
"""The ``Retry-After`` of a 503 while the database is unavailable."""


def log_failure(logger: logging.Logger, message: str, *args: object) -> None:
    """Log the exception being handled by background work (the sweep, the outbox): a database
    that cannot be used is one warning line (what it said first), anything else a traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, UNAVAILABLE):
        error = getattr(exc, "orig", None) or exc
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        logger.warning("%s: %s: %s", message % args, type(error).__name__, first[:300])
    else:
        logger.exception(message, *args)


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


Pooling = Literal["none", "transaction"]
"""How SIGNOFF_DATABASE_URL reaches PostgreSQL: directly (or through a pooler in session
pooling), or through a pooler in transaction pooling such as PgBouncer's ``pool_mode =
transaction`` (``SIGNOFF_DATABASE_POOLING``)."""


def _statement_name() -> str:
    # Unique across every client of the pooler: a name another client prepared on the same
    # server connection would be refused ("already exists"), or worse, run its statement.
    return f"__signoff_{uuid.uuid4().hex}__"


def create_engine(
    url: str, *, readonly: bool = False, sync: Sync = "full", pooling: Pooling = "none", **kw: Any
) -> AsyncEngine:
    """An engine; on SQLite, ``readonly`` engines take no write lock when they begin and
    commits reach the disk as ``sync`` says (see :func:`signoff.app.sqlite.create_engine`).
    PostgreSQL syncs as the server is configured (``synchronous_commit``, on by default).

    ``pooling="transaction"``: behind a transaction pooler each transaction may run on another
    server connection, so nothing prepared is kept past one (no statement cache in asyncpg or
    SQLAlchemy, and a unique name for each statement, as SQLAlchemy's asyncpg dialect documents
    for PgBouncer). Run every statement in a transaction there: outside one, a statement's
    prepare and its execution may reach two different server connections.
    """
    url = async_url(url)
    # Rows stored before the input rules (or edited by hand) read as what can be shown.
    kw.setdefault("json_deserializer", read_json)
    if not is_sqlite(url):
        kw.setdefault("pool_size", 20)
        kw.setdefault("max_overflow", 20)
        kw.setdefault("pool_pre_ping", True)
        if pooling == "transaction":
            kw["connect_args"] = {
                **kw.get("connect_args", {}),
                "statement_cache_size": 0,
                "prepared_statement_cache_size": 0,
                "prepared_statement_name_func": _statement_name,
            }
        return create_async_engine(url, **kw)
    return sqlite_engine(url, readonly=readonly, sync=sync, **kw)


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


def chosen_once(rows: sa.Select[Any], name: str = "chosen") -> sa.CTE:
    """``rows`` (a locking, limited SELECT of the rows an UPDATE is to change) as a materialized
    CTE: chosen once. PostgreSQL may run a subquery under ``IN`` again for each row the UPDATE
    visits; the rows it has already changed no longer match, so each run chooses others, past
    the limit. Update ``WHERE id IN (SELECT id FROM <this>)``."""
    return rows.cte(name).prefix_with("MATERIALIZED")


def _nobody(*_: object) -> None:
    pass


Subscribers = Callable[[str], Sequence[str]]
"""The webhooks an event is sent to (by name), under the configuration in force."""


def _no_webhooks(_: str) -> Sequence[str]:
    return ()


Events = Callable[["AsyncSession", str, Sequence[str], datetime], None]
"""What a unit of work does with an event it emits (:func:`emit`): the server owes it to the
webhooks subscribed to it (:func:`signoff.app.webhooks.owe`)."""


def _no_events(*_: object) -> None:
    pass


Answers = Callable[["AsyncSession", Sequence[str]], Awaitable[Mapping[str, Any]]]
"""What the agents waiting in this process on requests just decided are answered, read in the
deciding transaction (by request id; a request nobody here waits on may be left out)."""


@dataclass(frozen=True, slots=True)
class Wakeups:
    """Whom a commit wakes in this process: the agents waiting on the requests it decided,
    and the outbox dispatcher when it queued deliveries. Sessions made without (the CLI's)
    wake nobody here; other processes hear of decisions through the database.

    ``decided(ids, answers)`` gets what :attr:`answers` read just before the commit: the
    waiters are answered from the commit itself, without reading their requests again."""

    decided: Callable[[Sequence[str], Mapping[str, Any]], None] = _nobody
    queued: Callable[[], None] = _nobody
    answers: Answers | None = None


class Session(sqlmodel.Session):
    """The synchronous half of every session the server opens: it holds the callbacks its
    transaction owes its commit (:func:`on_commit`) and whom a commit wakes."""

    def __init__(
        self,
        *args: Any,
        wakeups: Wakeups | None = None,
        webhooks: Subscribers | None = None,
        events: Events | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.wakeups = wakeups or Wakeups()
        self.events = events or _no_events
        """What this session does with the events it emits; sessions made without drop them."""
        self.webhooks = webhooks or _no_webhooks
        """Whom this session's events go to; sessions made without send none."""
        self.owed: list[tuple[SessionTransaction | None, Callable[[], object], bool]] = []
        """Callbacks, each with the savepoint it was registered in (None: outside any) and
        whether it runs ahead of the others (:func:`on_commit`'s ``first``)."""
        self.before: list[tuple[SessionTransaction | None, Callable[[], Awaitable[object]]]] = []
        """Work to do in the transaction just before it commits (:func:`before_commit`)."""
        self.woke = False
        """Whether the last commit ran callbacks (their tasks get a turn; see transaction)."""
        self.later: list[Callable[[], object]] | None = None
        """While :func:`transaction` commits: where the callbacks not registered ``first`` wait
        until the tasks the first ones woke have had their turn (None: they run at once)."""


def _enclosing_savepoint(savepoint: SessionTransaction) -> SessionTransaction | None:
    outer = savepoint.parent
    while outer is not None and not outer.nested:
        outer = outer.parent
    return outer


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    if session.before and session.get_nested_transaction() is None:
        # Committed past transaction(): what the transaction still had to write would be lost.
        session.before = []
        raise RuntimeError("this transaction owes work before its commit: commit it with transaction()")


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    savepoint = session.get_nested_transaction()
    if savepoint is not None:
        # A savepoint was released: what it owes now waits on the transaction around it.
        outer = _enclosing_savepoint(savepoint)
        session.owed = [(outer if at is savepoint else at, fn, first) for at, fn, first in session.owed]
        session.before = [(outer if at is savepoint else at, fn) for at, fn in session.before]
        return
    owed, session.owed = session.owed, []
    session.woke = bool(owed)
    rest = [fn for _, fn, first in owed if not first]
    _run_callbacks([fn for _, fn, first in owed if first])
    if session.later is not None:
        session.later.extend(rest)
    else:
        _run_callbacks(rest)


def _run_callbacks(callbacks: Sequence[Callable[[], object]]) -> None:
    for fn in callbacks:
        try:
            fn()
        except Exception:  # the transaction has committed: its caller must not be told it failed
            log.exception("a callback after commit failed")


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    savepoint = session.get_nested_transaction()
    if savepoint is None:
        session.owed, session.before = [], []
    else:
        session.owed = [entry for entry in session.owed if entry[0] is not savepoint]
        session.before = [(at, fn) for at, fn in session.before if at is not savepoint]


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, ended: SessionTransaction) -> None:
    if ended.parent is None:
        # Closed without a commit or a rollback (the session was closed).
        session.owed, session.before = [], []


def _sync(session: AsyncSession) -> Session:
    sync = session.sync_session
    if not isinstance(sync, Session):
        raise TypeError("a session made by signoff.app.db.sessionmaker is needed here")
    return sync


def on_commit(session: AsyncSession, callback: Callable[[], object], *, first: bool = False) -> None:
    """Call ``callback`` once ``session``'s transaction has committed; never if it rolls back.

    Registered inside a savepoint, it is dropped if that savepoint rolls back. Callbacks run
    in the order they were registered, those registered ``first`` (waking waiting agents)
    ahead of the others; one that raises is logged and the others still run.
    """
    sync = _sync(session)
    if not sync.in_transaction():
        raise RuntimeError("on_commit outside a transaction: there is no commit to wait for")
    sync.owed.append((sync.get_nested_transaction(), callback, first))


def before_commit(session: AsyncSession, work: Callable[[], Awaitable[object]]) -> None:
    """Run ``work`` in ``session``'s transaction just before :func:`transaction` commits it:
    what it writes reads the transaction as it is left (rows written after this call too).

    Registered inside a savepoint, it is dropped if that savepoint rolls back. Committing the
    transaction other than through :func:`transaction` while work is owed raises.
    """
    sync = _sync(session)
    if not sync.in_transaction():
        raise RuntimeError("before_commit outside a transaction: there is no commit to wait for")
    sync.before.append((sync.get_nested_transaction(), work))


def subscribers(session: AsyncSession, event: str) -> Sequence[str]:
    """The webhooks ``event`` goes to from ``session`` (see :func:`sessionmaker`)."""
    return _sync(session).webhooks(event)


def wake_after_commit(session: AsyncSession, *, decided: Sequence[str] = (), queued: bool = False) -> None:
    """Once ``session``'s transaction commits, wake this process's agents waiting on the
    requests ``decided`` (with their answers, read just before the commit when the sessions'
    :class:`Wakeups` say how), and the outbox dispatcher if deliveries were ``queued``."""
    wakeups = _sync(session).wakeups
    if decided:
        ids, answers = tuple(decided), wakeups.answers
        found: dict[str, Any] = {}
        on_commit(session, functools.partial(wakeups.decided, ids, found), first=True)
        if answers is not None:

            async def answer() -> None:
                found.update(await answers(session, ids))

            before_commit(session, answer)
    if queued:
        on_commit(session, wakeups.queued)


def sessionmaker(
    engine: AsyncEngine,
    *,
    wakeups: Wakeups | None = None,
    webhooks: Subscribers | None = None,
    events: Events | None = None,
) -> async_sessionmaker[AsyncSession]:
    """Sessions on ``engine`` whose commits wake ``wakeups`` and whose events (request created,
    decided, grant created, revoked) go to ``events`` (nowhere without), for the webhooks
    ``webhooks`` names."""
    return async_sessionmaker(
        engine,
        class_=AsyncSession,
        sync_session_class=Session,
        expire_on_commit=False,
        wakeups=wakeups or Wakeups(),
        webhooks=webhooks or _no_webhooks,
        events=events or _no_events,
    )


def emit(session: AsyncSession, event: str, ids: Sequence[str], *, now: datetime) -> None:
    """Emit ``event`` about the requests or grants ``ids`` from ``session``'s unit of work (see
    :func:`sessionmaker`); what it causes is written in the same transaction."""
    if ids:
        _sync(session).events(session, event, ids, now)


async def _run_before_commit(session: AsyncSession) -> None:
    sync = session.sync_session
    if not isinstance(sync, Session):
        return
    while sync.before:  # work may owe more work
        owed, sync.before = sync.before, []
        for _, work in owed:
            await work()


@asynccontextmanager
async def transaction(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A unit of work: commit on success, roll back on any exception.

    After a commit that ran callbacks (:func:`on_commit`) the caller yields once, so the
    tasks they woke (agents waiting on a decision) answer before it goes on, and before the
    callbacks not registered ``first`` (logs, metrics) run.
    """
    session = factory()
    try:
        yield session
        if session.in_transaction():
            await _run_before_commit(session)
            sync = session.sync_session
            if not isinstance(sync, Session):
                await session.commit()
                return
            later: list[Callable[[], object]] = []
            sync.later = later
            try:
                await session.commit()
            finally:
                sync.later = None
            try:
                if sync.woke:
                    sync.woke = False
                    await asyncio.sleep(0)
            finally:  # committed: what it owes runs, even for a caller cancelled meanwhile
                _run_callbacks(later)
    except BaseException:
        await session.rollback()
        await session.close()
        raise
    # After the commit (or with no transaction at all) the session holds no connection:
    # closing it would only cost a greenlet hop on every request of the allow path.


class SchemaError(Exception):
    """The database's schema cannot be moved as asked; the message says why and what to do."""


def _alembic(url: str, pooling: Pooling) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = async_url(url)
    cfg.attributes["database_pooling"] = pooling
    return cfg


@functools.cache
def revisions() -> tuple[str, ...]:
    """This release's migration revisions, oldest first (the history is one line)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS))
    return tuple(reversed([s.revision for s in script.walk_revisions()]))


def head_revision() -> str:
    """The revision this release's code expects the database at."""
    return revisions()[-1]


async def schema_revision(connection: AsyncConnection) -> str | None:
    """The revision the database is at; None before the first migration."""
    from alembic.runtime.migration import MigrationContext

    heads = await connection.run_sync(lambda c: MigrationContext.configure(c).get_current_heads())
    return heads[0] if heads else None


def current_revision(url: str, *, pooling: Pooling = "none") -> str | None:
    """:func:`schema_revision` of ``url`` (call outside a running event loop)."""

    async def read() -> str | None:
        engine = create_engine(url, readonly=True, pooling=pooling)
        try:
            async with engine.connect() as conn:
                return await schema_revision(conn)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def _position(revision: str | None, url: str) -> int:
    """Where ``revision`` stands in :func:`revisions` (-1: none yet)."""
    if revision is None:
        return -1
    if revision not in revisions():
        raise SchemaError(
            f"the database at {_where(url)} is at revision {revision}, which this release does not know "
            "(a newer release migrated it): run that release, or downgrade with it first"
        )
    return revisions().index(revision)


def _where(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _target(revision: str) -> int:
    if revision in ("head", "heads"):
        return len(revisions()) - 1
    if revision == "base":
        return -1
    if revision not in revisions():
        raise SchemaError(
            f"there is no revision {revision!r}: name one of {', '.join(revisions())}, head or base"
        )
    return revisions().index(revision)


def migrate(url: str, revision: str = "head", *, pooling: Pooling = "none") -> str | None:
    """Upgrade ``url`` to ``revision`` (call outside a running event loop); returns the revision
    it is left at.

    Raises :class:`SchemaError` for a revision below the database's own (that is a
    :func:`downgrade`) and for a database at a revision this release does not know.
    """
    from alembic import command

    current = current_revision(url, pooling=pooling)
    target, now = _target(revision), _position(current, url)
    if target < now:
        raise SchemaError(
            f"the database at {_where(url)} is at {current}, past {revision}: an upgrade never goes back; "
            f"run `signoff db downgrade {revision}` to go back"
        )
    if target > now:
        command.upgrade(_alembic(url, pooling), revision)
    # Already there: nothing is written (a read-only database still starts, and says so).
    return current_revision(url, pooling=pooling)


def downgrade(url: str, revision: str, *, pooling: Pooling = "none") -> str | None:
    """Downgrade ``url`` to ``revision`` (call outside a running event loop); returns the
    revision it is left at.

    Raises :class:`SchemaError` when the database is below ``revision`` already, at a revision
    this release does not know, or holds data the downgrade would drop (nothing is changed:
    see :mod:`signoff.migrations.history`).
    """
    from alembic import command

    from signoff.migrations.history import DowngradeRefused

    current = current_revision(url, pooling=pooling)
    if _target(revision) > _position(current, url):
        raise SchemaError(
            f"the database at {_where(url)} is at {current or 'no revision'}, below {revision}: "
            f"run `signoff db upgrade {revision}` to go forward"
        )
    try:
        command.downgrade(_alembic(url, pooling), revision)
    except DowngradeRefused as exc:
        raise SchemaError(str(exc)) from None
    return current_revision(url, pooling=pooling)


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
