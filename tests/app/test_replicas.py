"""Two real ``signoff serve`` processes on one PostgreSQL database behave as one service."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.audit import Actor
from signoff.app.db import create_engine, sessionmaker, transaction
from signoff.app.keys import create_key
from signoff.app.models import AuditEvent
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.slack_support import SECRET
from tests.conftest import ADMIN_TOKEN, _truncate, free_port

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
channels:
  ops-slack:
    type: slack
    bot_token: {bot_token}
    signing_secret: {secret}
    channel: {channel}
    base_url: {base_url}
  pager-slack:
    type: slack
    bot_token: {bot_token}
    signing_secret: {secret}
    channel: C0PAGER
    base_url: {base_url}
people:
  alice: {{name: Alice, web: alice, slack: W0ALICE}}
  carol: {{name: Carol, slack: W0CAROL}}
agents:
  finance-bot:
    hooks:
      - type: confirmation_gate
        tools: ["pay_*"]
        channel: ops-slack
        approvers: [alice]
        timeout: 30m
      - type: confirmation_gate
        tools: ["quick_*"]
        channel: ops-slack
        timeout: 1s
      - type: confirmation_gate
        name: transfers
        tools: ["transfer_*"]
        channel: ops-slack
        approvers: [alice]
        timeout: 30m
        grants: [{{scope: agent, for: 1h}}]
      - type: confirmation_gate
        name: nudged
        tools: ["nudge_*"]
        channel: ops-slack
        approvers: [alice]
        timeout: 5m
        remind: [3s]
        escalate: [{{after: 5s, channel: pager-slack, approvers: [carol]}}]
"""


@pytest.fixture
def pg(postgres_url: str) -> str:
    _truncate(postgres_url)
    return postgres_url


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    fake.conversations.add("C0PAGER")
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


@contextlib.asynccontextmanager
async def replica(env: dict[str, str], port: int, log: Path) -> AsyncIterator[str]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "signoff.app.cli", "serve", "--port", str(port), "--no-migrate"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            # Waited for off the loop: the fake Slack in this loop answers the sends the
            # server finishes while it stops.
            await asyncio.to_thread(proc.wait, 10)


async def ready(url: str) -> None:
    deadline = time.monotonic() + 60  # a cold start on a busy machine
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not become ready")


@pytest.fixture
async def replicas(pg: str, fake_slack: FakeSlack, tmp_path: Path) -> AsyncIterator[tuple[str, str, str]]:
    config = tmp_path / "signoff.yaml"
    config.write_text(
        CONFIG.format(bot_token=BOT_TOKEN, secret=SECRET, channel=CHANNEL, base_url=fake_slack.base_url)
    )
    env = {
        **os.environ,
        "SIGNOFF_DATABASE_URL": pg,
        "SIGNOFF_CONFIG": str(config),
        "SIGNOFF_ADMIN_TOKEN": ADMIN_TOKEN,
        # Long enough that only LISTEN/NOTIFY can wake a waiter in time.
        "SIGNOFF_CROSS_PROCESS_POLL_SECONDS": "30",
    }
    engine = create_engine(pg)
    async with transaction(sessionmaker(engine)) as s:
        _, key = await create_key(s, "finance-bot", actor=Actor("test"))
    await engine.dispose()
    async with (
        replica(env, free_port(), tmp_path / "a.log") as a,
        replica(env, free_port(), tmp_path / "b.log") as b,
    ):
        await asyncio.gather(ready(a), ready(b))
        yield a, b, key


