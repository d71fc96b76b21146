"""The agent API over real HTTP."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from signoff.app.audit import Actor
from signoff.app.config import parse_config
from signoff.app.db import migrate, transaction
from signoff.app.keys import create_key, revoke_keys
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.fake import FakeChannel
from signoff.hooks.client import AsyncGateClient
from tests.app.test_pre_tool_use import answer, post_both_ways
from tests.conftest import (
    ADMIN_TOKEN,
    DEFAULT_CONFIG,
    PG_URL,
    Server,
    _drop_pg_database,
    _ensure_pg_database,
)
from tests.waiting import eventually


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def gate(http: httpx.AsyncClient, key: str, **body: object) -> httpx.Response:
    return await http.post("/v1/hooks/pre-tool-use", json=body, headers=auth(key))


async def test_no_gate_matches_allows_without_a_request(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    small = await gate(http, agent_key, tool_name="pay_invoice", arguments={"amount": 10})
    other = await gate(http, agent_key, tool_name="read_file", arguments={"path": "/etc/hosts"})
    for r in (small, other):
        assert r.status_code == 200
        assert r.json()["decision"] == "allow"
        assert r.json()["request_id"] is None
    listed = await http.get(
        "/v1/admin/requests", headers={"Authorization": "Bearer test-admin-token-0123456789"}
    )
    assert listed.json() == []


async def test_matching_gate_creates_a_pending_request(http: httpx.AsyncClient, agent_key: str) -> None:
    r = await gate(
        http,
        agent_key,
        tool_name="pay_invoice",
        arguments={"amount": 60000, "api_token": "s3cret"},
        user_id="carol",
        session_id="s1",
        tool_call_id="t1",
    )
    assert r.status_code == 200
    body = r.json()
    assert body["decision"] == "pending"
    req = body["request"]
    assert req["id"] == body["request_id"]
    assert req["status"] == "pending"
    assert req["agent_id"] == "finance-bot"
    assert req["arguments"] == {"amount": 60000, "api_token": "[redacted]"}
    assert req["gate"] == "payments"
    assert req["quorum"] == 1
    read = await http.get(f"/v1/requests/{req['id']}", headers=auth(agent_key))
    assert read.json()["status"] == "pending"


async def test_same_idempotency_key_returns_the_same_request(http: httpx.AsyncClient, agent_key: str) -> None:
    first = await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000}, idempotency_key="k-1")
    again = await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000}, idempotency_key="k-1")
    other = await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000}, idempotency_key="k-2")
    assert first.json()["request_id"] == again.json()["request_id"]
    assert other.json()["request_id"] != first.json()["request_id"]


@pytest.mark.postgres
async def test_session_and_tool_call_id_are_an_idempotency_key(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    bodies = [
        {"tool_name": "pay_x", "arguments": {"amount": 90000}, "session_id": "s", "tool_call_id": "c"}
        for _ in range(5)
    ]
    # Sent at once: they race to insert and must still agree on one request.
    answers = await asyncio.gather(*(gate(http, agent_key, **b) for b in bodies))  # type: ignore[arg-type]
    ids = {a.json()["request_id"] for a in answers}
    assert len(ids) == 1
    assert all(a.json()["decision"] == "pending" for a in answers)


async def test_replay_after_decision_answers_with_the_decision(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    r = await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000}, idempotency_key="k")
    rid = r.json()["request_id"]
    async with transaction(runtime.sessions) as s:
        await decide(
            s, rid, verdict=Verdict.REJECT, operator="alice", config=runtime.config, reason="too much"
        )
    again = await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000}, idempotency_key="k")
    assert again.json()["decision"] == "deny"
    # The same words the client library uses for a decision it waited for.
    assert again.json()["reason"] == "Rejected by Alice (web): too much"


async def test_wait_returns_the_moment_the_request_is_decided(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000})).json()["request_id"]
    started = time.monotonic()
    waiter = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=auth(agent_key))
    )
    await eventually(lambda: runtime.hub.waiting == 1)  # parked in its long-poll
    assert not waiter.done()
    async with transaction(runtime.sessions) as s:
        await decide(s, rid, verdict=Verdict.APPROVE, operator="bob", config=runtime.config)
    resp = await asyncio.wait_for(waiter, 10)
    assert resp.json()["status"] == "approved"
    assert resp.json()["decided_by"] == {"channel": "web", "user_id": "bob", "name": "Bob"}
    # Woken by the commit, not by the 30 s timeout.
    assert time.monotonic() - started < 5


async def test_wait_times_out_with_the_current_state(http: httpx.AsyncClient, agent_key: str) -> None:
    rid = (await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000})).json()["request_id"]
    resp = await http.get(f"/v1/requests/{rid}/wait", params={"timeout": 0.2}, headers=auth(agent_key))
    assert resp.status_code == 200
    assert resp.json()["status"] == "pending"
    too_long = await http.get(f"/v1/requests/{rid}/wait", params={"timeout": 61}, headers=auth(agent_key))
    assert too_long.status_code == 422


async def test_cancel_once_then_conflict(http: httpx.AsyncClient, agent_key: str) -> None:
    rid = (await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000})).json()["request_id"]
    first = await http.post(f"/v1/requests/{rid}/cancel", headers=auth(agent_key))
    assert first.status_code == 200
    assert first.json()["status"] == "cancelled"
    second = await http.post(f"/v1/requests/{rid}/cancel", headers=auth(agent_key))
    assert second.status_code == 409
    assert "already cancelled" in second.json()["detail"]


async def test_keys_are_checked(http: httpx.AsyncClient, agent_key: str, runtime: Runtime) -> None:
    body = {"tool_name": "pay_x", "arguments": {}}
    assert (await http.post("/v1/hooks/pre-tool-use", json=body)).status_code == 401
    bad = await http.post("/v1/hooks/pre-tool-use", json=body, headers=auth("sk_signoff_nope_nope"))
    assert bad.status_code == 401
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="finance-bot", actor=Actor("test"))
    revoked = await http.post("/v1/hooks/pre-tool-use", json=body, headers=auth(agent_key))
    assert revoked.status_code == 401
    assert "revoked" in revoked.json()["detail"]


async def test_an_agent_sees_only_its_own_requests(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    from signoff.app.keys import create_key

    rid = (await gate(http, agent_key, tool_name="pay_x", arguments={"amount": 90000})).json()["request_id"]
    async with transaction(runtime.sessions) as s:
        _, other = await create_key(s, "other-bot", actor=Actor("test"))
    for method, path in [
        ("GET", f"/v1/requests/{rid}"),
        ("GET", f"/v1/requests/{rid}/wait?timeout=0"),
        ("POST", f"/v1/requests/{rid}/cancel"),
    ]:
        r = await http.request(method, path, headers=auth(other))
        assert r.status_code == 404, path
    assert (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()["status"] == "pending"


async def test_unconfigured_agent_is_denied(http: httpx.AsyncClient, runtime: Runtime) -> None:
    from signoff.app.keys import create_key

    async with transaction(runtime.sessions) as s:
        _, key = await create_key(s, "ghost", actor=Actor("test"))
    r = await gate(http, key, tool_name="anything", arguments={})
    assert r.json()["decision"] == "deny"
    assert "ghost" in r.json()["reason"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 422, ""),
        (b'{"arguments": {}}', 422, "tool_name"),
        (b'{"tool_name": "", "arguments": {}}', 422, "tool_name"),
        (b'{"tool_name": "pay_x", "arguments": [1, 2]}', 422, "arguments"),
        (
            b'{"tool_name": "pay_x", "arguments": ' + b'{"a":' * 40 + b"1" + b"}" * 40 + b"}",
            422,
            "nested deeper",
        ),
        (b'{"tool_name": "pay_x", "arguments": {"blob": "' + b"x" * 40000 + b'"}}', 422, "bytes as JSON"),
        (b'{"tool_name": "pay_x", "arguments": {"blob": "' + b"x" * 70000 + b'"}}', 413, "larger than"),
    ],
)
async def test_bad_input_is_a_clear_4xx_and_changes_nothing(
    http: httpx.AsyncClient,
    agent_key: str,
    admin_headers: dict[str, str],
    body: bytes,
    status: int,
    fragment: str,
) -> None:
    r = await http.post(
        "/v1/hooks/pre-tool-use",
        content=body,
        headers={**auth(agent_key), "content-type": "application/json"},
    )
    assert r.status_code == status, r.text
    assert fragment in r.text
    assert (await http.get("/v1/admin/requests", headers=admin_headers)).json() == []


async def test_unknown_request_is_404(http: httpx.AsyncClient, agent_key: str) -> None:
    r = await http.get("/v1/requests/does-not-exist", headers=auth(agent_key))
    assert r.status_code == 404


async def test_a_reused_key_cannot_carry_a_different_call(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    body = {"tool_name": "pay_x", "arguments": {"amount": 90000, "api_token": "a"}, "idempotency_key": "k"}
    rid = (await gate(http, agent_key, **body)).json()["request_id"]
    async with transaction(runtime.sessions) as s:
        await decide(s, rid, verdict=Verdict.APPROVE, operator="alice", config=runtime.config)
    assert (await gate(http, agent_key, **body)).json()["decision"] == "allow"
    for changed in (
        {**body, "arguments": {"amount": 9000000, "api_token": "a"}},
        {**body, "arguments": {"amount": 90000, "api_token": "b"}},  # differs only in a redacted value
        {**body, "tool_name": "pay_y"},
    ):
        r = (await gate(http, agent_key, **changed)).json()
        assert r["decision"] == "deny", changed
        assert "different call" in r["reason"]


class Breakable:
    """A database of the test's own that can be made unreachable and brought back."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "postgres":
            u = make_url(PG_URL)
            self.name = f"{u.database}_cut_{os.getpid()}"
            self.url = u.set(database=self.name).render_as_string(hide_password=False)
            _ensure_pg_database(self.url)
        else:
            self.path = tmp_path / "cut.db"
            self.url = f"sqlite:///{self.path}"
        migrate(self.url)

    async def _admin(self, sql: str) -> None:
        import asyncpg

        u = make_url(PG_URL)
        conn = await asyncpg.connect(user=u.username or "postgres", host=u.host, port=u.port or 5432)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    async def cut(self, runtime: Runtime) -> None:
        if self.kind == "postgres":
            # Renamed, with every connection to it ended: each new one is refused.
            await self._admin(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{self.name}'"
            )
            await self._admin(f'ALTER DATABASE "{self.name}" RENAME TO "{self.name}_away"')
        else:
            await runtime.engine.dispose()
            await runtime.reads.kw["bind"].dispose()
            for suffix in ("", "-wal", "-shm"):
                moved = Path(f"{self.path}{suffix}")
                if moved.exists():
                    moved.rename(f"{moved}.away")
            self.path.mkdir()  # a directory where the file was: it cannot be opened

    async def restore(self) -> None:
        if self.kind == "postgres":
            await self._admin(f'ALTER DATABASE "{self.name}_away" RENAME TO "{self.name}"')
        else:
            self.path.rmdir()
            for suffix in ("", "-wal", "-shm"):
                moved = Path(f"{self.path}{suffix}.away")
                if moved.exists():
                    moved.rename(f"{self.path}{suffix}")

    def drop(self) -> None:
        if self.kind == "postgres":
            _drop_pg_database(self.url)
            _drop_pg_database(make_url(self.url).set(database=f"{self.name}_away").render_as_string())


