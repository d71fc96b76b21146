"""A gate that lists no approvers is open to anyone in its channel, but a channel can be shared
with another organisation (Slack Connect, a Feishu external group), whose members can press the
card's buttons too. The platform says so in every click: Slack's ``user.team_id`` is not the
``team.id`` the app is in; Feishu's ``operator.tenant_key`` is not the event's ``tenant_key``.
Such a member's click decides no open gate (neither approving nor rejecting), through the real
signed callbacks; a member of the channel's own organisation still decides it, and an outsider
who is a listed approver still counts where they are listed."""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent
from signoff.app.requests.eligibility import OUTSIDER
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.feishu._parse import parse_click
from signoff.channels.slack import ACTION_APPROVE
from signoff.channels.slack._payload import click_from_block_actions
from tests.channels.conftest import (  # noqa: F401  (fixtures)
    SLACK_NAME,
    _no_proxy,
    fake,
    fake_feishu_server,
    fake_slack,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack
from tests.channels.feishu_fake import FakeFeishu
from tests.channels.feishu_support import CHAT, card_action, make_channel, signed_encrypted
from tests.channels.slack_support import button_payload, form_body, signed, submission_payload
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

T = TypeVar("T")
HOME = "T111"
"""The workspace the Slack app is in: the team of the fixture's click."""
OPEN_GATE = {"type": "confirmation_gate", "name": "open", "tools": ["open_*"], "timeout": "30m"}


@pytest.fixture
def slack_gates() -> dict[str, Any]:
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    raw["agents"]["finance-bot"]["hooks"].append(dict(OPEN_GATE))
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = SLACK_NAME
    return raw


def _press(rid: str, user: str, user_team: str | None) -> dict[str, Any]:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    return _as(payload, user, user_team)


def _rejection(rid: str, user: str, user_team: str) -> dict[str, Any]:
    """The reason modal's submission (Slack's Reject button opens the modal)."""
    return _as(submission_payload("not ours to decide", request_id=rid), user, user_team)


def _as(payload: dict[str, Any], user: str, user_team: str | None) -> dict[str, Any]:
    payload["user"]["id"] = user
    if user_team is None:
        payload["user"].pop("team_id", None)
    else:
        payload["user"]["team_id"] = user_team
    return payload


async def _click(http: httpx.AsyncClient, payload: dict[str, Any]) -> None:
    body = form_body(payload)
    answer = await http.post(
        f"/callbacks/slack/{SLACK_NAME}", content=body, headers=signed(body, timestamp=int(time.time()))
    )
    assert answer.status_code == 200, answer.text


async def _ask(http: httpx.AsyncClient, agent: dict[str, str], tool: str, **arguments: Any) -> str:
    answer = await http.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": tool, "arguments": arguments}, headers=agent
    )
    assert answer.json()["decision"] == "pending", answer.text
    rid: str = answer.json()["request_id"]
    return rid


