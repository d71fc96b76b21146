"""One approval, one call, also for a client re-attaching by request id (DESIGN: "What an
approval authorizes"): once the call was reported executed, the request record still reads
``approved``, and a client that waits on it or reads it (a second process of the same call,
a wait re-attached after the first run reported) must not take it for an allow."""

from __future__ import annotations

import httpx
import pytest
import time_machine

from signoff.app.config import SignoffConfig
from signoff.hooks._gate import HttpReply, settle_request
from tests.redteam.support import POST, PRE, agent, attack_config, decide, pending, send


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


@pytest.mark.postgres
async def test_a_request_read_after_its_call_ran_allows_nothing(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    call = send()
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    before = await http.get(f"/v1/requests/{rid}/wait", headers=agent(agent_key))
    assert settle_request(HttpReply(before.status_code, before.content), request_id=rid).allowed
    ran = await http.post(POST, json={**call, "result": "paid"}, headers=agent(agent_key))
    assert ran.status_code == 200, ran.text
    for path in (f"/v1/requests/{rid}/wait", f"/v1/requests/{rid}"):
        after = await http.get(path, headers=agent(agent_key))
        assert after.json()["status"] == "approved"
        assert after.json()["executed_at"]
        decision = settle_request(HttpReply(after.status_code, after.content), request_id=rid)
        assert not decision.allowed, "a used approval re-read by request id allowed the call again"
        assert "used" in (decision.reason or "")


@pytest.mark.postgres
async def test_a_request_read_after_its_approval_lapsed_allows_nothing(
    http: httpx.AsyncClient, agent_key: str, clock: time_machine.Traveller
) -> None:
    """The approval allows its call for a while after the decision (``approval_valid_for``, 10
    minutes by default); a wait re-attached after that (an agent cut off for a quarter of an
    hour) reads ``approved`` still, and the server says in ``spent`` that it allows nothing:
    judged by the server's clock, not the client's."""
    call = send(91000)
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    fresh = await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))
    assert fresh.json()["spent"] is None
    assert settle_request(HttpReply(fresh.status_code, fresh.content), request_id=rid).allowed
    clock.shift(11 * 60)
    for path in (f"/v1/requests/{rid}/wait", f"/v1/requests/{rid}"):
        after = await http.get(path, headers=agent(agent_key))
        assert after.json()["status"] == "approved"
        assert "lapsed" in after.json()["spent"]
        decision = settle_request(HttpReply(after.status_code, after.content), request_id=rid)
        assert not decision.allowed, "a lapsed approval re-read by request id allowed the call"
        assert decision.reason == after.json()["spent"]
    replay = await http.post(PRE, json=call, headers=agent(agent_key))
    assert replay.json()["decision"] == "deny"
    assert "lapsed" in replay.json()["reason"]
