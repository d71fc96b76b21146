"""One SQLite file, one server.

A server on SQLite holds the database's one write connection and answers its waiting agents
from its own memory; a second server on the same file would queue every write behind the
first and leave its agents to the once-a-second poll. So ``signoff serve`` on a SQLite file
takes an exclusive ``flock`` on ``<database>.lock`` for the life of the process (the kernel
releases it when the process ends, however it ends), and a second one refuses to start.
Several servers share one database on PostgreSQL.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url

__all__ = ["ServerLockHeld", "hold", "lock_path"]

log = logging.getLogger("signoff")

_held: list[IO[str]] = []
"""The open lock files: the lock lasts as long as its file stays open."""


class ServerLockHeld(Exception):
    """Another server holds the SQLite database; the message says which and what to do."""


def lock_path(database_url: str) -> Path | None:
    """The lock file of a SQLite ``database_url`` (None: PostgreSQL, or SQLite in memory)."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    if url.query.get("mode") == "memory":
        return None
    return Path(url.database).resolve().with_name(f"{Path(url.database).name}.lock")


def hold(database_url: str) -> Path | None:
    """Take the server lock of a SQLite ``database_url`` for the rest of this process.

    Raises :class:`ServerLockHeld` when another process holds it. Returns the lock file
    (None when there is nothing to lock: PostgreSQL, or a directory that does not exist yet,
    which the database's own open then names).
    """
    path = lock_path(database_url)
    if path is None or not path.parent.is_dir():
        return None
    try:
        file = path.open("a+", encoding="utf-8")
    except OSError as exc:
        # A database in a directory this process cannot write to cannot be written either
        # (readiness says so); nothing to guard.
        log.warning("cannot take the server lock %s (%s): nothing stops a second server here", path, exc)
        return None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        pid = file.read().strip() or "unknown"
        file.close()
        database = path.with_name(path.name.removesuffix(".lock"))
        raise ServerLockHeld(
            f"another `signoff serve` (pid {pid}) is serving the SQLite database {database}: "
            "one SQLite file takes one server; stop that one first, or run several servers on "
            "PostgreSQL (SIGNOFF_DATABASE_URL=postgresql://…)"
        ) from None
    try:  # the pid is for the refusal's message; the lock holds without it (a full disk)
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
    except OSError:
        pass
    _held.append(file)
    return path
