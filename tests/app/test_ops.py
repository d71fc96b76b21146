"""Health, readiness, metrics and structured logs."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.logs import JsonFormatter, request_id
from signoff.app.metrics import reason_label
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, Server

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m is None or m["name"] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        if found == labels:
            return float(m["value"])
    return 0.0


async def test_metrics_count_calls_requests_and_decisions(
    http: httpx.AsyncClient, agent_key: str, admin_headers: dict[str, str]
) -> None:
    before = (await http.get("/metrics")).text
    agent = {"Authorization": f"Bearer {agent_key}"}
    await http.post("/v1/hooks/pre-tool-use", json={"tool_name": "read", "arguments": {}}, headers=agent)
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_x", "arguments": {"amount": 10**6}},
            headers=agent,
        )
    ).json()["request_id"]
    await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "reject", "operator": "bob"},
        headers=admin_headers,
    )
    after = (await http.get("/metrics")).text

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    calls = "signoff_gate_calls_total"
    assert delta(calls, point="pre_tool_use", agent="finance-bot", gate="", decision="allow") == 1
    assert delta(calls, point="pre_tool_use", agent="finance-bot", gate="payments", decision="pending") == 1
    assert delta("signoff_decisions_total", status="rejected") == 1
    assert delta("signoff_decision_seconds_count", status="rejected") == 1
    assert sample(after, "signoff_requests", status="rejected") == 1
    assert sample(after, "signoff_outbox_backlog") >= 0
    assert "# TYPE signoff_waiters gauge" in after


def test_reason_labels_stay_bounded() -> None:
    assert reason_label("body of 70001 bytes is over the limit") == "body of N bytes is over the limit"
    assert len(reason_label("x" * 500)) == 60


async def test_every_response_carries_a_request_id(http: httpx.AsyncClient) -> None:
    given = await http.get("/healthz", headers={"X-Request-ID": "trace-123"})
    assert given.headers["x-request-id"] == "trace-123"
    made = await http.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{16}", made.headers["x-request-id"])


def test_json_logs_carry_the_request_id() -> None:
    record = logging.LogRecord("signoff", logging.WARNING, __file__, 1, "card for %s failed", ("r1",), None)
    token = request_id.set("abc")
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        request_id.reset(token)
    assert line["message"] == "card for r1 failed"
    assert line["request_id"] == "abc"
    assert line["level"] == "warning"


@pytest.fixture
async def unreachable(config: SignoffConfig) -> AsyncIterator[Runtime]:
    settings = Settings(database_url="postgresql://postgres@127.0.0.1:1/nowhere", admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    rt = Runtime.create(settings, config)
    yield rt
    await rt.aclose()


async def test_readyz_fails_while_the_database_is_unreachable(unreachable: Runtime) -> None:
    async with Server(unreachable) as s, httpx.AsyncClient(base_url=s.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert "database" in ready.json()["reason"]
        # And an agent gets a clear 503, not a 500, while it lasts.
        r = await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "x", "arguments": {}},
            headers={"Authorization": "Bearer sk_signoff_x_y"},
        )
        assert r.status_code == 503
