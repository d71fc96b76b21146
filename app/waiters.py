"""Wakes agents waiting on a request the moment its decision commits.

In-process: a commit that decided requests calls :meth:`Hub.notify` (the runtime's
sessions wake it, see :class:`signoff.app.db.Wakeups`) with the waiters' answers, read in the
deciding transaction: a waiter woken by its own server's commit answers without reading.
Across processes: while anyone waits, one poller per process reads the ids
decided recently (one query, however many waiters) and wakes their waiters.

A waiter holds no database connection while parked, and reads its request through
:class:`Coalesced`: the waiters that read at once (thousands arriving, or woken by a burst
of decisions) share one query instead of each queueing on the connection pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from datetime import datetime, timedelta
from itertools import islice
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

__all__ = ["Coalesced", "Draining", "Hub", "listen_for_decisions"]

log = logging.getLogger("signoff.waiters")

RecentlyDecided = Callable[[datetime], Coroutine[Any, Any, list[tuple[str, datetime]]]]


V = TypeVar("V")


def _retrieved(fut: asyncio.Future[Any]) -> None:
    # A read whose callers all left still failed: nobody is owed its exception.
    if not fut.cancelled():
        fut.exception()


class Coalesced(Generic[V]):
    """Reads by id, many callers at a time in one query.

    Callers asking for the same id before its read starts share one future; the ids asked
    for while a read runs go into the next one (so a read started before a commit is never
    the answer of a caller that asked after it). One read runs at a time, of at most
    ``batch`` ids: however many callers, they hold at most one connection.
    """

    def __init__(
        self, read_many: Callable[[list[str]], Awaitable[Mapping[str, V]]], batch: int = 500
    ) -> None:
        self._read_many = read_many
        self._batch = batch
        self._queued: dict[str, asyncio.Future[V | None]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def get(self, key: str) -> V | None:
        """The value read for ``key`` (None: no such row), read after this call began."""
        fut = self._queued.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_retrieved)
            self._queued[key] = fut
            if self._reader is None:
                self._reader = asyncio.create_task(self._drain())
        # A caller that is cancelled (its client left) does not cancel the others' read.
        return await asyncio.shield(fut)

    async def aclose(self) -> None:
        """Stop the read in progress, if any, and wait until it has given its connection back;
        its callers are cancelled (the server is stopping)."""
        reader = self._reader
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _drain(self) -> None:
        batch: dict[str, asyncio.Future[V | None]] = {}
        try:
            while self._queued:
                batch = dict(islice(self._queued.items(), self._batch))
                for key in batch:
                    del self._queued[key]
                try:
                    found = await self._read_many(list(batch))
                except Exception as exc:
                    for fut in batch.values():
                        if not fut.done():
                            fut.set_exception(exc)
                else:
                    for key, fut in batch.items():
                        if not fut.done():
                            fut.set_result(found.get(key))
        except BaseException:  # cancelled (the server is stopping): nobody gets an answer
            for fut in [*batch.values(), *self._queued.values()]:
                fut.cancel()
            self._queued.clear()
            raise
        finally:
            self._reader = None


class Draining(Exception):
    """This server is stopping: a wait on an undecided request is answered 503 with
    ``Retry-After`` instead of parking, so that its agent re-attaches elsewhere."""


def _wake(woken: asyncio.Future[V | None], answer: V | None = None) -> None:
    if not woken.done():
        woken.set_result(answer)


TICK = 0.05
"""Seconds: the waits whose timeouts end within one tick share a timer and end at its start."""


class Hub(Generic[V]):
    """The agents waiting on requests in this process, by request id; ``V``: what a waiter
    woken by a commit of this process is answered."""

    def __init__(self) -> None:
        # A future per waiter, not an Event: thousands are parked at once, and an Event (its
        # deque, its own future once waited on) is several times the size. Likewise a lone
        # waiter on a request is kept as is, not in a set of its own, and the waiters whose
        # timeouts end within the same tick share one timer (a timer each, and the
        # ``asyncio.timeout`` around it, would be 0.7 KiB of every parked agent).
        self._waiters: dict[str, asyncio.Future[V | None] | set[asyncio.Future[V | None]]] = {}
        self._ticks: dict[int, set[asyncio.Future[V | None]]] = {}
        self.draining = False
        """Set by :meth:`drain`: waits no longer park."""

    @property
    def waiting(self) -> int:
        return sum(len(v) if isinstance(v, set) else 1 for v in self._waiters.values())

    def waited_on(self, request_ids: Iterable[str]) -> list[str]:
        """Those of ``request_ids`` somebody waits on here."""
        return [rid for rid in request_ids if rid in self._waiters]

    def _of(self, request_id: str) -> Iterable[asyncio.Future[V | None]]:
        found = self._waiters.get(request_id)
        return () if found is None else found if isinstance(found, set) else (found,)

    def notify(self, request_ids: Iterable[str], answers: Mapping[str, V] | None = None) -> None:
        """Wake the waiters on ``request_ids``, each with its request's answer in ``answers``
        if there is one (else None: the waiter reads its request)."""
        for rid in request_ids:
            answer = answers.get(rid) if answers else None
            for woken in self._of(rid):
                _wake(woken, answer)

    def subscribe(
        self, request_id: str, timeout: float | None = None
    ) -> tuple[asyncio.Future[V | None], int | None]:
        """A future done when ``request_id`` is decided (or the server drains): with the
        request's answer when a commit of this process decided it, else None; and done with
        None once ``timeout`` seconds have passed, or up to :data:`TICK` seconds before,
        never after. Await the future, then :meth:`unsubscribe` it with the tick returned."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[V | None] = loop.create_future()
        if self.draining:
            woken.set_result(None)
        bucket = self._waiters.setdefault(request_id, woken)
        if bucket is not woken:
            if isinstance(bucket, set):
                bucket.add(woken)
            else:
                self._waiters[request_id] = {bucket, woken}
        if timeout is None:
            return woken, None
        tick = math.floor((loop.time() + timeout) / TICK)
        timed = self._ticks.get(tick)
        if timed is None:
            timed = self._ticks[tick] = set()
            loop.call_at(tick * TICK, self._time_out, tick)
        timed.add(woken)
        return woken, tick

    def _time_out(self, tick: int) -> None:
        for woken in self._ticks.pop(tick, ()):
            _wake(woken)

    def drain(self) -> int:
        """Wake every waiter and park no more (the server is stopping); returns how many were
        waiting. Each woken wait answers with its request if it is decided, else raises
        :class:`Draining`."""
        self.draining = True
        for rid in self._waiters:
            for woken in self._of(rid):
                _wake(woken)
        return self.waiting

    def unsubscribe(self, request_id: str, woken: asyncio.Future[V | None], tick: int | None = None) -> None:
        bucket = self._waiters.get(request_id)
        if bucket is woken:
            del self._waiters[request_id]
        elif isinstance(bucket, set):
            bucket.discard(woken)
            if len(bucket) == 1:
                self._waiters[request_id] = bucket.pop()
        timed = self._ticks.get(tick) if tick is not None else None
        if timed is not None:
            timed.discard(woken)  # its timer stays, and finds the tick empty or gone

    async def poll_other_processes(
        self, recently_decided: RecentlyDecided, interval: float, overlap: float = 5.0
    ) -> None:
        """Wake waiters for decisions committed by other processes (runs until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            if not self._waiters:
                continue
            # A waiter reads its row after subscribing, so only decisions committed
            # since then matter; a fixed look-back covers commit lag and clock skew.
            since = datetime.now().astimezone() - timedelta(seconds=overlap)
            with contextlib.suppress(Exception):
                self.notify(rid for rid, _ in await recently_decided(since))


PROBE_PREFIX = "probe:"
"""A NOTIFY payload the listener sends itself (through the pooled engine) to learn that its
LISTEN hears what others send; never a request id."""


async def listen_for_decisions(
    dsn: str,
    hub: Hub[Any],
    channel: str,
    *,
    probe: Callable[[str], Awaitable[None]] | None = None,
    poll_seconds: float = 1.0,
    probe_seconds: float = 5.0,
    retry_seconds: float = 1.0,
) -> None:
    """PostgreSQL only: wake waiters on every replica as decisions commit (runs until cancelled).

    One connection per process LISTENs; while it is down (database restart) the
    poller in :meth:`Hub.poll_other_processes` still wakes waiters within seconds.

    ``probe(payload)`` NOTIFYs ``channel`` the way decisions do (the server's own engine):
    once listening, the listener sends itself one and says in the log whether it heard it.
    A LISTEN through a transaction pooler hears nothing, and then one warning line says
    that wakes fall back to the ``poll_seconds`` poll.
    """
    import asyncpg

    expected: dict[str, asyncio.Event] = {}

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(PROBE_PREFIX):
            if (heard := expected.get(payload)) is not None:
                heard.set()
            return
        hub.notify(payload.split(","))

    where = _where(dsn)
    while True:
        conn = None
        try:
            conn = await asyncpg.connect(dsn, statement_cache_size=0)
            await conn.add_listener(channel, on_notify)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            await _check(probe, expected, channel, where, poll_seconds, probe_seconds)
            await lost.wait()
            log.warning("lost the LISTEN connection to %s; reconnecting", where)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("cannot LISTEN for decisions at %s (%s); retrying", where, type(exc).__name__)
        finally:
            if conn is not None and not conn.is_closed():
                # A close that fails or is cancelled still leaves no connection open.
                try:
                    await conn.close(timeout=2)
                except Exception:
                    conn.terminate()
                except BaseException:
                    conn.terminate()
                    raise
        await asyncio.sleep(retry_seconds)


async def _check(
    probe: Callable[[str], Awaitable[None]] | None,
    expected: dict[str, asyncio.Event],
    channel: str,
    where: str,
    poll_seconds: float,
    probe_seconds: float,
) -> None:
    """Log whether the LISTEN just made hears a NOTIFY sent the way decisions send theirs."""
    if probe is None:
        log.info("listening for decisions on %s at %s", channel, where)
        return
    payload = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
    heard = expected[payload] = asyncio.Event()
    try:
        await probe(payload)
        async with asyncio.timeout(probe_seconds):
            await heard.wait()
    except TimeoutError:
        log.warning(
            "decisions made by other processes wake waiters only by the %g s poll: the LISTEN "
            "connection to %s heard no NOTIFY within %g s; point SIGNOFF_LISTEN_DATABASE_URL at "
            "PostgreSQL itself, not a transaction pooler (PgBouncer)",
            poll_seconds,
            where,
            probe_seconds,
        )
    except Exception as exc:  # the database is down: the LISTEN itself stands, unchecked
        log.info("listening for decisions on %s at %s (not checked: %s)", channel, where, type(exc).__name__)
    else:
        log.info("listening for decisions on %s at %s (heard its own NOTIFY)", channel, where)
    finally:
        expected.pop(payload, None)


def _where(dsn: str) -> str:
    parts = urlsplit(dsn)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
