"""Alembic environment: async engines, the URL from the caller or SIGNOFF_DATABASE_URL."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import signoff.app.models  # noqa: F401  (registers the tables)
from signoff.app.db import async_url, create_engine

config = context.config
target_metadata = SQLModel.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("SIGNOFF_DATABASE_URL")
    if not url:
        from signoff.app.settings import Settings

        url = Settings().database_url
    return async_url(str(url))


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(_url())
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