@pytest.fixture(params=["sqlite", "postgres"])
def breakable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Breakable]:
    db = Breakable(request.param, tmp_path)
    yield db
    db.drop()


@pytest.mark.postgres
async def test_an_unreachable_database_is_a_503_to_retry_on_every_agent_endpoint(
    breakable: Breakable,
) -> None:
    raw = copy.deepcopy(DEFAULT_CONFIG)
    raw["agents"]["finance-bot"]["hooks"].append({"type": "audit_log", "tools": ["pay_*"]})
    settings = Settings(database_url=breakable.url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    runtime = Runtime.create(settings, parse_config(raw), channels={"chat": FakeChannel("chat")})
    # Keys stay trusted from the cache meanwhile, so the calls reach the hooks.
    runtime.keys.seconds = 600.0
    try:
        async with transaction(runtime.sessions) as s:
            _, key = await create_key(s, "finance-bot", actor=Actor("test"))
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            rid = (await gate(http, key, tool_name="pay_x", arguments={"amount": 90000})).json()["request_id"]
            await breakable.cut(runtime)

            payment = {"tool_name": "pay_x", "arguments": {"amount": 90000}}
            calls = [
                ("POST", "/v1/hooks/pre-tool-use", payment),
                ("POST", "/v1/hooks/post-tool-use", {**payment, "result": "paid"}),
                ("GET", f"/v1/requests/{rid}", None),
                ("GET", f"/v1/requests/{rid}/wait?timeout=1", None),
                ("POST", f"/v1/requests/{rid}/cancel", None),
            ]
            for method, path, body in calls:
                r = await http.request(method, path, json=body, headers=auth(key))
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.headers["Retry-After"] == "1", path
                assert "unavailable" in r.json()["detail"], path
            # Unknown keys cannot be checked either: retry, not 401.
            stranger = await http.post("/v1/hooks/pre-tool-use", json=payment, headers=auth("sk_signoff_a_b"))
            assert stranger.status_code == 503
            # The same answers, byte for byte, to a body sent chunked.
            for token in (key, "sk_signoff_a_b"):
                headers = {**auth(token), "content-type": "application/json", "x-request-id": "down"}
                declared, streamed = await post_both_ways(http, json.dumps(payment).encode(), headers)
                assert declared.status_code == 503
                assert answer(declared) == answer(streamed)

            # The client keeps trying within its deadline, and gets through once the database is back.
            async with AsyncGateClient(
                server.url, key, deadline=30, backoff_initial=0.1, backoff_max=0.5
            ) as client:
                asked = asyncio.create_task(client.pre_tool_use("pay_y", {"amount": 70000}, wait=False))
                await asyncio.sleep(1.0)
                assert not asked.done(), "the client gave up while the database was down"
                await breakable.restore()
                decision = await asyncio.wait_for(asked, 20)
            assert decision.pending, decision
            state = await http.get(f"/v1/requests/{decision.request_id}", headers=auth(key))
            assert state.json()["status"] == "pending"
            assert (await http.get(f"/v1/requests/{rid}", headers=auth(key))).json()["status"] == "pending"
    finally:
        await runtime.aclose()
