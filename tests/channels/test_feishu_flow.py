"""Feishu end to end: the real server, the real SDK against a fake Open API, signed callbacks
through ``POST /callbacks/feishu/{channel}``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.metrics import REGISTRY
from signoff.app.models import AuditEvent, Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu
from tests.channels.feishu_support import (
    CHAT,
    NOW,
    buttons,
    card_action,
    fixture,
    fixture_request,
    make_channel,
    sign,
    signed_encrypted,
)
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

CHANNEL = "ops-feishu"
PLAIN = "plain-feishu"


@pytest.fixture
async def feishu_server(
    fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    channel = make_channel(fake, app_id=app_id)
    channel.name = CHANNEL
    plain = make_channel(fake, encrypt_key=None, allow_unsigned=True)
    plain.name = PLAIN
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
    raw["channels"][PLAIN] = {
        "type": "feishu",
        "app_id": plain.config.app_id,
        "app_secret": "app-secret",
        "verification_token": "tok",
        "allow_unsigned": True,
        "chat_id": CHAT,
        "base_url": fake.origin,
    }
    raw["people"]["alice"]["feishu"] = "ou_alice"
    raw["people"]["bob"]["feishu"] = "ou_bob"
    raw["people"]["carol"]["feishu"] = "on_union_carol"  # her union_id, the same in every app
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = CHANNEL
    runtime = Runtime.create(settings, parse_config(raw), channels={CHANNEL: channel, PLAIN: plain})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


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
    assert votes[0].assurance == "feishu_signed"

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


async def test_a_clicker_is_recognised_by_their_union_id(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = feishu_server
    rid = await pending_request(http, agent_key, "wire_money")
    # An open_id the directory does not know, of someone it knows by their union_id.
    counted = await click(http, rid, "approve", "ou_carol_here", "ev-c", union_id="on_union_carol")
    assert counted.json()["toast"]["type"] == "success", counted.json()
    stranger = await click(http, rid, "approve", "ou_dave_here", "ev-d", union_id="on_union_dave")
    assert stranger.json()["toast"]["type"] != "success"
    async with server.runtime.sessions() as s:
        votes = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    assert [(v.voter, v.user_id, v.name) for v in votes] == [("carol", "ou_carol_here", "Carol")]


async def pending_request(http: httpx.AsyncClient, key: str, tool: str = "pay_invoice") -> str:
    body = {"tool_name": tool, "arguments": {"amount": 80000}}
    r = await http.post("/v1/hooks/pre-tool-use", json=body, headers={"Authorization": f"Bearer {key}"})
    rid: str = r.json()["request_id"]
    return rid


async def click(
    http: httpx.AsyncClient, rid: str, verdict: str, who: str, event: str, **kw: Any
) -> httpx.Response:
    kw.setdefault("union_id", f"on_union_{who.removeprefix('ou_')}")  # one person, one union_id
    body, headers = signed_encrypted(card_action(rid, verdict, open_id=who, event_id=event, **kw))
    return await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)


async def test_url_verification_plain_and_encrypted_through_the_endpoint(
    feishu_server: tuple[Server, httpx.AsyncClient],
) -> None:
    _, http = feishu_server
    expected = fixture("url_verification.response.json")
    body, headers = fixture_request("req.url_verification.plain.json")
    assert (await http.post(f"/callbacks/feishu/{PLAIN}", content=body, headers=headers)).json() == expected
    body, headers = fixture_request("req.url_verification.encrypted.json")
    assert (await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)).json() == expected
    # A plaintext challenge to a channel with an encrypt key is a downgrade.
    body, headers = fixture_request("req.url_verification.plain.json")
    assert (await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)).status_code == 401


async def test_wrong_token_stale_timestamp_and_replays_change_nothing(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await pending_request(http, agent_key)
    assert (await click(http, rid, "approve", "ou_alice", "ev-t", token="wrong")).status_code == 401
    body, headers = signed_encrypted(
        card_action(rid, "approve", open_id="ou_alice", event_id="ev-s"), timestamp=NOW - 600
    )
    assert (await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)).status_code == 401
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["votes"] == []

    assert (await click(http, rid, "approve", "ou_alice", "ev-1")).json()["toast"]["type"] == "success"
    # The same event id again, even carrying another verdict, is the same delivery.
    await click(http, rid, "reject", "ou_alice", "ev-1")
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "approved"
    assert len(state["votes"]) == 1


async def test_quorum_two_over_feishu(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await pending_request(http, agent_key, tool="wire_money")
    first = (await click(http, rid, "approve", "ou_alice", "q-1")).json()
    assert "1 of 2" in first["toast"]["content"]
    assert buttons(first["card"]["data"])  # still open for the second approver
    second = (await click(http, rid, "approve", "ou_bob", "q-2")).json()
    assert buttons(second["card"]["data"]) == []
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"] == "approved"


@pytest.mark.postgres
async def test_racing_approvers_over_feishu(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await pending_request(http, agent_key)
    a, b = await asyncio.gather(
        click(http, rid, "approve", "ou_alice", "r-1"),
        click(http, rid, "reject", "ou_bob", "r-2", reason="no"),
    )
    toasts = sorted([a.json()["toast"]["type"], b.json()["toast"]["type"]])
    assert toasts.count("success") == 1
    loser = a if a.json()["toast"]["type"] != "success" else b
    assert "already" in loser.json()["toast"]["content"]
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] in ("approved", "rejected")
    assert len(state["votes"]) == 1


async def test_a_click_on_an_expired_request(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await pending_request(http, agent_key, tool="quick_op")  # a 1 s deadline
    done = await http.get(f"/v1/requests/{rid}/wait", params={"timeout": 10}, headers=agent)
    assert done.json()["status"] == "expired"
    late = (await click(http, rid, "approve", "ou_alice", "late-1")).json()
    assert late["toast"]["type"] != "success"
    assert "expired" in late["toast"]["content"]
    assert buttons(late["card"]["data"]) == []


async def test_with_an_encrypt_key_a_plaintext_legacy_click_signed_with_the_token_is_refused(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    """The token alone (it signs legacy callbacks, and every callback carries it) must not be
    enough to click once an encrypt key is set: only encrypted, signed callbacks count."""
    server, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await pending_request(http, agent_key)
    payload = fixture("card_callback.legacy_v1.lark_doc.json")
    payload.update(open_id="ou_alice", token="tok")
    payload["action"]["value"] = {"request_id": rid, "verdict": "approve"}
    body = json.dumps(payload).encode()
    timestamp = str(NOW)  # the channel's clock
    headers = {
        "content-type": "application/json",
        "x-lark-request-timestamp": timestamp,
        "x-lark-request-nonce": "n1",
        "x-lark-signature": sign(timestamp, "n1", "tok", body, algorithm="sha1"),
    }
    reason = "plaintext body while an encrypt key is configured"
    before = _rejections(CHANNEL, reason)

    r = await http.post(f"/callbacks/feishu/{CHANNEL}", content=body, headers=headers)

    assert r.status_code == 401
    assert r.json() == {"error": "invalid request"}
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert (state["status"], state["votes"]) == ("pending", [])
    async with server.runtime.sessions() as s:
        refused = (
            await s.exec(select(AuditEvent.detail).where(col(AuditEvent.action) == "callback_rejected"))
        ).all()
    assert [(d["channel"], d["reason"]) for d in refused] == [(CHANNEL, reason)]
    assert _rejections(CHANNEL, reason) == before + 1


def _rejections(channel: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "signoff_callback_rejections_total", {"channel": channel, "reason": reason}
    )
    return value or 0.0
