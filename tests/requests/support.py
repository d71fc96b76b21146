"""What the request-lifecycle tests share: the app served in process with a configuration file
it can reload, and a database held by another connection (a stall)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import sqlalchemy as sa
import yaml
from sqlalchemy.engine import make_url

from signoff.app.audit import Actor
from signoff.app.db import is_sqlite, transaction
from signoff.app.keys import create_key
from signoff.app.main import create_app
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, TABLES

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

LOCK_MODES = {"approval_grant": "ACCESS EXCLUSIVE", "confirmation_request": "EXCLUSIVE"}
"""How a stall locks each table on PostgreSQL: the grants against reading too (a gate looks
them up before it asks), the requests against writing (a gate writes its request, or finds
the one its key holds, by inserting)."""


def write_config(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")


@dataclass
class Served:
    """The app in process (no sockets), its runtime, and one agent's key."""

    runtime: Runtime
    http: httpx.AsyncClient
    agent_headers: dict[str, str]
    config_path: Path

    async def reload(self, data: dict[str, Any]) -> None:
        """Put ``data`` in force as an operator does: write the file, ``POST .../config/reload``."""
        write_config(self.config_path, data)
        done = await self.http.post("/v1/admin/config/reload", headers=ADMIN)
        assert done.status_code == 200, done.text

    async def reset(self, data: dict[str, Any], agent: str) -> None:
        """Start afresh on the same server: every row gone, ``data`` in force, a new key for
        ``agent`` (much cheaper than a new server for each of many short runs)."""
        async with transaction(self.runtime.sessions) as session:
            for table in TABLES:
                await session.exec(sa.text(f"DELETE FROM {table}"))
            await session.exec(
                sa.text("UPDATE audit_head SET seq = 0, last_hash = :h"), params={"h": "0" * 64}
            )
            if session.bind.dialect.name == "postgresql":  # event numbers from 1 again
                await session.exec(sa.text("ALTER SEQUENCE audit_event_seq_seq RESTART"))
            _, token = await create_key(session, agent, actor=Actor("test"))
        self.agent_headers = {"Authorization": f"Bearer {token}"}
        if yaml.safe_load(self.config_path.read_text(encoding="utf-8")) != data:
            await self.reload(data)

    def hook_time_limit(self, agent: str, seconds: float) -> None:
        """Give each of ``agent``'s hooks ``seconds`` to answer (until the next reload)."""
        self.runtime.registries[agent].timeout = seconds


@asynccontextmanager
async def serving(url: str, config_path: Path, data: dict[str, Any], agent: str) -> AsyncIterator[Served]:
    """The app on ``url`` under the configuration ``data`` (written to ``config_path``, so that
    it can be reloaded), with a key for ``agent``."""
    write_config(config_path, data)
    settings = Settings(database_url=url, admin_token=ADMIN_TOKEN, config=config_path)  # type: ignore[arg-type]
    runtime = Runtime.create(settings, channels={"chat": FakeChannel("chat")})
    try:
        async with transaction(runtime.sessions) as session:
            _, token = await create_key(session, agent, actor=Actor("test"))
        app = create_app(runtime, background=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff", timeout=30) as http:
            yield Served(runtime, http, {"Authorization": f"Bearer {token}"}, config_path)
    finally:
        await runtime.aclose()


class Stall:
    """Another connection holding the database for ``seconds`` from entry: on SQLite the write
    lock (``BEGIN IMMEDIATE``), on PostgreSQL a lock on ``table`` (see :data:`LOCK_MODES`).
    Leaving the block waits for the lock to be released, or with ``early=True`` releases it
    at once (whatever it held up has answered by then)."""

    def __init__(
        self, url: str, seconds: float, table: str = "confirmation_request", *, early: bool = False
    ) -> None:
        self._url, self._seconds, self._table, self._early = url, seconds, table, early
        self._sqlite: sqlite3.Connection | None = None
        self._postgres: asyncpg.Connection | None = None
        self._held: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stall:
        if is_sqlite(self._url):
            self._sqlite = sqlite3.connect(
                make_url(self._url).database or "", isolation_level=None, timeout=10
            )
            self._sqlite.execute("BEGIN IMMEDIATE")
        else:
            dsn = make_url(self._url).set(drivername="postgresql").render_as_string(hide_password=False)
            self._postgres = await asyncpg.connect(dsn)
            await self._postgres.execute("BEGIN")
            await self._postgres.execute(f"LOCK TABLE {self._table} IN {LOCK_MODES[self._table]} MODE")
        self._held = asyncio.create_task(self._hold())
        return self

    async def _hold(self) -> None:
        try:
            await asyncio.sleep(self._seconds)
        finally:
            await self._release()

    async def _release(self) -> None:
        sqlite, self._sqlite = self._sqlite, None
        postgres, self._postgres = self._postgres, None
        if sqlite is not None:
            sqlite.rollback()
            sqlite.close()
        if postgres is not None:
            await postgres.execute("ROLLBACK")
            await postgres.close()

    async def __aexit__(self, *exc: object) -> None:
        assert self._held is not None
        try:
            if self._early:
                self._held.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._held
            else:
                await self._held
        finally:
            await self._release()  # if the task was cancelled before it began
