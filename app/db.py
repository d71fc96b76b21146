"""Engines, the request-scoped session (the one place that commits) and migrations."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.bodies import read_json
from signoff.app.sqlite import create_engine as sqlite_engine

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


def create_engine(url: str, *, readonly: bool = False, **kw: Any) -> AsyncEngine:
    """An engine; on SQLite, ``readonly`` engines take no write lock when they begin (see
    :func:`signoff.app.sqlite.create_engine`)."""
    url = async_url(url)
    # Rows stored before the input rules (or edited by hand) read as what can be shown.
    kw.setdefault("json_deserializer", read_json)
    if not is_sqlite(url):
        kw.setdefault("pool_size", 20)
        kw.setdefault("max_overflow", 20)
        kw.setdefault("pool_pre_ping", True)
        return create_async_engine(url, **kw)
    return sqlite_engine(url, readonly=readonly, **kw)


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
