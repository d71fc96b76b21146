"""Several gates on one call, end to end: one pending answer and one request, each gate's
approvers deciding on their own card in their gate's channel (Slack and Feishu), through
the real server and signed callbacks."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from signoff.app.audit import Actor
from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu
from tests.channels.feishu_support import CHAT, card_action, make_channel, signed_encrypted
from tests.channels.slack_support import SECRET, button_payload, form_body, signed
from tests.conftest import Server
from tests.waiting import eventually

Agent = dict[str, str]


@pytest.fixture
async def server(
    fake_slack: FakeSlack, fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient, Agent]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    feishu = make_channel(fake, app_id=app_id)
    feishu.name = "security-feishu"

    def gate(name: str, tools: str, channel: str, approvers: list[str], timeout: str) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": channel,
            "approvers": approvers,
            "timeout": timeout,
        }

    raw: dict[str, Any] = {
        "channels": {
            "finance-slack": {
                "type": "slack",
                "bot_token": BOT_TOKEN,
                "signing_secret": SECRET,
                "channel": CHANNEL,
                "base_url": fake_slack.base_url,
            },
            "security-feishu": {
                "type": "feishu",
                "app_id": app_id,
                "app_secret": "app-secret",
                "verification_token": "tok",
                "encrypt_key": "fixture-encrypt-key",
                "chat_id": CHAT,
                "base_url": fake.origin,
            },
        },
        "people": {
            "alice": {"name": "Alice", "slack": "W0ALICE", "feishu": "ou_alice"},
            "bob": {"name": "Bob", "slack": "W0BOB", "feishu": "ou_bob"},
            "carol": {"name": "Carol", "slack": "W0CAROL"},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate("finance review", "deploy_*", "finance-slack", ["alice"], "30m"),
                    gate("security review", "deploy_*", "security-feishu", ["bob"], "10m"),
                    gate("qa", "ship_*", "finance-slack", ["alice", "carol"], "30m"),
                    gate("release", "ship_*", "finance-slack", ["alice"], "30m"),
                ]
            }
        },
    }
    runtime = Runtime.create(settings, parse_config(raw), channels={"security-feishu": feishu})
    try:
        async with (
            Server(runtime, background=True) as s,
            httpx.AsyncClient(base_url=s.url, timeout=30) as http,
        ):
            async with transaction(runtime.sessions) as session:
                _, key = await create_key(session, "finance-bot", actor=Actor("test"))
            yield s, http, {"Authorization": f"Bearer {key}"}
    finally:
        await runtime.aclose()


async def pre_tool_use(http: httpx.AsyncClient, agent: Agent, tool: str, key: str) -> dict[str, Any]:
    call = {"tool_name": tool, "arguments": {"service": "api"}, "idempotency_key": key}
    answer: dict[str, Any] = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    return answer


async def read(http: httpx.AsyncClient, agent: Agent, rid: str) -> dict[str, Any]:
    state: dict[str, Any] = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    return state


async def slack_approve(http: httpx.AsyncClient, rid: str, user: str) -> None:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    headers = signed(body, timestamp=int(time.time()))
    assert (
        await http.post("/callbacks/slack/finance-slack", content=body, headers=headers)
    ).status_code == 200


async def feishu_click(
    http: httpx.AsyncClient, rid: str, verdict: str, who: str, *, reason: str | None = None
) -> dict[str, Any]:
    action = card_action(rid, verdict, open_id=who, event_id=uuid.uuid4().hex, reason=reason)
    body, headers = signed_encrypted(action)
    answer: dict[str, Any] = (
        await http.post("/callbacks/feishu/security-feishu", content=body, headers=headers)
    ).json()
    return answer


def gates(state: dict[str, Any]) -> list[tuple[str, str, int, int, bool]]:
    return [(g["name"], g["channel"], g["approvals"], g["quorum"], g["approved"]) for g in state["gates"]]


async def test_every_matching_gate_is_asked_and_must_approve(
    fake_slack: FakeSlack, fake: FakeFeishu, server: tuple[Server, httpx.AsyncClient, Agent]
) -> None:
    _, http, agent = server
    first = await pre_tool_use(http, agent, "deploy_api", "deploy-1")
    assert first["decision"] == "pending"
    rid = first["request_id"]
    state = first["request"]
    assert gates(state) == [
        ("finance review", "finance-slack", 0, 1, False),
        ("security review", "security-feishu", 0, 1, False),
    ]
    # The deadline is the shortest of the gates'.
    created, expires = (datetime.fromisoformat(state[k]) for k in ("created_at", "expires_at"))
    assert expires - created == timedelta(minutes=10)

    # One card per gate, each in its gate's channel, each naming its own approvers.
    [slack_card] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    [feishu_card] = await eventually(lambda: fake.calls("POST", MESSAGES_PATH))
    assert "W0ALICE" in json.dumps(slack_card.args["blocks"])
    assert "W0BOB" not in json.dumps(slack_card.args["blocks"])
    feishu_text = json.loads(feishu_card.json["content"])
    assert "Bob" in json.dumps(feishu_text, ensure_ascii=False)
    assert "security review" in json.dumps(slack_card.args["blocks"])  # the other gate, shown as waiting

    # Alice approves on the finance card: the call still waits for security.
    await slack_approve(http, rid, "W0ALICE")
    state = await read(http, agent, rid)
    assert state["status"] == "pending"
    assert gates(state) == [
        ("finance review", "finance-slack", 1, 1, True),
        ("security review", "security-feishu", 0, 1, False),
    ]
    again = await pre_tool_use(http, agent, "deploy_api", "deploy-1")
    assert (again["decision"], again["request_id"]) == ("pending", rid)

    # Each gate's approvers decide on their own card only.
    await slack_approve(http, rid, "W0BOB")  # Bob is no finance approver
    alice_on_security = await feishu_click(http, rid, "approve", "ou_alice")
    assert "not an approver" in alice_on_security["toast"]["content"]
    assert (await read(http, agent, rid))["status"] == "pending"

    bob = await feishu_click(http, rid, "approve", "ou_bob")
    assert bob["toast"]["type"] == "success"
    state = await read(http, agent, rid)
    assert state["status"] == "approved"
    assert [(v["gate"], v["user_id"]) for v in state["votes"]] == [
        ("finance review", "W0ALICE"),
        ("security review", "ou_bob"),
    ]
    assert [[v["user_id"] for v in g["votes"]] for g in state["gates"]] == [["W0ALICE"], ["ou_bob"]]
    assert (state["approvals"], state["quorum"]) == (2, 2)
    replay = await pre_tool_use(http, agent, "deploy_api", "deploy-1")
    assert (replay["decision"], replay["request_id"]) == ("allow", rid)


async def test_one_gates_rejection_rejects_the_call(
    server: tuple[Server, httpx.AsyncClient, Agent],
) -> None:
    _, http, agent = server
    rid = (await pre_tool_use(http, agent, "deploy_db", "deploy-2"))["request_id"]
    await slack_approve(http, rid, "W0ALICE")
    rejected = await feishu_click(http, rid, "reject", "ou_bob", reason="no change ticket")
    assert rejected["toast"]["type"] == "success"
    state = await read(http, agent, rid)
    assert state["status"] == "rejected"
    assert state["reason"] == "no change ticket"
    replay = await pre_tool_use(http, agent, "deploy_db", "deploy-2")
    assert replay["decision"] == "deny"
    assert "no change ticket" in replay["reason"]


async def test_a_click_counts_for_every_gate_of_its_card_the_voter_may_approve(
    fake_slack: FakeSlack, server: tuple[Server, httpx.AsyncClient, Agent]
) -> None:
    """Two gates posted to one channel share its card: Alice, an approver of both, approves
    both with one click; Carol's click counts for the one gate she may approve."""
    _, http, agent = server
    rid = (await pre_tool_use(http, agent, "ship_it", "ship-1"))["request_id"]
    [card] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    blocks = json.dumps(card.args["blocks"])
    assert "qa: 0 of 1" in blocks
    assert "release: 0 of 1" in blocks
    await slack_approve(http, rid, "W0CAROL")
    state = await read(http, agent, rid)
    assert (state["status"], gates(state)) == (
        "pending",
        [("qa", "finance-slack", 1, 1, True), ("release", "finance-slack", 0, 1, False)],
    )
    await slack_approve(http, rid, "W0ALICE")
    state = await read(http, agent, rid)
    assert state["status"] == "approved"
    assert sorted((v["gate"], v["user_id"]) for v in state["votes"]) == [
        ("qa", "W0ALICE"),
        ("qa", "W0CAROL"),
        ("release", "W0ALICE"),
    ]
