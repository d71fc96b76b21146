"""One approval, one call, also for a client re-attaching by request id (DESIGN: "What an
approval authorizes"): once the call was reported executed, the request record still reads
``approved``, and a client that waits on it or reads it (a second process of the same call,
a wait re-attached after the first run reported) must not take it for an allow."""

from __future__ import annotations

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.hooks._gate import HttpReply, settle_request
from tests.redteam.support import POST, agent, attack_config, decide, pending, send


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
