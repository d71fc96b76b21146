"""Stop the server, let time pass, start it again: everything resumes from the database."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import Server

pytestmark = pytest.mark.postgres


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_restart_expires_overdue_resumes_delivery_and_waiters_reattach(
    settings: Settings, config: SignoffConfig, agent_key: str, admin_headers: dict[str, str], runtime: Runtime
) -> None:
    # First life: no background work, so nothing is delivered or expired yet.
    async with Server(runtime) as first, httpx.AsyncClient(base_url=first.url, timeout=10) as http:
        short = [
            (
                await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "quick_op", "arguments": {}},
                    headers=auth(agent_key),
                )
            ).json()["request_id"]
            for _ in range(3)
        ]
        long = [
            (
                await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "pay_x", "arguments": {"amount": 10**6}},
                    headers=auth(agent_key),
                )
            ).json()["request_id"]
            for _ in range(3)
        ]
        # A waiter is attached when the server goes away.
        waiter = asyncio.create_task(
            http.get(f"/v1/requests/{long[0]}/wait", params={"timeout": 30}, headers=auth(agent_key))
        )
        await asyncio.sleep(0.2)
    dropped = await asyncio.gather(waiter, return_exceptions=True)
    assert dropped  # the connection ended with the server (an error or a final answer)

    await asyncio.sleep(1.2)  # past the short gate's 1 s deadline while nothing runs

    second_channel = FakeChannel("chat")
    reborn = Runtime.create(settings, config, channels={"chat": second_channel})
    try:
        async with (
            Server(reborn, background=True) as second,
            httpx.AsyncClient(base_url=second.url, timeout=30) as http,
        ):
            # The sweep runs at start (in the background): overdue requests are expired.
            for rid in short:
                r = await http.get(f"/v1/requests/{rid}/wait", params={"timeout": 5}, headers=auth(agent_key))
                assert r.json()["status"] == "expired", r.json()
            # Pending ones are still pending, and the waiter re-attaches by id.
            waiter = asyncio.create_task(
                http.get(f"/v1/requests/{long[0]}/wait", params={"timeout": 30}, headers=auth(agent_key))
            )
            await asyncio.sleep(0.2)
            assert not waiter.done()
            decided = await http.post(
                f"/v1/admin/requests/{long[0]}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=admin_headers,
            )
            assert decided.status_code == 200, decided.text
            result = await asyncio.wait_for(waiter, 10)
            assert result.json()["status"] == "approved"
            # The outbox resumed: every card owed is posted, and decided ones are redrawn.
            for _ in range(100):
                posted = {c.request_id for c in second_channel.posts}
                redrawn = {c.request_id for _, c in second_channel.updates if c.status != "pending"}
                if posted >= set(short + long) and redrawn >= {long[0]}:
                    break
                await asyncio.sleep(0.05)
            assert posted >= set(short + long)
            assert second_channel.cards_for(long[0])[-1].status == "approved"
    finally:
        await reborn.aclose()


async def test_a_decision_in_another_process_reaches_the_waiter(
    settings: Settings, config: SignoffConfig, agent_key: str, runtime: Runtime
) -> None:
    """Two runtimes on one database stand in for two processes: no in-process wake-up between them."""
    other = Runtime.create(settings, config, channels={"chat": FakeChannel("chat")})
    try:
        async with (
            Server(runtime, background=True) as a,
            httpx.AsyncClient(base_url=a.url, timeout=30) as http,
        ):
            rid = (
                await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "pay_x", "arguments": {"amount": 10**6}},
                    headers=auth(agent_key),
                )
            ).json()["request_id"]
            waiter = asyncio.create_task(
                http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=auth(agent_key))
            )
            await asyncio.sleep(0.2)
            from signoff.app.db import transaction
            from signoff.app.operators import decide
            from signoff.channels import Verdict

            async with transaction(other.sessions) as s:
                await decide(s, rid, verdict=Verdict.APPROVE, operator="bob", config=config)
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await asyncio.wait_for(waiter, 10)
            assert result.json()["status"] == "approved"
            assert loop.time() - started < 5  # well inside the 30 s long-poll: the poller woke it
    finally:
        await other.aclose()
