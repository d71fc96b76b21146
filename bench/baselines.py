"""Bare FastAPI baselines, served exactly like ``signoff serve`` (uvicorn, one worker, same options).

- ``echo``: ``POST /echo`` returns the JSON body it was sent.
- ``sqlite``: ``POST /insert`` inserts one row (an id, the tool name, the
  arguments as JSON, a timestamp) with aiosqlite, Signoff's own SQLite driver,
  on a WAL database with Signoff's pragmas: ``synchronous=FULL``, so each insert
  is synced before it is answered, as Signoff syncs its requests
  (``SIGNOFF_SQLITE_SYNC=normal`` in the environment: ``NORMAL``, as Signoff then);
  one autocommitted statement per request, so one sync per insert (no group commit).
- ``postgres``: the same insert through an asyncpg pool, on the server's defaults
  (``synchronous_commit=on``: each commit is flushed before it returns, as Signoff's).

    python -m bench.baselines echo|sqlite|postgres --port P [--database URL-or-path]
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI

TABLE = """
CREATE TABLE IF NOT EXISTS item (
    id VARCHAR(32) PRIMARY KEY,
    tool_name VARCHAR(500) NOT NULL,
    arguments TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
)
"""


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    return app


def sqlite_app(path: str) -> FastAPI:
    import aiosqlite

    state: dict[str, aiosqlite.Connection] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = await aiosqlite.connect(path, isolation_level=None)
        await db.execute("PRAGMA journal_mode=WAL")
        sync = "NORMAL" if os.environ.get("SIGNOFF_SQLITE_SYNC", "").lower() == "normal" else "FULL"
        await db.execute(f"PRAGMA synchronous={sync}")
        await db.execute(TABLE)
        state["db"] = db
        yield
        await db.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/insert")
    async def insert(body: dict[str, Any]) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        await state["db"].execute(
            "INSERT INTO item (id, tool_name, arguments, created_at) VALUES (?, ?, ?, ?)",
            (rid, str(body.get("tool_name")), json.dumps(body.get("arguments")), datetime.now(UTC)),
        )
        return {"id": rid}

    return app


def postgres_app(dsn: str) -> FastAPI:
    import asyncpg

    state: dict[str, asyncpg.Pool] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=20)
        await pool.execute(TABLE.replace("TIMESTAMP", "TIMESTAMPTZ"))
        state["pool"] = pool
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/insert")
    async def insert(body: dict[str, Any]) -> dict[str, Any]:
        rid = uuid.uuid4().hex
        await state["pool"].execute(
            "INSERT INTO item (id, tool_name, arguments, created_at) VALUES ($1, $2, $3, $4)",
            rid,
            str(body.get("tool_name")),
            json.dumps(body.get("arguments")),
            datetime.now(UTC),
        )
        return {"id": rid}

    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["echo", "sqlite", "postgres"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--database", default="")
    args = p.parse_args()
    if args.kind == "echo":
        app = echo_app()
    elif args.kind == "sqlite":
        app = sqlite_app(args.database)
    else:
        app = postgres_app(args.database)
    # The same uvicorn options as `signoff serve` (app/cli.py).
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="info",
        access_log=False,
        timeout_graceful_shutdown=3,
        backlog=8192,
    )


if __name__ == "__main__":
    main()
