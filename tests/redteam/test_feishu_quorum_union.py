"""One Feishu person is one voter in every app: an ``open_id`` is per app, the ``union_id`` the
same across a developer's apps. A gate with a quorum of two that escalates to a second
Feishu app's chat is not approved by one person clicking both cards."""

from __future__ import annotations

import asyncio
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
from tests.channels.conftest import fake, fake_feishu_server  # noqa: F401  (fixtures)
from tests.channels.feishu_fake import FakeFeishu
from tests.channels.feishu_support import card_action, make_channel, signed_encrypted
from tests.conftest import Server
from tests.redteam.support import age, status

OPS_CHAT, PAGER_CHAT = "oc_ops", "oc_pager"


def _raw(app_id: str, chat: str, feishu: FakeFeishu) -> dict[str, Any]:
    return {
        "type": "feishu",
        "app_id": app_id,
        "app_secret": "app-secret",
        "verification_token": "tok",
        "encrypt_key": "fixture-encrypt-key",
        "chat_id": chat,
        "base_url": feishu.origin,
    }


@pytest.fixture
async def world(
    fake: FakeFeishu,  # noqa: F811
    settings: Settings,
) -> AsyncIterator[tuple[Server, Dispatcher, httpx.AsyncClient, dict[str, str]]]:
    apps = {name: f"cli_{uuid.uuid4().hex[:16]}" for name in ("ops-feishu", "pager-feishu")}
    chats = {"ops-feishu": OPS_CHAT, "pager-feishu": PAGER_CHAT}
    channels = {}
    for name, app_id in apps.items():
        channel = make_channel(fake, app_id=app_id, chat=chats[name])
        channel.name = name
        channels[name] = channel
    config = {
        "channels": {name: _raw(apps[name], chats[name], fake) for name in apps},
        "agents": {
            "finance-bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "name": "two-person deploys",
                        "tools": ["deploy_*"],
                        "channel": "ops-feishu",
                        "quorum": 2,
                        "timeout": "30m",
                        "escalate": [{"after": "10m", "channel": "pager-feishu"}],
                    }
                ]
            }
        },
    }
    runtime = Runtime.create(settings, parse_config(config), channels=channels)
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            async with transaction(runtime.sessions) as session:
                _, key = await create_key(session, "finance-bot", actor=Actor("test"))
            yield server, dispatcher, http, {"Authorization": f"Bearer {key}"}
    finally:
        await runtime.aclose()


async def _click(http: httpx.AsyncClient, rid: str, channel: str, chat: str, open_id: str) -> dict[str, Any]:
    payload = card_action(
        rid, "approve", open_id=open_id, union_id="on_union_dave", chat=chat, event_id=uuid.uuid4().hex
    )
    body, headers = signed_encrypted(payload)
    answer = await http.post(f"/callbacks/feishu/{channel}", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_one_feishu_person_clicking_the_card_of_two_apps_meets_a_quorum_of_two(
    world: tuple[Server, Dispatcher, httpx.AsyncClient, dict[str, str]],
) -> None:
    server, dispatcher, http, agent = world
    runtime = server.runtime
    call = {"tool_name": "deploy_prod", "arguments": {"ref": "main"}, "idempotency_key": uuid.uuid4().hex}
    answer = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    assert answer["decision"] == "pending", answer
    rid = answer["request_id"]
    await dispatcher.run_once(now=utcnow())
    await age(runtime, rid, timedelta(minutes=11))
    await dispatcher.run_once(now=utcnow() + timedelta(minutes=11))

    # Dave: ou_dave_ops in the ops app, ou_dave_pager in the pager app; one union_id.
    first = await _click(http, rid, "ops-feishu", OPS_CHAT, "ou_daveops")
    assert first["toast"]["type"] == "success", first
    assert await status(runtime, rid) == "pending"
    await _click(http, rid, "pager-feishu", PAGER_CHAT, "ou_davepager")

    async with runtime.sessions() as s:
        votes = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    unions = {v.identity.get("union_id") for v in votes}
    assert await status(runtime, rid) == "pending", (
        f"approved by {len(unions)} person(s) (union ids {sorted(unions)}); voters {[v.voter for v in votes]}"
    )
