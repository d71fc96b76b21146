"""Feishu end to end: the real server, the real SDK against a fake Open API, signed callbacks
through ``POST /callbacks/feishu/{channel}``, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from app.config import parse_config
from app.models import AuditEvent, Vote
from app.runtime import Runtime
from app.settings import Settings
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu, serve
from tests.channels.feishu_support import CHAT, buttons, card_action, make_channel, signed_encrypted
from tests.conftest import DEFAULT_CONFIG, Server

CHANNEL = "ops-feishu"


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeFeishu]:
    fake = FakeFeishu()
    with serve(fake):
        yield fake


@pytest.fixture
def fake(fake_server: FakeFeishu, monkeypatch: pytest.MonkeyPatch) -> FakeFeishu:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    fake_server.reset()
    return fake_server


@pytest.fixture
async def feishu_server(
    fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    channel = make_channel(fake, app_id=app_id)
    channel.name = CHANNEL
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["channels"][CHANNEL] = {
        "type": "feishu",
        "app_id": app_id,
        "app_secret": "app-secret",
        "verification_token": "tok",
        "encrypt_key": "fixture-encrypt-key",
        "chat_id": CHAT,
        "base_url": fake.origin,
    }
    raw["people"]["alice"]["feishu"] = "ou_alice"
    raw["people"]["bob"]["feishu"] = "ou_bob"
    raw["agents"]["finance-bot"]["hooks"][0]["channel"] = CHANNEL
    runtime = Runtime.create(settings, parse_config(raw), channels={CHANNEL: channel})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def eventually(check: Any, timeout: float = 10) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_card_click_decides_and_the_agent_is_released(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_invoice", "arguments": {"amount": 80000}},
            headers=agent,
        )
    ).json()["request_id"]

    [send] = await eventually(lambda: fake.calls("POST", MESSAGES_PATH))
    assert send.json["uuid"] == rid
    posted = json.loads(send.json["content"])
    verdicts = {beh["value"]["verdict"] for b in buttons(posted) for beh in b.get("behaviors", [])}
    assert verdicts == {"approve", "reject"}
    assert all(beh["value"]["request_id"] == rid for b in buttons(posted) for beh in b.get("behaviors", []))

    waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent))
    body, headers = signed_encrypted(card_action(rid, "approve", open_id="ou_alice", event_id="ev-ok"))
    answer = await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)
    assert answer.status_code == 200
    assert answer.json()["toast"]["type"] == "success"
    assert buttons(answer.json()["card"]["data"]) == []  # the clicker sees the outcome at once

    done = (await asyncio.wait_for(waiter, 10)).json()
    assert done["status"] == "approved"
    assert done["decided_by"]["user_id"] == "ou_alice"
    assert done["decided_by"]["name"] == "Alice"

    # The same delivery again changes nothing.
    again = await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)
    assert again.status_code == 200
    async with server.runtime.sessions() as s:
        votes = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    assert len(votes) == 1
    assert votes[0].identity["union_id"] == "on_union_alice"

    # The card in the chat is redrawn to the outcome by the outbox.
    patches = await eventually(lambda: [c for c in fake.calls("PATCH", MESSAGES_PATH) if c.json])
    assert buttons(json.loads(patches[-1].json["content"])) == []


async def test_refused_clicks_and_bad_signatures_change_nothing(
    fake: FakeFeishu,
    feishu_server: tuple[Server, httpx.AsyncClient],
    agent_key: str,
    admin_headers: dict[str, str],
) -> None:
    server, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_invoice", "arguments": {"amount": 80000}},
            headers=agent,
        )
    ).json()["request_id"]

    body, headers = signed_encrypted(card_action(rid, "approve", open_id="ou_mallory", event_id="ev-m"))
    refused = await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)
    assert refused.status_code == 200
    assert refused.json()["toast"]["type"] != "success"
    assert "not an approver" in refused.json()["toast"]["content"]

    body, headers = signed_encrypted(card_action(rid, "approve", open_id="ou_alice", event_id="ev-forged"))
    forged = await http.post(
        f"/callbacks/feishu/{CHANNEL}", content=body, headers={**headers, "x-lark-signature": "0" * 64}
    )
    assert forged.status_code == 401
    assert forged.json() == {"error": "invalid request"}

    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    async with server.runtime.sessions() as s:
        actions = (await s.exec(select(AuditEvent.action).order_by(col(AuditEvent.seq)))).all()
    assert "vote_refused" in actions
    assert "callback_rejected" in actions
    assert (await http.post("/callbacks/feishu/nope", content=b"{}")).status_code == 404
