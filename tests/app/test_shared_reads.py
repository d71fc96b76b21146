"""Waiters share their reads of a request (``signoff.app.waiters.Coalesced``); a read still
running when the server stops is stopped and gives its connection back before the database's
engine is closed (a read left running held a connection the garbage collector found later)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from signoff.app.runtime import Runtime
from signoff.app.waiters import Coalesced


class BlockingRead:
    """A read that holds its connection until it is stopped."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, ids: list[str]) -> Mapping[str, str]:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            self.released.set()  # the connection is given back
        return {}


async def test_a_caller_that_leaves_does_not_stop_the_read_the_others_share() -> None:
    read = BlockingRead()
    shared: Coalesced[str] = Coalesced(read)
    leaving, staying = asyncio.create_task(shared.get("r1")), asyncio.create_task(shared.get("r1"))
    await read.started.wait()
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    await asyncio.sleep(0)
    assert not read.released.is_set()
    assert not staying.done()
    await shared.aclose()
    assert read.released.is_set()
    assert staying.cancelled()


async def test_closing_the_runtime_stops_a_shared_read_before_the_engine(runtime: Runtime) -> None:
    read = BlockingRead()
    runtime.current = Coalesced(read)
    caller = asyncio.create_task(runtime.current.get("r1"))
    await read.started.wait()
    caller.cancel()  # every waiter left; the read runs on
    await asyncio.gather(caller, return_exceptions=True)
    await runtime.aclose()
    assert read.released.is_set()


async def test_closing_with_no_read_running_is_a_no_op() -> None:
    shared: Coalesced[str] = Coalesced(BlockingRead())
    await shared.aclose()
