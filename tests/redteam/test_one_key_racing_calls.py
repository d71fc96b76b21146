"""One idempotency key, one call (DESIGN: "What an approval authorizes").

Many first asks racing under one new key, half of them for another call, make one request:
every call answered pending is the request's own call, the others are denied, and once it is
approved only that call is allowed (however many replays of either call race the approval's
first allow).
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import PRE, agent, attack_config, decide, request_count, send


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


@pytest.mark.postgres
async def test_calls_racing_under_one_new_key_make_one_request_for_one_call(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    calls = [send(90000, idempotency_key=key), send(90001, idempotency_key=key)]
    before = await request_count(runtime)
    answers = await asyncio.gather(
        *(http.post(PRE, json=calls[i % 2], headers=agent(agent_key)) for i in range(16))
    )
    bodies = [a.json() for a in answers]
    assert await request_count(runtime) == before + 1
    ids = {b["request_id"] for b in bodies if b["decision"] == "pending"}
    assert len(ids) == 1, bodies
    pending_amounts = {
        calls[i % 2]["arguments"]["amount"] for i, b in enumerate(bodies) if b["decision"] == "pending"
    }
    assert len(pending_amounts) == 1, "only the request's own call waits on it"
    assert all(b["decision"] in ("pending", "deny") for b in bodies)
    (rid,) = ids
    assert (await decide(http, rid)).status_code == 200
    replays = await asyncio.gather(
        *(http.post(PRE, json=calls[i % 2], headers=agent(agent_key)) for i in range(16))
    )
    allowed = {
        calls[i % 2]["arguments"]["amount"] for i, r in enumerate(replays) if r.json()["decision"] == "allow"
    }
    assert allowed == pending_amounts


@pytest.mark.postgres
async def test_one_call_racing_under_one_new_key_for_two_users_waits_and_runs_for_one(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    key = f"race-{uuid.uuid4().hex}"
    users = ["alice@example.com", "mallory@example.com"]
    calls = [send(90000, idempotency_key=key, user_id=u) for u in users]
    before = await request_count(runtime)
    answers = await asyncio.gather(
        *(http.post(PRE, json=calls[i % 2], headers=agent(agent_key)) for i in range(16))
    )
    bodies = [a.json() for a in answers]
    assert await request_count(runtime) == before + 1
    assert all(b["decision"] in ("pending", "deny") for b in bodies), bodies
    waiting = {(users[i % 2], b["request_id"]) for i, b in enumerate(bodies) if b["decision"] == "pending"}
    assert len(waiting) == 1, bodies
    ((own, rid),) = waiting
    assert (await decide(http, rid)).status_code == 200
    replays = await asyncio.gather(
        *(http.post(PRE, json=calls[i % 2], headers=agent(agent_key)) for i in range(16))
    )
    assert {users[i % 2] for i, r in enumerate(replays) if r.json()["decision"] == "allow"} == {own}
