"""A quorum counts people, not the channels they click from.

A gate that escalates to a second channel of the same type (a second Slack conversation of
the same workspace, where a user has the same id) shows one person two cards: their clicks
on both are one vote, for an approver listed by raw Slack id and for everyone on a gate
open to anyone who sees the card."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.audit import Actor
from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import Vote, utcnow
from signoff.app.outbox import Dispatcher
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.conftest import _no_proxy, fake_slack  # noqa: F401  (fixtures)
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.slack_support import SECRET, button_payload, form_body, signed
from tests.conftest import Server
from tests.redteam.support import age, status

PAGER = "C0PAGER"


def world_config(fake: FakeSlack) -> dict[str, Any]:
    def channel(conversation: str) -> dict[str, str]:
        return {
            "type": "slack",
            "bot_token": BOT_TOKEN,
            "signing_secret": SECRET,
            "channel": conversation,
            "base_url": fake.base_url,
        }

    def gate(name: str, tools: str, approvers: list[str]) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": "ops-slack",
            "approvers": approvers,
            "quorum": 2,
            "timeout": "30m",
            "escalate": [{"after": "10m", "channel": "pager-slack", "approvers": ["carol"]}],
        }

    return {
        "channels": {"ops-slack": channel(CHANNEL), "pager-slack": channel(PAGER)},
        "people": {"carol": {"name": "Carol", "slack": "W0CAROL"}},
        "agents": {
            "finance-bot": {
                "hooks": [
                    # Two-person rule: two of the listed (raw Slack id) approvers, or carol later.
                    gate("two-person wires", "wire_*", ["W0DAVE", "W0ERIN"]),
                    # Two-person rule among anyone in the channel.
                    gate("two-person deploys", "deploy_*", []),
                ]
            }
        },
    }


@pytest.fixture
async def world(
    fake_slack: FakeSlack,  # noqa: F811
    settings: Settings,
) -> AsyncIterator[tuple[Server, Dispatcher, httpx.AsyncClient, dict[str, str]]]:
    fake_slack.conversations.add(PAGER)
    runtime = Runtime.create(settings, parse_config(world_config(fake_slack)))
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            async with transaction(runtime.sessions) as session:
                _, key = await create_key(session, "finance-bot", actor=Actor("test"))
            yield server, dispatcher, http, {"Authorization": f"Bearer {key}"}
    finally:
        await runtime.aclose()


async def click(http: httpx.AsyncClient, rid: str, user: str, channel: str, conversation: str) -> str:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["container"]["channel_id"] = conversation
    payload["channel"]["id"] = conversation
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    headers = signed(body, timestamp=int(time.time()))
    answer = await http.post(f"/callbacks/slack/{channel}", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.text


@pytest.mark.parametrize(("tool", "clicker"), [("wire_money", "W0DAVE"), ("deploy_prod", "W0MALLORY")])
async def test_one_person_clicking_the_card_and_its_escalation_meets_a_quorum_of_two(
    world: tuple[Server, Dispatcher, httpx.AsyncClient, dict[str, str]], tool: str, clicker: str
) -> None:
    server, dispatcher, http, agent = world
    runtime = server.runtime
    call = {"tool_name": tool, "arguments": {"to": "acme"}, "idempotency_key": uuid.uuid4().hex}
    answer = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    assert answer["decision"] == "pending", answer
    rid = answer["request_id"]
    await dispatcher.run_once(now=utcnow())  # the card in ops-slack
    await age(runtime, rid, timedelta(minutes=11))  # nobody decided: it escalates to pager-slack
    await dispatcher.run_once(now=utcnow() + timedelta(minutes=11))

    await click(http, rid, clicker, "ops-slack", CHANNEL)
    assert await status(runtime, rid) == "pending"  # 1 of 2
    await click(http, rid, clicker, "pager-slack", PAGER)  # the same person, on the escalated card

    async with runtime.sessions() as s:
        votes = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    people = {(v.user_id) for v in votes if v.verdict == "approve"}
    assert await status(runtime, rid) == "pending", (
        f"approved by {len(people)} person(s) {sorted(people)} with keys {[v.voter for v in votes]}"
    )
    replay = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    assert replay["decision"] != "allow", replay
