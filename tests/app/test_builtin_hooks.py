"""The built-in hooks behind the real endpoints: read-only switch, rate limit, result truncation,
call audit and session context."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import AuditEvent
from signoff.app.operators import decide
from signoff.app.requests.gate import GateService
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.fake import FakeChannel
from signoff.hooks.client import AsyncGateClient
from tests.conftest import Server
from tests.waiting import eventually

HOOKS = [
    {"type": "readonly_guard", "tools": ["db_*"]},
    {"type": "readonly_guard", "tools": ["slow_*"], "switch": "slow", "timeout": "1s"},
    {"type": "rate_limit", "tools": ["send_email"], "limit": 2, "window": "1h", "per": ["agent", "user"]},
    {"type": "confirmation_gate", "tools": ["pay_*"], "channel": "chat", "timeout": "5m"},
    {"type": "result_truncate", "tools": ["search*"], "max_chars": 100},
    {"type": "audit_log", "tools": ["*"]},
    {"type": "context_inject", "text": "Payments over 50k need a human.", "priority": 1},
    {"type": "context_inject", "text": "Be brief."},
]


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(
        {"channels": {"chat": {"type": "fake"}}, "agents": {"finance-bot": {"hooks": HOOKS}}},
        source="test.yaml",
    )


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def pre(http: httpx.AsyncClient, key: str, tool: str, **body: object) -> dict[str, object]:
    r = await http.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": tool, "arguments": {}, **body}, headers=auth(key)
    )
    assert r.status_code == 200, r.text
    data: dict[str, object] = r.json()
    return data


async def test_readonly_switch_blocks_matching_tools_until_turned_off(
    http: httpx.AsyncClient, agent_key: str, admin_headers: dict[str, str], runtime: Runtime
) -> None:
    assert (await pre(http, agent_key, "db_write"))["decision"] == "allow"
    on = await http.put(
        "/v1/admin/switches/read_only",
        json={"on": True, "operator": "alice", "reason": "incident 42"},
        headers=admin_headers,
    )
    assert on.status_code == 200
    assert on.json()["on"] is True
    blocked = await pre(http, agent_key, "db_write")
    assert blocked["decision"] == "deny"
    assert "read-only" in str(blocked["reason"])
    assert (await pre(http, agent_key, "read_file"))["decision"] == "allow"  # not covered by the guard
    await http.put(
        "/v1/admin/switches/read_only", json={"on": False, "operator": "alice"}, headers=admin_headers
    )
    assert (await pre(http, agent_key, "db_write"))["decision"] == "allow"
    listed = (await http.get("/v1/admin/switches", headers=admin_headers)).json()
    assert [(s["name"], s["on"], s["updated_by"]) for s in listed] == [("read_only", False, "alice")]
    async with runtime.sessions() as s:
        changes = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "switch_changed"))).all()
    assert [(e.detail["on"], e.actor_id) for e in changes] == [(True, "alice"), (False, "alice")]
    bad = await http.put(
        "/v1/admin/switches/no spaces!", json={"on": True, "operator": "a"}, headers=admin_headers
    )
    assert bad.status_code == 422


async def test_a_hook_is_cut_off_at_its_configured_timeout(
    http: httpx.AsyncClient, agent_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def slow_switch(self: GateService, name: str) -> bool:
        await asyncio.sleep(2)  # within the default timeout (5s), beyond the slow_* guard's (1s)
        return False

    monkeypatch.setattr(GateService, "is_switch_on", slow_switch)
    started = time.monotonic()
    slow = await pre(http, agent_key, "slow_query")
    assert time.monotonic() - started < 1.8
    assert slow["decision"] == "deny"
    assert slow["reason"] == "hook 'readonly_guard[slow_*]' did not answer within 1s"
    # The guard without a timeout of its own waits the default.
    assert (await pre(http, agent_key, "db_write"))["decision"] == "allow"


@pytest.mark.postgres
async def test_rate_limit_is_per_agent_and_user_and_survives_a_restart(
    http: httpx.AsyncClient, agent_key: str, settings: Settings, config: SignoffConfig
) -> None:
    answers = [(await pre(http, agent_key, "send_email", user_id="u1"))["decision"] for _ in range(3)]
    assert answers == ["allow", "allow", "deny"]
    limited = await pre(http, agent_key, "send_email", user_id="u1")
    assert "at most 2 calls" in str(limited["reason"])
    assert (await pre(http, agent_key, "send_email", user_id="u2"))["decision"] == "allow"

    # Another process on the same database sees the same bucket.
    other = Runtime.create(settings, config, channels={"chat": FakeChannel("chat")})
    try:
        async with Server(other) as s, httpx.AsyncClient(base_url=s.url) as http2:
            assert (await pre(http2, agent_key, "send_email", user_id="u1"))["decision"] == "deny"
    finally:
        await other.aclose()


async def test_rate_limit_runs_before_the_gate(http: httpx.AsyncClient, agent_key: str) -> None:
    # The guard has priority 10, the gate 100: a blocked call never becomes a request.
    assert (await pre(http, agent_key, "pay_x"))["decision"] == "pending"


async def test_post_tool_use_truncates_and_records_the_call(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    body = {
        "tool_name": "search_docs",
        "arguments": {"q": "refunds", "api_token": "s3cret"},
        "result": "x" * 250,
        "session_id": "s1",
        "tool_call_id": "c1",
    }
    r = (await http.post("/v1/hooks/post-tool-use", json=body, headers=auth(agent_key))).json()
    assert r["decision"] == "allow"
    assert r["modified"] is True
    assert r["result"].startswith("x" * 100)
    assert "[truncated 150 of 250 characters]" in r["result"]

    small = {**body, "tool_name": "read_file", "result": {"lines": 3}}
    r2 = (await http.post("/v1/hooks/post-tool-use", json=small, headers=auth(agent_key))).json()
    assert r2 == {
        "decision": "allow",
        "reason": None,
        "modified": False,
        "result": {"lines": 3},
        "receipt": None,  # no approved request closed by this report: nothing to sign
    }

    async with runtime.sessions() as s:
        calls = (
            await s.exec(
                select(AuditEvent).where(col(AuditEvent.action) == "tool_call").order_by(col(AuditEvent.seq))
            )
        ).all()
    assert [c.detail["tool"] for c in calls] == ["search_docs", "read_file"]
    assert calls[0].detail["arguments"] == {"q": "refunds", "api_token": "[redacted]"}
    assert calls[0].detail["result_chars"] == 250
    assert calls[0].actor_id == "finance-bot"


async def test_session_start_adds_context_in_priority_order(http: httpx.AsyncClient, agent_key: str) -> None:
    r = await http.post("/v1/hooks/session-start", json={"session_id": "s1"}, headers=auth(agent_key))
    assert r.json() == {
        "decision": "allow",
        "reason": None,
        "additional_context": "Payments over 50k need a human.\n\nBe brief.",
    }


async def test_unconfigured_agents_are_denied_at_every_hook_point(
    http: httpx.AsyncClient, runtime: Runtime
) -> None:
    from signoff.app.audit import Actor
    from signoff.app.db import transaction
    from signoff.app.keys import create_key

    async with transaction(runtime.sessions) as s:
        _, key = await create_key(s, "ghost", actor=Actor("test"))
    post = await http.post("/v1/hooks/post-tool-use", json={"tool_name": "x", "result": 1}, headers=auth(key))
    start = await http.post("/v1/hooks/session-start", json={}, headers=auth(key))
    assert post.json()["decision"] == "deny"
    assert start.json()["decision"] == "deny"


async def test_a_gated_call_sent_again_under_its_key_takes_no_second_token(settings: Settings) -> None:
    """Re-attaching to a request, or sending the call again to run it once approved (as the
    client does), is the same call: a limit of one counts it once. A new call pays."""
    limited = [
        {"type": "rate_limit", "tools": ["pay_*"], "limit": 1, "window": "1h"},
        {"type": "confirmation_gate", "tools": ["pay_*"], "channel": "chat", "timeout": "5m"},
    ]
    config = parse_config(
        {"channels": {"chat": {"type": "fake"}}, "agents": {"finance-bot": {"hooks": limited}}},
        source="test.yaml",
    )
    runtime = Runtime.create(settings, config, channels={"chat": FakeChannel("chat")})
    try:
        async with transaction(runtime.sessions) as session:
            _, key = await create_key(session, "finance-bot", actor=Actor("test"))
        async with Server(runtime) as server, AsyncGateClient(server.url, key, deadline=20) as client:
            asking = asyncio.create_task(client.pre_tool_use("pay_x", {"amount": 1}, idempotency_key="k1"))
            await eventually(lambda: runtime.hub.waiting == 1)
            async with httpx.AsyncClient(base_url=server.url) as http:
                again = await pre(http, key, "pay_x", arguments={"amount": 1}, idempotency_key="k1")
                assert again["decision"] == "pending", again
                async with transaction(runtime.sessions) as session:
                    rid = str(again["request_id"])
                    await decide(session, rid, verdict=Verdict.APPROVE, operator="ops", config=config)
                decision = await asyncio.wait_for(asking, 10)
                assert decision.allowed, decision.reason
                other = await pre(http, key, "pay_x", arguments={"amount": 2}, idempotency_key="k2")
        assert other["decision"] == "deny"
        assert "at most 1 calls" in str(other["reason"])
    finally:
        await runtime.aclose()
