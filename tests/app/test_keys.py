"""Agent keys: the runtime's cache of live keys and the look-ups behind it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Actor
from signoff.app.db import migrate, transaction
from signoff.app.keys import AgentKeys, authenticate, create_key, revoke_keys
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN


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


async def new_key(runtime: Runtime) -> str:
    async with transaction(runtime.sessions) as s:
        _, token = await create_key(s, "finance-bot", actor=Actor("test"))
    return token


async def test_calls_missing_the_cache_together_share_one_look_up(runtime: Runtime) -> None:
    token = await new_key(runtime)
    sessions = CountingSessions(runtime)
    keys = AgentKeys(sessions)  # type: ignore[arg-type]

    agents = await asyncio.gather(*(keys.agent(token) for _ in range(200)))

    assert agents == ["finance-bot"] * 200
    assert sessions.opened == 1
    # Cached now: no look-up at all.
    assert await keys.agent(token) == "finance-bot"
    assert sessions.opened == 1


async def test_a_revoked_key_is_looked_up_again_and_refused(runtime: Runtime) -> None:
    token = await new_key(runtime)
    keys = AgentKeys(runtime.reads, seconds=0)  # nothing remembered
    assert await keys.agent(token) == "finance-bot"
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="finance-bot", actor=Actor("test"))
    assert await keys.agent(token) is None
    async with runtime.reads() as s:
        assert await authenticate(s, token) is None


async def test_a_remembered_key_is_trusted_until_forgotten(runtime: Runtime) -> None:
    token = await new_key(runtime)
    sessions = CountingSessions(runtime)
    keys = AgentKeys(sessions, seconds=600)  # type: ignore[arg-type]
    assert await keys.agent(token) == "finance-bot"
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="finance-bot", actor=Actor("test"))

    assert await keys.agent(token) == "finance-bot"  # within the revocation bound
    assert sessions.opened == 1
    keys.forget()
    assert await keys.agent(token) is None
    assert sessions.opened == 2


async def test_a_key_remembered_by_one_runtime_is_not_trusted_by_another_database(
    runtime: Runtime, tmp_path: Path
) -> None:
    token = await new_key(runtime)
    assert await runtime.keys.agent(token) == "finance-bot"
    url = f"sqlite:///{tmp_path / 'other.db'}"
    await asyncio.to_thread(migrate, url)
    settings = Settings(database_url=url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    other = Runtime.create(settings, runtime.config, channels={"chat": FakeChannel("chat")})
    try:
        assert await other.keys.agent(token) is None
    finally:
        await other.aclose()
