"""Whether SIGNOFF_DATABASE_URL leads to a transaction pooler the settings do not declare.

Two sessions PostgreSQL holds open at once never share a server process. Through a pooler in
transaction (or statement) pooling they do: a connection gives its server connection back
after each transaction, and PgBouncer hands the one it got back last to the next client. So
two connections that each ask ``pg_backend_pid()`` in turn, both still open, and hear the same
pid, are pooled by transaction; distinct pids say nothing either way (a session pooler, or a
pooler that had another server connection idle), which is safe: only transaction pooling breaks
prepared statements and LISTEN.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.engine import make_url

__all__ = ["shared_server_process", "undeclared"]


async def _shared(dsn: str, timeout: float) -> int | None:
    import asyncpg

    first = await asyncpg.connect(dsn, statement_cache_size=0, timeout=timeout)
    try:
        second = await asyncpg.connect(dsn, statement_cache_size=0, timeout=timeout)
        try:
            one = await first.fetchval("SELECT pg_backend_pid()", timeout=timeout)
            two = await second.fetchval("SELECT pg_backend_pid()", timeout=timeout)
        finally:
            with contextlib.suppress(Exception):
                await second.close(timeout=timeout)
    finally:
        with contextlib.suppress(Exception):
            await first.close(timeout=timeout)
    return int(one) if one == two else None


def shared_server_process(url: str, *, timeout: float = 5.0) -> int | None:
    """The server process two open connections to ``url`` (PostgreSQL) shared: a sign of a
    transaction pooler; None when they did not. Call outside a running event loop."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return asyncio.run(_shared(dsn, timeout))


def undeclared(url: str, pid: int) -> str:
    """The one line that refuses to start on a transaction pooler the settings do not declare."""
    where = make_url(url).render_as_string(hide_password=True)
    return (
        f"SIGNOFF_DATABASE_URL ({where}) reaches PostgreSQL through a transaction pooler such as "
        f"PgBouncer (two open connections ran on one server process, {pid}), where prepared "
        "statements and LISTEN break: set SIGNOFF_DATABASE_POOLING=transaction, and "
        "SIGNOFF_LISTEN_DATABASE_URL to PostgreSQL itself"
    )
