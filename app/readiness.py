"""Whether this server can serve on its database, in the words ``/readyz`` and every 503 use.

A server is not ready while any of these holds, each named by one reason:

- the database's schema is not at this code's head (:data:`SCHEMA_BEHIND`, or a revision this
  release does not know);
- the database cannot be written (:data:`READ_ONLY`: a read-only file, a PostgreSQL standby or
  read-only transactions);
- the disk holding it is full (:data:`DISK_FULL`: for SQLite, less than
  :data:`DISK_FREE_MIN_BYTES` free on its file system; on either, the database saying so).

A 503 from a database error names the same reason (:meth:`Readiness.explain`), or
:data:`UNAVAILABLE` for any other (a refused connection, an exhausted pool).

``/readyz`` stays cheap: the schema's revision is read until it is right and then not again;
an error that looks like a missing table or column (a downgrade under a running server)
reads it again. Writability is a write that changes nothing (``UPDATE … WHERE 1 = 0``, rolled
back), and the free space one ``statvfs``.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from signoff.app.db import head_revision, is_sqlite, revisions, schema_revision

__all__ = [
    "DISK_FREE_MIN_BYTES",
    "DISK_FULL",
    "POOLED",
    "READ_ONLY",
    "SCHEMA_BEHIND",
    "UNAVAILABLE",
    "Readiness",
    "is_pooled",
]

SCHEMA_BEHIND = "the database schema is behind this server: run `signoff db upgrade`"
READ_ONLY = (
    "the database is read-only: make its file and directory writable by the server "
    "(PostgreSQL: point SIGNOFF_DATABASE_URL at the primary)"
)
DISK_FULL = "the disk holding the database is full: free space on it"
POOLED = (
    "the database's prepared statements did not last (a transaction pooler such as PgBouncer in "
    "front of it?): set SIGNOFF_DATABASE_POOLING=transaction"
)
UNAVAILABLE = "the database is unavailable; try again"
DISK_FREE_MIN_BYTES = 1024 * 1024
"""Less free space than this on a SQLite database's file system is a full disk."""
CHECK_SECONDS = 5.0
"""How long ``/readyz`` waits for the database before it names it unavailable."""

_PROBE = sa.text("UPDATE audit_head SET seq = seq WHERE 1 = 0")
_READ_ONLY_STATES = {"25006"}  # read_only_sql_transaction
_DISK_FULL_STATES = {"53100"}  # disk_full
_POOLED_STATES = {"26000", "42P05"}
"""invalid_sql_statement_name, duplicate_prepared_statement: a prepared statement of this
connection missing on its server connection, or one of another client's in the way."""
_MISSING_STATES = {"42703", "42P01", "0A000"}
"""undefined_column, undefined_table, and feature_not_supported: what asyncpg raises when a
schema change invalidated a statement it had prepared."""
_MISSING_WORDS = ("no such column", "no such table", "has no column named")


def _ahead(revision: str) -> str:
    return (
        f"the database schema is at revision {revision}, which this server does not know (a newer "
        "release migrated it): run that release"
    )


def _driver_error(exc: BaseException) -> BaseException:
    return getattr(exc, "orig", None) or exc


def _kind(exc: BaseException) -> str | None:
    """:data:`READ_ONLY`, :data:`DISK_FULL`, :data:`POOLED`, ``"missing"`` (a table or column is not there)
    or None, from a database error."""
    error = _driver_error(exc)
    name = str(getattr(error, "sqlite_errorname", ""))
    state = getattr(error, "sqlstate", None) or getattr(error.__cause__, "sqlstate", None)
    if name.startswith("SQLITE_READONLY") or state in _READ_ONLY_STATES:
        return READ_ONLY
    if name == "SQLITE_FULL" or state in _DISK_FULL_STATES:
        return DISK_FULL
    if state in _POOLED_STATES:
        return POOLED
    if state in _MISSING_STATES or any(w in str(error) for w in _MISSING_WORDS):
        return "missing"
    return None


def is_pooled(exc: BaseException) -> bool:
    """Whether ``exc`` is a prepared statement lost to, or colliding through, a transaction
    pooler the settings do not declare (:data:`POOLED`)."""
    return _kind(exc) == POOLED


class Readiness:
    """The checks behind ``/readyz`` and the reasons 503s give, for one server's database."""

    def __init__(self, engine: AsyncEngine, reads: AsyncEngine, url: str) -> None:
        """``engine`` writes (the probe), ``reads`` reads (the schema's revision)."""
        self._engine = engine
        self._reads = reads
        database = make_url(url).database if is_sqlite(url) else None
        self._directory = Path(database).resolve().parent if database and database != ":memory:" else None
        self._schema_ok = False

    async def _schema(self) -> str | None:
        """The schema's problem, if any; read from the database until there is none."""
        if self._schema_ok:
            return None
        async with self._reads.connect() as conn:
            revision = await schema_revision(conn)
        head = head_revision()
        if revision == head:
            self._schema_ok = True
            return None
        if revision is not None and revision not in revisions():
            return _ahead(revision)
        return SCHEMA_BEHIND

    async def _writable(self) -> str | None:
        try:
            async with self._engine.connect() as conn, conn.begin() as tx:
                await conn.execute(_PROBE)
                await tx.rollback()
        except Exception as exc:
            return self._from(exc)
        return None

    def _disk(self) -> str | None:
        if self._directory is None:
            return None
        try:
            free = shutil.disk_usage(self._directory).free
        except OSError:
            return None  # the write probe names what is wrong with the directory
        return DISK_FULL if free < DISK_FREE_MIN_BYTES else None

    def _from(self, exc: BaseException) -> str:
        kind = _kind(exc)
        if kind == "missing":
            return SCHEMA_BEHIND
        if kind is not None:
            return kind
        error = _driver_error(exc)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"{UNAVAILABLE} ({detail[:200]})"

    async def problems(self) -> list[str]:
        """What keeps this server from serving now (empty: ready)."""
        found: list[str] = []
        try:
            async with asyncio.timeout(CHECK_SECONDS):
                try:
                    schema = await self._schema()
                except Exception as exc:
                    return [self._from(exc)]
                if schema is not None:
                    found.append(schema)
                writable = await self._writable()
        except TimeoutError:
            return [f"{UNAVAILABLE} (no answer within {CHECK_SECONDS:g} s)"]
        disk = self._disk()
        for problem in (writable, disk):
            if problem is not None and problem not in found:
                found.append(problem)
        return found

    async def explain(self, exc: BaseException) -> str:
        """The reason to give for ``exc``, a database error met while serving."""
        kind = _kind(exc)
        if kind in (READ_ONLY, DISK_FULL, POOLED):
            return kind
        if kind == "missing":
            # Only a schema that moved under a running server gets here: read it again.
            self._schema_ok = False
            try:
                async with asyncio.timeout(CHECK_SECONDS):
                    schema = await self._schema()
            except Exception:
                schema = None
            if schema is not None:
                return schema
        return UNAVAILABLE
