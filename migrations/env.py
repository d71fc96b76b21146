"""Alembic environment: async engines, the URL from the caller or SIGNOFF_DATABASE_URL.

Every run is one transaction on both databases (SQLite's DDL is transactional too): a
migration that fails part way changes nothing. On SQLite foreign keys are not enforced while
tables are rebuilt (a batch ``ALTER`` copies a table and drops the original, which rows of
other tables point at); they are checked once, before the commit.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import sqlalchemy as sa
from alembic import context
from alembic.runtime.migration import RevisionStep
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import signoff.app.models  # noqa: F401  (registers the tables)
from signoff.app.db import Pooling, async_url, create_engine, is_sqlite
from signoff.migrations.history import refuse_lossy_downgrade, repair_renumbered_0004

config = context.config
target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("SIGNOFF_DATABASE_URL")
    if not url:
        from signoff.app.settings import Settings

        url = Settings().database_url
    return async_url(str(url))


def _pooling() -> Pooling:
    """``transaction`` behind a transaction pooler (signoff.app.db.create_engine)."""
    given = config.attributes.get("database_pooling") or os.environ.get("SIGNOFF_DATABASE_POOLING")
    return "transaction" if given == "transaction" else "none"


def _destination() -> str | None:
    """The revision this command goes to, as given (``head``, ``base``, ``0005``, ``-1``);
    None for commands that go nowhere (``current``, ``check``)."""
    given = context.get_context().opts.get("destination_rev")
    return None if given is None else str(given)


def _prepare(connection: Connection) -> None:
    """Before an upgrade or a downgrade: repair a renumbered 0004, refuse a downgrade that
    would drop data (see :mod:`signoff.migrations.history`)."""
    migration = context.get_context()
    repair_renumbered_0004(migration, context.script)
    # The steps run_migrations is about to take, computed as it computes them.
    plan = migration._migrations_fn  # alembic's own plan for this command
    if plan is None:
        return
    steps = plan(migration.get_current_heads(), migration)
    down = [s.revision.revision for s in steps if isinstance(s, RevisionStep) and not s.is_upgrade]
    if down:
        refuse_lossy_downgrade(connection, down, _destination())


def _check_foreign_keys(connection: Connection) -> None:
    broken = connection.execute(sa.text("PRAGMA foreign_key_check")).all()
    if broken:
        rows = ", ".join(f"{table} row {rowid} -> {parent}" for table, rowid, parent, _ in broken[:5])
        raise RuntimeError(f"the migration left rows pointing at nothing ({rows}); nothing was changed")


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,
        compare_type=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        if _destination() is not None:  # upgrade, downgrade, stamp
            _prepare(connection)
        context.run_migrations()
        if sqlite:
            _check_foreign_keys(connection)


async def _run_async() -> None:
    url = _url()
    engine = create_engine(url, pooling=_pooling())
    if is_sqlite(url):

        @event.listens_for(engine.sync_engine, "connect")
        def _foreign_keys_off(dbapi_conn: Any, _record: Any) -> None:
            # After the engine's own listener, which turns them on; see the module.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=OFF")
            cur.close()

    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