async def _until(check: Callable[[], Awaitable[T]], timeout: float = 10) -> T:
    """Await ``check`` until it gives something truthy (a click Slack was answered for is
    applied after the answer)."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, f"condition not met within {timeout:g} s"
        await asyncio.sleep(0.02)
    return value


async def _decided(http: httpx.AsyncClient, agent: dict[str, str], rid: str) -> dict[str, Any] | None:
    state: dict[str, Any] = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    return state if state["status"] != "pending" else None


async def _refusals(server: Server, rid: str) -> list[tuple[str | None, Any]]:
    async with server.runtime.sessions() as session:
        events = (
            await session.exec(
                select(AuditEvent)
                .where(col(AuditEvent.action) == "vote_refused", col(AuditEvent.request_id) == rid)
                .order_by(col(AuditEvent.seq))
            )
        ).all()
    return [(e.actor_id, e.detail["why"]) for e in events]


async def test_a_slack_connect_member_decides_no_open_gate(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    approve = await _ask(http, agent, "open_payout", to="acme")
    reject = await _ask(http, agent, "open_refund", to="acme")
    await eventually(lambda: len(fake_slack.calls_to("chat.postMessage")) == 2)

    await _click(http, _press(approve, "U0EXTERNAL", "T0EXTERNAL"))
    await _click(http, _rejection(reject, "U0EXTERNAL", "T0EXTERNAL"))
    for rid in (approve, reject):
        # Slack is answered at once; the click is applied after.
        assert await _until(lambda rid=rid: _refusals(server, rid)) == [("U0EXTERNAL", OUTSIDER)]
        state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
        assert (state["status"], state["votes"]) == ("pending", [])
    # Told where they clicked, as every refused click is.
    notes = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert any("another one" in n.args.get("text", "") for n in notes), notes

    # A member of the workspace the app is in decides it; a click without the user's team
    # (never sent by Slack) is read as the app's own workspace's, as before.
    await _click(http, _press(approve, "U0INSIDER", HOME))
    state = await _until(lambda: _decided(http, agent, approve))
    assert state["status"] == "approved"
    assert [v["user_id"] for v in state["votes"]] == ["U0INSIDER"]


async def test_a_listed_approver_from_another_organisation_still_counts(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    """Listing someone is the way to let a member of another organisation decide."""
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await _ask(http, agent, "pay_invoice", amount=60000)
    await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    await _click(http, _press(rid, "W0ALICE", "T0EXTERNAL"))
    state = await _until(lambda: _decided(http, agent, rid))
    assert state["status"] == "approved"


TEAMS = st.one_of(st.none(), st.sampled_from([HOME, "T0EXTERNAL", "t111", ""]))


@given(own=TEAMS, here=TEAMS)
def test_a_slack_click_is_an_outsiders_exactly_when_its_two_teams_differ(
    own: str | None, here: str | None
) -> None:
    payload = _press("req-1", "U0SOMEONE", own)
    payload["team"] = None if here is None else {**payload["team"], "id": here}
    click = click_from_block_actions(payload)
    assert click is not None
    assert click.outsider == (bool(own) and bool(here) and own != here)


TENANTS = st.one_of(st.none(), st.sampled_from(["736588c9260f175d", "tenant-external", ""]))


@given(own=TENANTS, here=TENANTS)
def test_a_feishu_click_is_an_outsiders_exactly_when_its_two_tenants_differ(
    own: str | None, here: str | None
) -> None:
    payload = card_action("req-1")
    for where, value in ((payload["event"]["operator"], own), (payload["header"], here)):
        if value is None:
            where.pop("tenant_key", None)
        else:
            where["tenant_key"] = value
    assert parse_click(payload).outsider == (bool(own) and bool(here) and own != here)


FEISHU = "ops-feishu"


@pytest.fixture
async def feishu_server(
    fake: FakeFeishu,  # noqa: F811
    settings: Settings,
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    channel = make_channel(fake, app_id=app_id)
    channel.name = FEISHU
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    raw["channels"][FEISHU] = {
        "type": "feishu",
        "app_id": app_id,
        "app_secret": "app-secret",
        "verification_token": "tok",
        "encrypt_key": "fixture-encrypt-key",
        "chat_id": CHAT,
        "base_url": fake.origin,
    }
    raw["agents"]["finance-bot"]["hooks"] = [{**OPEN_GATE, "channel": FEISHU}]
    runtime = Runtime.create(settings, parse_config(raw), channels={FEISHU: channel})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def test_a_feishu_external_member_decides_no_open_gate(
    feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = feishu_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await _ask(http, agent, "open_payout", to="acme")

    async def click(open_id: str, tenant: str) -> dict[str, Any]:
        action = card_action(rid, open_id=open_id, event_id=uuid.uuid4().hex)
        action["event"]["operator"]["tenant_key"] = tenant
        body, headers = signed_encrypted(action)
        answer = await http.post(f"/callbacks/feishu/{FEISHU}", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        toast: dict[str, Any] = answer.json()["toast"]
        return toast

    home = card_action(rid)["header"]["tenant_key"]
    outsider = await click("ou_external", "tenant-external")
    assert (outsider["type"], outsider["content"]) == ("warning", OUTSIDER)
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert (state["status"], state["votes"]) == ("pending", [])
    assert await _refusals(server, rid) == [("ou_external", OUTSIDER)]

    insider = await click("ou_insider", home)
    assert insider["type"] == "success"
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"] == "approved"
