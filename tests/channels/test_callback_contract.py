"""The one callback contract on the chat surfaces, through their signed callbacks on the real
server: the same person's same decision again is answered with the decision as it stands; a
conflicting decision after the request is decided names the final state and who made it; an
expired or cancelled request says so. Slack answers every callback 200 and tells the clicker
in an ephemeral message (or on the rejection form); Feishu answers with a toast and the card.
The email links, ntfy actions, console and operator API are tested in their own modules
(test_email_flow, test_ntfy_flow, tests/console/test_console_contract)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.conftest import SLACK_NAME
from tests.channels.fake_slack import FakeSlack
from tests.channels.feishu_fake import FakeFeishu
from tests.channels.feishu_support import CHAT, card_action, make_channel, signed_encrypted
from tests.channels.slack_support import button_payload, form_body, signed, submission_payload
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

FEISHU = "ops-feishu"


async def ask(http: httpx.AsyncClient, key: str, tool: str, arguments: dict[str, Any]) -> str:
    r = await http.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": tool, "arguments": arguments},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["decision"] == "pending"
    return str(r.json()["request_id"])


async def status(http: httpx.AsyncClient, key: str, rid: str) -> str:
    r = await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})
    return str(r.json()["status"])


async def settled(http: httpx.AsyncClient, key: str, rid: str, wanted: str) -> None:
    for _ in range(200):
        if await status(http, key, rid) == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{rid} never became {wanted}")


async def cancel(http: httpx.AsyncClient, key: str, rid: str) -> None:
    r = await http.post(f"/v1/requests/{rid}/cancel", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text


async def vote_count(server: Server, rid: str) -> int:
    async with server.runtime.sessions() as s:
        return len((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


# --- Slack -----------------------------------------------------------------------------------------


def slack_click(rid: str, user: str) -> tuple[bytes, dict[str, str]]:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}{uuid.uuid4().hex[:4]}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


def slack_reject(rid: str, user: str, reason: str) -> tuple[bytes, dict[str, str]]:
    payload = submission_payload(reason, request_id=rid)
    payload["user"]["id"] = user
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


async def test_slack_answers_repeats_conflicts_and_late_clicks_by_the_contract(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    url = f"/callbacks/slack/{SLACK_NAME}"

    async def told(user: str, count: int) -> str:
        notes = await eventually(
            lambda: [c for c in fake_slack.calls_to("chat.postEphemeral") if c.args["user"] == user][
                count - 1 :
            ]
        )
        return str(notes[0].args["text"])

    rid = await ask(http, agent_key, "pay_x", {"amount": 90000})
    b, h = slack_click(rid, "W0ALICE")
    assert (await http.post(url, content=b, headers=h)).status_code == 200
    await settled(http, agent_key, rid, "approved")
    # A double click: the decision as it stands, nothing recorded.
    b, h = slack_click(rid, "W0ALICE")
    assert (await http.post(url, content=b, headers=h)).status_code == 200
    assert await told("W0ALICE", 1) == "You already approved this request; it is approved by Alice."
    # Another approver after the decision: the final state and who made it.
    b, h = slack_click(rid, "W0BOB")
    assert (await http.post(url, content=b, headers=h)).status_code == 200
    assert await told("W0BOB", 1) == "This request was already approved by Alice."
    b, h = slack_reject(rid, "W0BOB", "no")
    answer = await http.post(url, content=b, headers=h)
    assert answer.json()["response_action"] == "errors"
    assert "This request was already approved by Alice." in json.dumps(answer.json())
    assert await vote_count(server, rid) == 1

    # The rejection form submitted twice (Slack retries, a double submit): the form closes.
    rejected = await ask(http, agent_key, "pay_x", {"amount": 90000})
    for _ in range(2):
        b, h = slack_reject(rejected, "W0BOB", "not this one")
        answer = await http.post(url, content=b, headers=h)
        assert answer.json() == {"response_action": "clear"}
    assert await status(http, agent_key, rejected) == "rejected"

    expired = await ask(http, agent_key, "quick_x", {})
    await settled(http, agent_key, expired, "expired")
    b, h = slack_click(expired, "W0ALICE")
    assert (await http.post(url, content=b, headers=h)).status_code == 200
    assert await told("W0ALICE", 2) == "This request has already expired."

    cancelled = await ask(http, agent_key, "pay_x", {"amount": 90000})
    await cancel(http, agent_key, cancelled)
    b, h = slack_click(cancelled, "W0ALICE")
    assert (await http.post(url, content=b, headers=h)).status_code == 200
    assert (await told("W0ALICE", 3)).startswith("This request was already cancelled")
    assert await vote_count(server, cancelled) == 0


# --- Feishu ----------------------------------------------------------------------------------------


@pytest.fixture
async def feishu_server(
    fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    channel = make_channel(fake, app_id=app_id)
    channel.name = FEISHU
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["channels"][FEISHU] = {
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
    raw["people"]["carol"]["feishu"] = "ou_carol"
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = FEISHU
    runtime = Runtime.create(settings, parse_config(raw), channels={FEISHU: channel})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def test_feishu_answers_repeats_conflicts_and_late_clicks_by_the_contract(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = feishu_server
    url = f"/callbacks/feishu/{FEISHU}"

    async def tap(rid: str, verdict: str, open_id: str, union_id: str) -> dict[str, Any]:
        body, headers = signed_encrypted(
            card_action(rid, verdict, open_id=open_id, union_id=union_id, event_id=uuid.uuid4().hex)
        )
        answer = await http.post(url, content=body, headers=headers)
        assert answer.status_code == 200
        data: dict[str, Any] = answer.json()
        return data

    rid = await ask(http, agent_key, "pay_invoice", {"amount": 80000})
    first = await tap(rid, "approve", "ou_alice", "on_union_alice")
    assert first["toast"]["type"] == "success"
    # A second tap (a new event): the decision as it stands, as information, with the card.
    again = await tap(rid, "approve", "ou_alice", "on_union_alice")
    assert again["toast"] == {
        "type": "info",
        "content": "You already approved this request; it is approved by Alice.",
    }
    assert again["card"]["type"] == "raw"
    # A conflicting decision: a warning naming the final state and who.
    for verdict in ("reject", "approve"):
        late = await tap(rid, verdict, "ou_bob", "on_union_bob")
        assert late["toast"] == {"type": "warning", "content": "This request was already approved by Alice."}
    assert await vote_count(server, rid) == 1

    expired = await ask(http, agent_key, "quick_x", {})
    await settled(http, agent_key, expired, "expired")
    late = await tap(expired, "approve", "ou_alice", "on_union_alice")
    assert late["toast"] == {"type": "warning", "content": "This request has already expired."}

    cancelled = await ask(http, agent_key, "pay_invoice", {"amount": 80000})
    await cancel(http, agent_key, cancelled)
    late = await tap(cancelled, "approve", "ou_alice", "on_union_alice")
    assert late["toast"]["type"] == "warning"
    assert late["toast"]["content"].startswith("This request was already cancelled")
