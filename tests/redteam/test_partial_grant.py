"""A call one gate's grant stands in for while another gate's approver is asked is allowed
only if the grant still holds once the approval comes: the agent's client sends the call
again when ``/wait`` says approved, and Signoff's decision kernel answers it over the grants
in force then (a grant revoked or expired while the call waited denies)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from signoff.hooks.client import AsyncGateClient
from tests.conftest import Server
from tests.redteam.support import ADMIN, PRE, agent, attack_config, decide, pending, send


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


async def test_a_grant_revoked_while_the_call_waits_still_lets_the_call_run(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, server: Server
) -> None:
    # A payment of the treasury range: 'sends' (alice, offers a session grant) and 'treasury'
    # (carol, no grants). Alice approves with the session grant, carol approves once.
    first = await pending(http, agent_key, send(2_000_000))
    assert (
        await decide(http, first, grant={"scope": "session", "for": "1h", "same": ["to"]})
    ).status_code == 200
    assert (await decide(http, first, operator="carol")).status_code == 200
    [grant] = (await http.get("/v1/admin/grants", params={"active": "true"}, headers=ADMIN)).json()
    assert grant["gate"] == "sends"

    # The next payment to the same payee in the session: the grant stands in for 'sends', so
    # only 'treasury' is asked. The agent's own client submits it and waits.
    call = send(3_000_000)
    async with AsyncGateClient(server.url, agent_key, deadline=20, poll_timeout=5) as client:
        waiting = asyncio.create_task(
            client.pre_tool_use(
                call["tool_name"],
                call["arguments"],
                session_id=call["session_id"],
                idempotency_key=call["idempotency_key"],
            )
        )
        rid = None
        for _ in range(200):
            listed = (
                await http.get("/v1/admin/requests", params={"status": "pending"}, headers=ADMIN)
            ).json()
            rows = listed if isinstance(listed, list) else listed.get("requests", listed.get("items", []))
            if rows:
                rid = rows[0]["id"]
                break
            await asyncio.sleep(0.02)
        assert rid is not None
        shown = (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()
        assert [g["name"] for g in shown["gates"]] == ["treasury"]

        # The operator revokes the grant: from the next call on, it should allow nothing.
        assert (await http.delete(f"/v1/admin/grants/{grant['id']}", headers=ADMIN)).status_code == 200
        # Carol approves the treasury gate she was asked about.
        assert (await decide(http, rid, operator="carol")).status_code == 200
        decision = await waiting

    # Asked again, the server itself denies the call: 'sends' is no longer covered.
    replay = (await http.post(PRE, json=call, headers=agent(agent_key))).json()
    assert replay["decision"] == "deny", replay
    # …yet the waiting agent was released with an allow.
    [after] = (await http.get("/v1/admin/grants", headers=ADMIN)).json()
    assert not decision.allowed, (
        f"the agent was allowed ({decision.reason!r}) on a revoked grant (uses counted: {after['uses']})"
    )
