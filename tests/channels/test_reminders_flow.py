"""Reminders and escalation through the real channels: slack-sdk against the fake Slack Web API
and lark-oapi against the fake Feishu Open API, the dispatcher on a fake clock, clicks as
signed callbacks through the real server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.models import Delivery, OutboxStatus, utcnow
from signoff.app.outbox import Dispatcher
from signoff.app.requests.eligibility import Voter
from signoff.app.requests.states import get_request
from signoff.app.requests.votes import cast_vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Card, Person, Verdict
from signoff.channels.slack import ACTION_APPROVE
from tests.app.factories import make_request
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack, Scripted
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu
from tests.channels.feishu_support import make_channel
from tests.channels.slack_support import SECRET, button_payload, form_body, signed
from tests.conftest import Server

PAGER = "C0PAGER"
T = timedelta(minutes=1)


def slack_config(fake: FakeSlack) -> dict[str, Any]:
    def channel(conversation: str) -> dict[str, str]:
        return {
            "type": "slack",
            "bot_token": BOT_TOKEN,
            "signing_secret": SECRET,
            "channel": conversation,
            "base_url": fake.base_url,
        }

    return {
        "channels": {"ops-slack": channel(CHANNEL), "pager-slack": channel(PAGER)},
        "people": {
            "alice": {"name": "Alice", "slack": "W0ALICE"},
            "bob": {"name": "Bob", "slack": "W0BOB"},
            "carol": {"name": "Carol", "slack": "W0CAROL"},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "name": "two-person",
                        "tools": ["wire_*"],
                        "channel": "ops-slack",
                        "approvers": ["alice", "bob"],
                        "quorum": 2,
                        "timeout": "30m",
                        "remind": ["50%"],
                    },
                    {
                        "type": "confirmation_gate",
                        "name": "payments",
                        "tools": ["pay_*"],
                        "channel": "ops-slack",
                        "approvers": ["alice"],
                        "timeout": "30m",
                        "escalate": [{"after": "10m", "channel": "pager-slack", "approvers": ["carol"]}],
                    },
                ]
            }
        },
    }


@pytest.fixture
async def slack_world(fake_slack: FakeSlack, settings: Settings) -> AsyncIterator[tuple[Server, Dispatcher]]:
    fake_slack.conversations.add(PAGER)
    runtime = Runtime.create(settings, parse_config(slack_config(fake_slack)))
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server:
            yield server, dispatcher
    finally:
        await runtime.aclose()


def click(request_id: str, user: str, conversation: str) -> tuple[bytes, dict[str, str]]:
    payload = button_payload(ACTION_APPROVE, request_id=request_id)
    payload["user"]["id"] = user
    payload["container"]["channel_id"] = conversation
    payload["channel"]["id"] = conversation
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


async def row(runtime: Runtime, rid: str, kind: str) -> Delivery:
    async with runtime.sessions() as s:
        found = await s.exec(
            select(Delivery).where(col(Delivery.request_id) == rid, col(Delivery.kind) == kind)
        )
        return found.one()


async def test_slack_reminder_is_a_thread_reply_mentioning_only_who_has_not_voted(
    fake_slack: FakeSlack, slack_world: tuple[Server, Dispatcher]
) -> None:
    server, d = slack_world
    runtime = server.runtime
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="wire_money", arguments={"to": "acme"})
    t0 = req.created_at
    await d.run_once(now=t0)
    [post] = fake_slack.calls_to("chat.postMessage")
    ts = (await row(runtime, req.id, "post")).message_ref or {}
    async with httpx.AsyncClient(base_url=server.url) as http:
        body, headers = click(req.id, "W0ALICE", CHANNEL)
        assert (
            await http.post("/callbacks/slack/ops-slack", content=body, headers=headers)
        ).status_code == 200
    await d.run_once(now=t0 + 14 * T)
    assert fake_slack.replies(CHANNEL, ts["ts"]) == []

    await d.run_once(now=t0 + 15 * T)
    [reply] = fake_slack.replies(CHANNEL, ts["ts"])
    assert "<@W0BOB>" in reply["text"]
    assert "<@W0ALICE>" not in reply["text"]  # she has voted
    assert req.id in reply["text"]
    [call] = [c for c in fake_slack.calls_to("chat.postMessage") if c.args.get("thread_ts")]
    assert call.args["thread_ts"] == ts["ts"]
    assert call.args["channel"] == CHANNEL
    await d.run_once(now=t0 + 20 * T)
    assert len(fake_slack.replies(CHANNEL, ts["ts"])) == 1
    assert post.args.get("thread_ts") is None


async def test_slack_reminder_retries_a_rate_limit_and_a_refusal_leaves_the_request_open(
    fake_slack: FakeSlack, slack_world: tuple[Server, Dispatcher]
) -> None:
    server, d = slack_world
    runtime = server.runtime
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="wire_money", arguments={"to": "acme"})
        other = await make_request(s, runtime.config, tool="wire_money", arguments={"to": "globex"})
    t0 = req.created_at
    await d.run_once(now=t0)
    fake_slack.fail_next(
        "chat.postMessage", Scripted(status=429, error="ratelimited", headers={"Retry-After": "3"})
    )
    await d.run_once(now=t0 + 16 * T)
    first, second = await row(runtime, req.id, "remind"), await row(runtime, other.id, "remind")
    retried = first if first.status == OutboxStatus.PENDING else second
    assert retried.status == OutboxStatus.PENDING
    assert retried.attempts == 1
    assert retried.last_error == "ratelimited"
    # Another thread reply fails for good: that reminder is given up, its request stays pending.
    fake_slack.fail_next("chat.postMessage", Scripted(error="restricted_action_thread_locked"))
    await d.run_once(now=t0 + 17 * T)
    rows = [await row(runtime, rid, "remind") for rid in (req.id, other.id)]
    assert sorted(r.status for r in rows) == [OutboxStatus.FAILED, OutboxStatus.SENT]
    async with runtime.sessions() as s:
        for rid in (req.id, other.id):
            current = await get_request(s, rid)
            assert current is not None
            assert current.status == "pending"
    replies = [m for m in fake_slack.messages.values() if m.get("thread_ts")]
    assert len(replies) == 1


async def test_slack_escalation_posts_a_card_that_decides_and_is_redrawn(
    fake_slack: FakeSlack, slack_world: tuple[Server, Dispatcher]
) -> None:
    server, d = slack_world
    runtime = server.runtime
    # Made 11 minutes ago: its escalation is due by the server's own clock.
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="pay_x", arguments={"n": 1}, now=utcnow() - 11 * T)
    await d.run_once(now=utcnow())
    posts = fake_slack.calls_to("chat.postMessage")
    assert sorted(c.args["channel"] for c in posts) == sorted([CHANNEL, PAGER])
    await d.run_once(now=utcnow() + T)
    assert len(fake_slack.calls_to("chat.postMessage")) == 2  # once

    async with httpx.AsyncClient(base_url=server.url) as http:
        body, headers = click(req.id, "W0CAROL", PAGER)
        answer = await http.post("/callbacks/slack/pager-slack", content=body, headers=headers)
        assert answer.status_code == 200
    async with runtime.sessions() as s:
        decided = await get_request(s, req.id)
    assert decided is not None
    assert decided.status == "approved"
    assert decided.decided_by_name == "Carol"
    await d.run_once(now=utcnow() + T)
    redrawn = {c.args["channel"]: c.args for c in fake_slack.calls_to("chat.update")}
    assert set(redrawn) == {CHANNEL, PAGER}
    for args in redrawn.values():
        blocks = args["blocks"] if isinstance(args["blocks"], list) else json.loads(args["blocks"])
        assert not any(b.get("type") == "actions" for b in blocks)  # no buttons left
        assert "Approved" in args["text"]


async def test_slack_escalated_card_refuses_a_click_from_the_original_conversation_before_its_time(
    fake_slack: FakeSlack, slack_world: tuple[Server, Dispatcher]
) -> None:
    server, d = slack_world
    runtime = server.runtime
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="pay_x", arguments={"n": 2})
    await d.run_once(now=utcnow())
    async with httpx.AsyncClient(base_url=server.url) as http:
        body, headers = click(req.id, "W0CAROL", CHANNEL)
        assert (
            await http.post("/callbacks/slack/ops-slack", content=body, headers=headers)
        ).status_code == 200
    async with runtime.sessions() as s:
        current = await get_request(s, req.id)
    assert current is not None
    assert current.status == "pending"
    [ephemeral] = await _eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "escalated to you at" in ephemeral.args["text"]


async def _eventually(check: Any) -> Any:
    for _ in range(200):
        if value := check():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


# --------------------------------------------------------------------------- Feishu


@pytest.fixture
async def feishu_world(fake: FakeFeishu, settings: Settings) -> AsyncIterator[tuple[Runtime, Dispatcher]]:
    channel = make_channel(fake)
    pager = make_channel(fake, chat="oc_pager")
    channel.name, pager.name = "ops-feishu", "pager-feishu"
    raw = {
        "channels": {
            name: {
                "type": "feishu",
                "app_id": ch.config.app_id,
                "app_secret": "app-secret",
                "verification_token": "tok",
                "encrypt_key": "fixture-encrypt-key",
                "chat_id": ch.config.chat_id,
                "base_url": fake.origin,
            }
            for name, ch in (("ops-feishu", channel), ("pager-feishu", pager))
        },
        "people": {
            "alice": {"name": "Alice", "feishu": "ou_alice"},
            "bob": {"name": "Bob", "feishu": "ou_bob"},
            "carol": {"name": "Carol", "feishu": "ou_carol"},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "tools": ["wire_*"],
                        "channel": "ops-feishu",
                        "approvers": ["alice", "bob"],
                        "quorum": 2,
                        "timeout": "30m",
                        "remind": ["10m", "20m"],
                        "escalate": [{"after": "15m", "channel": "pager-feishu", "approvers": ["carol"]}],
                    }
                ]
            }
        },
    }
    runtime = Runtime.create(
        settings, parse_config(raw), channels={"ops-feishu": channel, "pager-feishu": pager}
    )
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        yield runtime, dispatcher
    finally:
        await runtime.aclose()


async def test_feishu_reminders_reply_to_the_card_and_escalation_posts_to_the_other_chat(
    fake: FakeFeishu, feishu_world: tuple[Runtime, Dispatcher]
) -> None:
    runtime, d = feishu_world
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="wire_money", arguments={"to": "acme"})
    t0 = req.created_at
    await d.run_once(now=t0)
    card_id = ((await row(runtime, req.id, "post")).message_ref or {})["message_id"]
    async with transaction(runtime.sessions) as s:
        voter = Voter("ops-feishu", "ou_alice", "Alice", "alice")
        await cast_vote(s, req.id, voter=voter, verdict=Verdict.APPROVE, config=runtime.config, now=t0 + T)

    await d.run_once(now=t0 + 10 * T)
    [first] = fake.replies_to(card_id)
    assert first["mentions"] == ["ou_bob"]
    assert first["msg_type"] == "post"
    [call] = [r for r in fake.calls("POST", MESSAGES_PATH) if r.path.endswith("/reply")]
    assert call.json["uuid"]

    await d.run_once(now=t0 + 15 * T)
    pager_cards = [m for m in fake.messages.values() if m["chat_id"] == "oc_pager"]
    assert len(pager_cards) == 1
    await d.run_once(now=t0 + 20 * T)
    replies = fake.replies_to(card_id)
    assert len(replies) == 2
    # By the second reminder Carol may decide too (escalated at 15m): she is reminded as well.
    assert replies[1]["mentions"] == ["ou_bob", "ou_carol"]
    await d.run_once(now=t0 + 25 * T)
    assert len(fake.replies_to(card_id)) == 2


async def test_feishu_reminder_is_sent_once_whatever_the_retries(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    ref = await channel.post(_card("req-feishu-1"))
    waiting = (Person("Bob", "ou_bob"), Person("Dee"))
    for _ in range(3):  # the same reminder, its answers lost: Feishu's uuid keeps it one message
        await channel.remind(ref, _card("req-feishu-1"), waiting, key="req-feishu-1-remind-7")
    await channel.remind(ref, _card("req-feishu-1"), waiting, key="req-feishu-1-remind-8")
    replies = fake.replies_to(ref["message_id"])
    assert len(replies) == 2
    assert replies[0]["mentions"] == ["ou_bob"]
    text = json.dumps(json.loads(replies[0]["content"]), ensure_ascii=False)
    assert "Dee" in text  # named, having no Feishu id

    from signoff.channels import PermanentDeliveryError

    with pytest.raises(PermanentDeliveryError, match="230011"):
        await channel.remind({"message_id": "om_gone"}, _card("req-feishu-1"), waiting, key="k")


def _card(request_id: str) -> Card:
    now = utcnow()
    return Card(
        request_id=request_id,
        agent_id="bot",
        tool_name='wipe <at user_id="all"></at>',
        arguments={},
        status="pending",
        created_at=now,
        expires_at=now + 30 * T,
        quorum=1,
        approvers=(),
    )


async def test_feishu_reminder_text_cannot_mention_everyone(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    ref = await channel.post(_card("req-feishu-2"))
    await channel.remind(ref, _card("req-feishu-2"), (), key="req-feishu-2-remind-1")
    [reply] = fake.replies_to(ref["message_id"])
    assert reply["mentions"] == []  # the tool name's tag stays text
