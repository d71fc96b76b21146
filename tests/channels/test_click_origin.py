"""A chat click counts only from the channel, and the conversation, its card was posted to:
the real server with two Slack channels (two apps, two conversations), a Feishu channel and
the built-in web channel; signed callbacks through ``POST /callbacks/{type}/{channel}``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent
from signoff.app.requests.eligibility import NOT_HERE
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.feishu_fake import FakeFeishu
from tests.channels.feishu_support import CHAT, card_action, make_channel, signed_encrypted
from tests.channels.slack_support import SECRET, button_payload, form_body, signed
from tests.conftest import ADMIN_TOKEN, Server
from tests.waiting import eventually

SECRET_B = "another-apps-signing-secret"
CHANNEL_B = "C0OTHERCHAN"


@pytest.fixture
async def server(
    fake_slack: FakeSlack, fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient, dict[str, str]]]:
    fake_slack.conversations.add(CHANNEL_B)
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    feishu = make_channel(fake, app_id=app_id)
    feishu.name = "ops-feishu"

    def slack(secret: str, conversation: str) -> dict[str, Any]:
        return {
            "type": "slack",
            "bot_token": BOT_TOKEN,
            "signing_secret": secret,
            "channel": conversation,
            "base_url": fake_slack.base_url,
        }

    def gate(tools: str, channel: str, approvers: list[str]) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": f"{tools} on {channel}",
            "tools": [tools],
            "channel": channel,
            "approvers": approvers,
        }

    raw: dict[str, Any] = {
        "channels": {
            "slack-a": slack(SECRET, CHANNEL),
            "slack-b": slack(SECRET_B, CHANNEL_B),
            "ops-feishu": {
                "type": "feishu",
                "app_id": app_id,
                "app_secret": "app-secret",
                "verification_token": "tok",
                "encrypt_key": "fixture-encrypt-key",
                "chat_id": CHAT,
                "base_url": fake.origin,
            },
        },
        "people": {"alice": {"name": "Alice", "slack": "W0ALICE", "feishu": "ou_alice"}},
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate("a_*", "slack-a", []),
                    gate("pay_*", "slack-a", ["alice"]),
                    gate("f_*", "ops-feishu", []),
                    gate("w_*", "web", []),
                ]
            }
        },
    }
    runtime = Runtime.create(settings, parse_config(raw), channels={"ops-feishu": feishu})
    try:
        async with (
            Server(runtime, background=True) as s,
            httpx.AsyncClient(base_url=s.url, timeout=30) as http,
        ):
            from signoff.app.audit import Actor
            from signoff.app.db import transaction
            from signoff.app.keys import create_key

            async with transaction(runtime.sessions) as session:
                _, key = await create_key(session, "finance-bot", actor=Actor("test"))
            yield s, http, {"Authorization": f"Bearer {key}"}
    finally:
        await runtime.aclose()


def slack_click(
    rid: str, user: str, *, conversation: str = CHANNEL, secret: str = SECRET
) -> tuple[bytes, dict[str, str]]:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["channel"]["id"] = payload["container"]["channel_id"] = conversation
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()), secret=secret)


async def ask(http: httpx.AsyncClient, agent: dict[str, str], tool: str) -> str:
    answer = await http.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": tool, "arguments": {}}, headers=agent
    )
    assert answer.json()["decision"] == "pending"
    rid: str = answer.json()["request_id"]
    return rid


async def status(http: httpx.AsyncClient, agent: dict[str, str], rid: str) -> str:
    state: str = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"]
    return state


async def refusals(server: Server) -> list[tuple[str | None, str | None, str]]:
    async with server.runtime.sessions() as s:
        rows = (
            await s.exec(
                select(AuditEvent)
                .where(col(AuditEvent.action) == "vote_refused")
                .order_by(col(AuditEvent.seq))
            )
        ).all()
    return [(e.request_id, e.actor_id, e.detail["why"]) for e in rows]


async def test_a_click_from_another_slack_channel_or_conversation_does_not_count(
    fake_slack: FakeSlack, server: tuple[Server, httpx.AsyncClient, dict[str, str]]
) -> None:
    s, http, agent = server
    open_rid = await ask(http, agent, "a_restart")  # anyone in slack-a's channel may approve
    listed_rid = await ask(http, agent, "pay_invoice")  # Alice may approve, in slack-a's channel
    await eventually(lambda: len(fake_slack.calls_to("chat.postMessage")) == 2)

    # Signed by slack-b's app, at slack-b's endpoint: a stranger, and Alice herself.
    for rid, user in ((open_rid, "U0STRANGER"), (listed_rid, "W0ALICE")):
        b, h = slack_click(rid, user, conversation=CHANNEL_B, secret=SECRET_B)
        assert (await http.post("/callbacks/slack/slack-b", content=b, headers=h)).status_code == 200
    # slack-a's own app, but clicked in another conversation.
    b, h = slack_click(open_rid, "U0STRANGER", conversation=CHANNEL_B)
    assert (await http.post("/callbacks/slack/slack-a", content=b, headers=h)).status_code == 200

    notes = await eventually(
        lambda: (
            len(fake_slack.calls_to("chat.postEphemeral")) == 3 and fake_slack.calls_to("chat.postEphemeral")
        )
    )
    assert {(n.args["channel"], n.args["user"]) for n in notes} == {
        (CHANNEL_B, "U0STRANGER"),
        (CHANNEL_B, "W0ALICE"),
    }
    assert all("not posted here" in n.args["text"] for n in notes)
    assert await status(http, agent, open_rid) == "pending"
    assert await status(http, agent, listed_rid) == "pending"
    assert await refusals(s) == [
        (open_rid, "U0STRANGER", NOT_HERE),
        (listed_rid, "W0ALICE", NOT_HERE),
        (open_rid, "U0STRANGER", NOT_HERE),
    ]

    # In the card's own channel and conversation, the same clicks count.
    for rid, user in ((open_rid, "U0STRANGER"), (listed_rid, "W0ALICE")):
        b, h = slack_click(rid, user)
        assert (await http.post("/callbacks/slack/slack-a", content=b, headers=h)).status_code == 200
        assert await status(http, agent, rid) == "approved"


async def test_a_slack_click_never_decides_a_feishu_or_web_request(
    fake_slack: FakeSlack, fake: FakeFeishu, server: tuple[Server, httpx.AsyncClient, dict[str, str]]
) -> None:
    s, http, agent = server
    feishu_rid = await ask(http, agent, "f_sync")
    web_rid = await ask(http, agent, "w_wipe")
    for rid in (feishu_rid, web_rid):
        for endpoint, secret, conversation in (
            ("slack-a", SECRET, CHANNEL),
            ("slack-b", SECRET_B, CHANNEL_B),
        ):
            b, h = slack_click(rid, "U0STRANGER", conversation=conversation, secret=secret)
            assert (await http.post(f"/callbacks/slack/{endpoint}", content=b, headers=h)).status_code == 200
        assert await status(http, agent, rid) == "pending"
    assert [why for *_, why in await refusals(s)] == [NOT_HERE] * 4

    # Feishu's own app, but clicked in another chat: refused with a toast.
    body, headers = signed_encrypted(
        card_action(feishu_rid, open_id="ou_stranger", event_id="e1", chat="oc_elsewhere")
    )
    answer = await http.post("/callbacks/feishu/ops-feishu", content=body, headers=headers)
    assert answer.json()["toast"]["type"] == "warning"
    assert "not posted here" in answer.json()["toast"]["content"]
    assert await status(http, agent, feishu_rid) == "pending"

    body, headers = signed_encrypted(card_action(feishu_rid, open_id="ou_stranger", event_id="e2"))
    answer = await http.post("/callbacks/feishu/ops-feishu", content=body, headers=headers)
    assert answer.json()["toast"]["type"] == "success"
    assert await status(http, agent, feishu_rid) == "approved"

    # The web channel's requests are decided by operators, through the operator API.
    decided = await http.post(
        f"/v1/admin/requests/{web_rid}/decision",
        json={"verdict": "approve", "operator": "alice"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert decided.json()["status"] == "approved"
    assert json.dumps(decided.json()).count("vote_refused") == 2
