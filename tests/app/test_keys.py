"""Agent keys: the per-process cache of live keys and the look-ups behind it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.keys import KeyCache, authenticate_cached, create_key, revoke_keys
from signoff.app.runtime import Runtime


class CountingSessions:
    """``runtime.reads`` that counts the sessions opened (each one a key look-up here)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.opened = 0

    @asynccontextmanager
    async def __call__(self) -> AsyncIterator[AsyncSession]:
        self.opened += 1
        async with self.runtime.reads() as session:
            await asyncio.sleep(0.05)  # a slow database: the other calls arrive meanwhile
            yield session


async def test_calls_missing_the_cache_together_share_one_look_up(runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        _, token = await create_key(s, "finance-bot", actor=Actor("test"))
    sessions = CountingSessions(runtime)
    cache = KeyCache()

    agents = await asyncio.gather(
        *(authenticate_cached(sessions, "db", token, cache=cache) for _ in range(200))  # type: ignore[arg-type]
    )

    assert agents == ["finance-bot"] * 200
    assert sessions.opened == 1
    # Cached now: no look-up at all.
    assert await authenticate_cached(sessions, "db", token, cache=cache) == "finance-bot"  # type: ignore[arg-type]
    assert sessions.opened == 1


async def test_a_revoked_key_is_looked_up_again_and_refused(runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        _, token = await create_key(s, "finance-bot", actor=Actor("test"))
    cache = KeyCache(seconds=0)  # nothing remembered
    assert await authenticate_cached(runtime.reads, "db", token, cache=cache) == "finance-bot"
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="finance-bot", actor=Actor("test"))
    assert await authenticate_cached(runtime.reads, "db", token, cache=cache) is None
