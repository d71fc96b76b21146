"""Counting what a piece of work asks of the database: the units of work (transactions) it
opens and the statements in each, by the asyncio task that ran them.

Listened for on the engines themselves (``begin`` and ``before_cursor_execute``), so nothing
escapes the count: a session of either sessionmaker, a bare connection, the Core. The task
is what tells one HTTP request's work from another's (uvicorn runs each in a task of its own,
and its after-the-reply work in the same one) and from the background's (the outbox
dispatcher, an agent's wait).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import Pool

from signoff.app.runtime import Runtime


@dataclass
class Unit:
    """One transaction: the SQL it ran, in order."""

    statements: list[str] = field(default_factory=list)

    def reads_of(self, table: str) -> int:
        """SELECTs that read ``table`` (FROM or JOIN)."""
        pattern = re.compile(rf"\b(FROM|JOIN)\s+\"?{table}\"?\b", re.IGNORECASE)
        return sum(
            1 for s in self.statements if s.lstrip().upper().startswith("SELECT") and pattern.search(s)
        )

    def writes_to(self, table: str) -> bool:
        return self.writes_of(table) > 0

    def writes_of(self, table: str) -> int:
        """INSERTs into and UPDATEs of ``table``."""
        pattern = re.compile(rf"^\s*(INSERT INTO|UPDATE)\s+\"?{table}\"?\b", re.IGNORECASE)
        return sum(1 for s in self.statements if pattern.search(s))


@dataclass
class Tally:
    """Units of work by the task that opened them."""

    by_task: dict[asyncio.Task[Any], list[Unit]] = field(default_factory=dict)
    active: bool = True

    def tasks_writing(self, table: str) -> list[asyncio.Task[Any]]:
        return [t for t, units in self.by_task.items() if any(u.writes_to(table) for u in units)]

    def _units(self) -> list[Unit]:
        task = asyncio.current_task()
        assert task is not None, "a statement outside any task"
        return self.by_task.setdefault(task, [])

    def begin(self, _conn: Connection) -> None:
        if self.active:
            self._units().append(Unit())

    def statement(self, _conn: Connection, _cursor: object, sql: str, *_: object) -> None:
        if not self.active or sql.lstrip().upper().startswith("BEGIN"):
            return  # the transaction's own BEGIN (SQLite's writers send theirs from a listener)
        units = self._units()
        if not units:  # a statement outside a transaction (autocommit): a unit of its own
            units.append(Unit())
        units[-1].statements.append(sql)


def engines(runtime: Runtime) -> list[Engine]:
    """Every engine the runtime's units of work and reads run on."""
    found = [runtime.engine.sync_engine]
    reads = runtime.reads.kw.get("bind")
    # On PostgreSQL the reads are the same engine with options (its events are the engine's).
    if reads is not None and reads.sync_engine.pool is not runtime.engine.sync_engine.pool:
        found.append(reads.sync_engine)
    return found


_counting: dict[Pool, Tally] = {}
"""The tally each engine's statements go to, by the engine's pool (an engine with options,
as PostgreSQL's reads are, shares its pool)."""


# Listened for once, on the class, as this module is imported (collection, before any engine
# exists): adding a listener to an engine while another task is inside its ``begin`` (SQLite's
# writers await their BEGIN from a listener) breaks that task's iteration over the listeners.
@event.listens_for(Engine, "begin")
def _begin(conn: Connection) -> None:
    if (tally := _counting.get(conn.engine.pool)) is not None:
        tally.begin(conn)


@event.listens_for(Engine, "before_cursor_execute")
def _statement(conn: Connection, cursor: object, sql: str, *rest: object) -> None:
    if (tally := _counting.get(conn.engine.pool)) is not None:
        tally.statement(conn, cursor, sql, *rest)


@contextmanager
def counting(runtime: Runtime) -> Iterator[Tally]:
    """Count the runtime's units of work while the block runs."""
    tally = Tally()
    pools = [e.pool for e in engines(runtime)]
    for pool in pools:
        _counting[pool] = tally
    try:
        yield tally
    finally:
        tally.active = False
        for pool in pools:
            _counting.pop(pool, None)
