"""Engines, the request-scoped session (the one place that commits) and migrations."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

__all__ = ["async_url", "create_engine", "is_sqlite", "migrate", "sessionmaker", "transaction"]

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


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
    """An engine; on SQLite, ``readonly`` engines take no write lock when they begin."""
    url = async_url(url)
    if not is_sqlite(url):
        kw.setdefault("pool_size", 20)
        kw.setdefault("max_overflow", 20)
        kw.setdefault("pool_pre_ping", True)
        return create_async_engine(url, **kw)

    engine = create_async_engine(url, connect_args={"timeout": 30}, **kw)

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
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # WAL readers never wait for the writer; only writers queue for the lock.
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


@asynccontextmanager
async def transaction(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """One transaction: commit on success, roll back on any exception."""
    async with factory() as session:
        try:
            yield session
            await session.commit()
        except BaseException:
            await session.rollback()
            raise


def migrate(url: str, revision: str = "head") -> None:
    """Apply the Alembic migrations to ``url`` (call outside a running event loop)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = async_url(url)
    command.upgrade(cfg, revision)
