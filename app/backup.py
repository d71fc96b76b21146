"""``signoff db backup PATH``: a consistent copy of the database while the server writes.

SQLite: SQLite's online backup API copies the database in one step, inside one read
transaction, so the copy is the database as one commit left it, whatever the server
commits meanwhile (a WAL reader never blocks the writer, and is never blocked by it). The
copy is written next to PATH, made one self-contained file (rollback journal, no ``-wal``),
checked with ``PRAGMA integrity_check`` and only then renamed to PATH.

PostgreSQL: ``pg_dump`` takes a consistent snapshot itself; :func:`backup` says which
``pg_dump`` line to run (Signoff does not bundle PostgreSQL's client tools).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

__all__ = ["Backup", "BackupError", "backup", "pg_dump_line"]


class BackupError(Exception):
    """The backup cannot be made; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Backup:
    output: str
    """What to print on stdout: the summary of the copy, or the ``pg_dump`` line to run."""
    note: str | None = None
    """A line for stderr (PostgreSQL: how to run it and how to restore)."""


def backup(database_url: str, path: Path) -> Backup:
    """Back ``database_url`` up to ``path`` (SQLite), or say how (PostgreSQL)."""
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        line = pg_dump_line(database_url, path)
        target = shlex.quote(_libpq_url(database_url))
        restore = f"pg_restore --clean --if-exists --no-owner --dbname={target}"
        return Backup(
            line,
            "Signoff does not dump PostgreSQL itself: run the line above (the password from "
            f"PGPASSWORD or ~/.pgpass); restore with `{restore} {shlex.quote(str(path))}`",
        )
    if backend != "sqlite":
        raise BackupError(f"cannot back up a {backend} database: Signoff runs on SQLite or PostgreSQL")
    if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
        raise BackupError("SIGNOFF_DATABASE_URL is an in-memory SQLite database: there is no file to back up")
    return Backup(_sqlite_backup(Path(url.database), path))


def _libpq_url(database_url: str) -> str:
    """The URL as ``pg_dump`` takes it: plain ``postgresql://``, without the password."""
    url = make_url(database_url).set(drivername="postgresql", password=None)
    return url.render_as_string(hide_password=False)


def pg_dump_line(database_url: str, path: Path) -> str:
    """The ``pg_dump`` command that backs ``database_url`` up to ``path`` (custom format)."""
    return (
        f"pg_dump --format=custom --no-owner --file={shlex.quote(str(path))} "
        f"{shlex.quote(_libpq_url(database_url))}"
    )


def _sqlite_backup(source: Path, target: Path) -> str:
    if target.exists():
        raise BackupError(f"{target} exists: name a new file (a backup never overwrites one)")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory: create it, or name a file in one")
    if not source.is_file():
        raise BackupError(
            f"there is no SQLite database at {source}: check SIGNOFF_DATABASE_URL "
            "(the server's own, e.g. sqlite:////var/lib/signoff/signoff.db)"
        )
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=rw", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot open {source} ({exc}): check its permissions") from None
    try:
        dst = sqlite3.connect(partial)
        try:
            src.backup(dst)  # pages=-1: one step, one read transaction, one commit's state
            dst.execute("PRAGMA journal_mode=DELETE")
            (check,) = dst.execute("PRAGMA integrity_check").fetchone()
            if check != "ok":
                raise BackupError(f"the copy of {source} failed its integrity check ({check}); try again")
            requests = _count(dst, "confirmation_request")
            events = _count(dst, "audit_event")
            revision = _revision(dst)
        finally:
            dst.close()
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, target)
    except sqlite3.Error as exc:
        raise BackupError(f"the backup of {source} to {target} failed ({exc})") from None
    except OSError as exc:
        raise BackupError(f"cannot write {target} ({exc.strerror}): check the disk and permissions") from None
    finally:
        src.close()
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    size = target.stat().st_size
    return (
        f"backed up {source} to {target}: {requests} requests, {events} audit events, "
        f"revision {revision or 'none'}, {size / 2**20:.1f} MiB"
    )


def _count(conn: sqlite3.Connection, table: str) -> int:
    try:
        (n,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # a table name of ours
    except sqlite3.OperationalError:  # not migrated yet
        return 0
    return int(n)


def _revision(conn: sqlite3.Connection) -> str | None:
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError:
        return None
    return str(row[0]) if row else None