async def test_a_decision_on_one_replica_wakes_a_waiter_on_the_other(replicas: tuple[str, str, str]) -> None:
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        rid = (
            await http.post(
                f"{a}/v1/hooks/pre-tool-use", json={"tool_name": "pay_x", "arguments": {}}, headers=agent
            )
        ).json()["request_id"]
        waiter = asyncio.create_task(
            http.get(f"{b}/v1/requests/{rid}/wait", params={"timeout": 25}, headers=agent)
        )
        await asyncio.sleep(0.3)
        assert not waiter.done()
        loop = asyncio.get_running_loop()
        started = loop.time()
        decided = await http.post(
            f"{a}/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert decided.status_code == 200
        result = await asyncio.wait_for(waiter, 20)
        elapsed = loop.time() - started
    assert result.json()["status"] == "approved"
    assert elapsed < 5, f"woken after {elapsed:.2f}s: NOTIFY did not arrive (the fallback poll is 30 s)"


async def test_each_card_is_posted_once_and_the_sweep_expires_once(
    replicas: tuple[str, str, str], fake_slack: FakeSlack, pg: str
) -> None:
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        ids = []
        for i in range(20):
            url = a if i % 2 else b
            body = {"tool_name": "quick_op", "arguments": {"n": i}}
            ids.append(
                (await http.post(f"{url}/v1/hooks/pre-tool-use", json=body, headers=agent)).json()[
                    "request_id"
                ]
            )
        # Both replicas' dispatchers and sweeps run; wait for every card and every expiry.
        for _ in range(200):
            posted = list(fake_slack.calls_to("chat.postMessage"))
            states = [
                (await http.get(f"{a}/v1/requests/{rid}", headers=agent)).json()["status"] for rid in ids
            ]
            if len(posted) >= len(ids) and all(s == "expired" for s in states):
                break
            await asyncio.sleep(0.1)
    assert all(s == "expired" for s in states), states
    texts = [str(c.args.get("blocks")) for c in fake_slack.calls_to("chat.postMessage")]
    per_request = {rid: sum(rid in t for t in texts) for rid in ids}
    assert per_request == dict.fromkeys(ids, 1), per_request

    engine = create_engine(pg)
    async with sessionmaker(engine)() as s:
        expired = (
            await s.exec(select(AuditEvent.request_id).where(col(AuditEvent.action) == "expired"))
        ).all()
    await engine.dispose()
    assert sorted(expired) == sorted(ids), "each request expired exactly once across both sweeps"


async def test_an_approval_used_on_one_replica_allows_nothing_on_the_other(
    replicas: tuple[str, str, str],
) -> None:
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    call = {"tool_name": "pay_x", "arguments": {"n": 1}, "idempotency_key": "pay-x-1"}
    async with httpx.AsyncClient(timeout=30) as http:
        rid = (await http.post(f"{a}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()["request_id"]
        decided = await http.post(
            f"{a}/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert decided.status_code == 200
        assert (await http.post(f"{b}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()[
            "decision"
        ] == "allow"
        report = await http.post(
            f"{b}/v1/hooks/post-tool-use", json={**call, "result": "paid"}, headers=agent
        )
        assert report.status_code == 200
        replay = (await http.post(f"{a}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    assert replay["decision"] == "deny"
    assert "used" in replay["reason"]


async def test_a_grant_revoked_on_one_replica_stops_the_next_call_on_both(
    replicas: tuple[str, str, str], pg: str
) -> None:
    """Calls stream to both replicas while one of them revokes the grant: every allow is one
    counted use, and no call that starts after the revocation answered is allowed. (A call that
    found the grant just before it was revoked is denied when its use finds the row revoked.)"""
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    call = {"tool_name": "transfer_x", "arguments": {"to": "acme"}}
    async with httpx.AsyncClient(timeout=30) as http:
        rid = (await http.post(f"{a}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()["request_id"]
        decided = await http.post(
            f"{b}/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice", "grant": {"scope": "agent", "for": "1h"}},
            headers=admin,
        )
        assert decided.status_code == 200, decided.text
        [grant] = (await http.get(f"{a}/v1/admin/grants", params={"active": "true"}, headers=admin)).json()

        async def ask(url: str) -> str:
            answer = (await http.post(f"{url}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
            if answer["decision"] == "allow":
                assert answer["grant_id"] == grant["id"]
            elif answer["decision"] == "deny":
                assert f"grant {grant['id']} ended" in answer["reason"]
            else:
                assert answer["decision"] == "pending", answer
            return str(answer["decision"])

        async def revoke() -> None:
            await asyncio.sleep(0.05)
            r = await http.delete(f"{a}/v1/admin/grants/{grant['id']}", headers=admin)
            assert r.status_code == 200, r.text

        before = await asyncio.gather(*(ask(a if i % 2 else b) for i in range(10)))
        assert before == ["allow"] * 10
        racing = await asyncio.gather(*(ask(a if i % 2 else b) for i in range(30)), revoke())
        after = await asyncio.gather(*(ask(a if i % 2 else b) for i in range(10)))
        assert after == ["pending"] * 10
        [row] = (await http.get(f"{b}/v1/admin/grants", params={"active": "false"}, headers=admin)).json()
    allowed = 10 + sum(1 for d in racing[:30] if d == "allow")
    assert row["uses"] == allowed


async def test_each_reminder_and_escalation_goes_once_from_two_replicas(
    replicas: tuple[str, str, str], fake_slack: FakeSlack, pg: str
) -> None:
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        ids = []
        for i in range(10):
            body = {"tool_name": "nudge_op", "arguments": {"n": i}}
            answer = await http.post(f"{a if i % 2 else b}/v1/hooks/pre-tool-use", json=body, headers=agent)
            ids.append(answer.json()["request_id"])

    def replies() -> list[dict[str, object]]:
        return [m for m in fake_slack.messages.values() if m.get("thread_ts")]

    def escalated() -> list[str]:
        return [
            str(c.args.get("blocks"))
            for c in fake_slack.calls_to("chat.postMessage")
            if c.args["channel"] == "C0PAGER"
        ]

    for _ in range(300):
        if len(replies()) >= len(ids) and len(escalated()) >= len(ids):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(2)  # both dispatchers keep passing: nothing goes out twice
    texts = [str(m["text"]) for m in replies()]
    assert {rid: sum(rid in t for t in texts) for rid in ids} == dict.fromkeys(ids, 1)
    cards = escalated()
    assert {rid: sum(rid in c for c in cards) for rid in ids} == dict.fromkeys(ids, 1)

    engine = create_engine(pg)
    async with sessionmaker(engine)() as s:
        actions = (
            await s.exec(
                select(AuditEvent.action).where(col(AuditEvent.action).in_(["reminded", "escalated"]))
            )
        ).all()
    await engine.dispose()
    assert sorted(actions) == ["escalated"] * len(ids) + ["reminded"] * len(ids)
