"""Grants chosen on chat cards, end to end: the real server, signed Slack and Feishu callbacks.
A card offers the gate's grants beside "Approve once"; a click on one
approves with it; a forged or altered grant never gives anything."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from slack_sdk.models.blocks import Block
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent, Grant
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.fake_slack import FakeSlack
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu, validate_card
from tests.channels.feishu_support import CHAT, buttons, card_action, make_channel, signed_encrypted
from tests.channels.slack_support import button_payload, form_body, signed
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

SLACK = "ops-slack"
FEISHU = "ops-feishu"
GRANTS = [{"scope": "session", "for": "1h", "same": ["to"]}, {"scope": "agent", "for": "30m"}]
CALL = {"tool_name": "transfer_funds", "arguments": {"to": "acme", "amount": 10}, "session_id": "s-1"}


def _config(channel: str) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "transfers",
            "tools": ["transfer_*"],
            "channel": channel,
            "approvers": ["alice", "bob"],
            "timeout": "30m",
            "grants": GRANTS,
        }
    )
    return raw


@pytest.fixture
def slack_gates() -> dict[str, Any]:
    return _config(SLACK)


@pytest.fixture
async def feishu_server(
    fake: FakeFeishu, settings: Settings
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    app_id = f"cli_{uuid.uuid4().hex[:16]}"
    channel = make_channel(fake, app_id=app_id)
    raw = _config(FEISHU)
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
    runtime = Runtime.create(settings, parse_config(raw), channels={FEISHU: channel})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def pre(http: httpx.AsyncClient, key: str, body: dict[str, Any] = CALL) -> dict[str, Any]:
    answer: dict[str, Any] = (
        await http.post("/v1/hooks/pre-tool-use", json=body, headers={"Authorization": f"Bearer {key}"})
    ).json()
    return answer


async def audit_actions(server: Server) -> list[str]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(AuditEvent.action).order_by(col(AuditEvent.seq)))).all())


async def grants_of(server: Server) -> list[Grant]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Grant))).all())


# --- Slack ---------------------------------------------------------------------------------------


def slack_press(
    element: dict[str, Any], user: str, *, value: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """A signed click on ``element`` (a button of the posted card), its value as drawn unless given."""
    payload = button_payload(
        element["action_id"], request_id=value if value is not None else element["value"]
    )
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


async def posted_buttons(fake_slack: FakeSlack) -> list[dict[str, Any]]:
    [post] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    blocks = post.args["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    for block in blocks:
        Block.parse(block).validate_json()  # type: ignore[union-attr]
    [actions] = [b for b in blocks if b["type"] == "actions"]
    elements: list[dict[str, Any]] = actions["elements"]
    return elements


async def test_a_slack_grant_button_approves_with_that_grant(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    assert [e["text"]["text"] for e in elements] == [
        "Approve once",
        "Approve for this session (1h)",
        "Approve for this agent (30m)",
        "Reject",
    ]
    session_button = elements[1]
    assert session_button["confirm"]["title"]["text"] == "Approve for this session?"
    assert 'argument "to" stays the same' in session_button["confirm"]["text"]["text"]

    answer = await http.post(
        f"/callbacks/slack/{SLACK}", content=(p := slack_press(session_button, "W0ALICE"))[0], headers=p[1]
    )
    assert answer.status_code == 200
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "approved"
    assert (state["grant"]["scope"], state["grant"]["granted_by"]) == ("session", "Alice")

    later = await pre(http, agent_key, {**CALL, "arguments": {"to": "acme", "amount": 99}})
    assert later["decision"] == "allow"
    assert later["grant_id"] == state["grant"]["id"]

    def decided_card() -> Any:
        updates = fake_slack.calls_to("chat.update")
        return updates and "for this session" in json.dumps(updates[-1].args["blocks"]) and updates

    updates = await eventually(decided_card)
    outcome = json.dumps(updates[-1].args["blocks"])
    assert "*Approved* by <@W0ALICE> *for this session* until <!date^" in outcome


async def test_a_slack_approve_once_card_says_once(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    assert elements[0]["action_id"] == ACTION_APPROVE
    body, headers = slack_press(elements[0], "W0ALICE")
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    updates = await eventually(lambda: fake_slack.calls_to("chat.update"))
    assert "*Approved once* by <@W0ALICE>" in json.dumps(updates[-1].args["blocks"])
    assert await grants_of(server) == []
    assert (await pre(http, agent_key))["decision"] == "pending", "once means this call only"
    assert rid


@pytest.mark.parametrize(
    "grant",
    [
        {"scope": "agent", "seconds": 86400, "same": []},  # longer than offered
        {"scope": "session", "seconds": 3600, "same": []},  # a field dropped
        {"scope": "agent", "seconds": 3600, "same": []},  # scope and time mixed from two offers
    ],
)
async def test_an_altered_slack_grant_is_refused_and_nothing_changes(
    fake_slack: FakeSlack,
    slack_server: tuple[Server, httpx.AsyncClient],
    agent_key: str,
    grant: dict[str, Any],
) -> None:
    server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    altered = json.dumps({"request_id": rid, "grant": grant})
    body, headers = slack_press(elements[1], "W0ALICE", value=altered)
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "does not offer that grant" in note.args["text"]
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    assert await grants_of(server) == []
    assert "vote_refused" in await audit_actions(server)


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        json.dumps({"request_id": "r"}),
        json.dumps({"request_id": "r", "grant": {"scope": "forever", "seconds": 60, "same": []}}),
        json.dumps({"request_id": "r", "grant": {"scope": "agent", "seconds": 1.5, "same": []}}),
        json.dumps({"request_id": "r", "grant": {"scope": "agent", "seconds": 60, "same": []}, "x": 1}),
    ],
)
async def test_a_forged_slack_grant_value_is_refused(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str, value: str
) -> None:
    server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    body, headers = slack_press(elements[1], "W0ALICE", value=value.replace('"r"', json.dumps(rid)))
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 400
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert "callback_rejected" in await audit_actions(server)


async def test_a_slack_grant_from_a_non_approver_is_refused(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    body, headers = slack_press(elements[2], "W0CAROL")
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "not an approver" in note.args["text"]
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert await grants_of(server) == []


async def test_a_call_without_a_session_is_offered_no_session_grant(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    await pre(http, agent_key, {k: v for k, v in CALL.items() if k != "session_id"})
    elements = await posted_buttons(fake_slack)
    assert [e["text"]["text"] for e in elements] == ["Approve once", "Approve for this agent (30m)", "Reject"]


# --- Feishu --------------------------------------------------------------------------------------


async def feishu_press(
    http: httpx.AsyncClient, value: dict[str, Any], who: str, event: str
) -> httpx.Response:
    payload = card_action(value["request_id"], value["verdict"], open_id=who, event_id=event)
    payload["event"]["action"]["value"] = value
    body, headers = signed_encrypted(payload)
    return await http.post(f"/callbacks/feishu/{FEISHU}", content=body, headers=headers)


async def test_a_feishu_grant_button_approves_with_that_grant(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = feishu_server
    rid = (await pre(http, agent_key))["request_id"]
    [send] = await eventually(lambda: fake.calls("POST", MESSAGES_PATH))
    posted = validate_card(send.json["content"])
    labels = [b["text"]["content"] for b in buttons(posted)]
    assert labels == [
        "Approve once",
        "Approve for this session (1h)",
        "Approve for this agent (30m)",
        "Reject",
    ]
    grant_button = buttons(posted)[2]
    assert grant_button["confirm"]["title"]["content"] == "Approve for this agent?"
    [behavior] = grant_button["behaviors"]

    answer = await feishu_press(http, behavior["value"], "ou_alice", "ev-grant")
    assert answer.json()["toast"]["type"] == "success"
    assert "for this agent until" in answer.json()["toast"]["content"]
    redrawn = json.dumps(answer.json()["card"]["data"])
    assert "Approved for this agent until" in redrawn
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert (state["grant"]["scope"], state["grant"]["session_id"]) == ("agent", None)
    later = await pre(http, agent_key, {**CALL, "session_id": "s-other", "arguments": {"to": "x"}})
    assert later["decision"] == "allow"


async def test_an_altered_or_forged_feishu_grant_is_refused(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = feishu_server
    rid = (await pre(http, agent_key))["request_id"]
    longer = {
        "request_id": rid,
        "verdict": "approve",
        "grant": {"scope": "agent", "seconds": 86400, "same": []},
    }
    refused = (await feishu_press(http, longer, "ou_alice", "ev-a")).json()
    assert refused["toast"]["type"] != "success"
    assert "does not offer that grant" in refused["toast"]["content"]
    for i, forged in enumerate(
        [
            {"request_id": rid, "verdict": "approve", "grant": "agent:1d"},
            {
                "request_id": rid,
                "verdict": "reject",
                "grant": {"scope": "agent", "seconds": 1800, "same": []},
            },
        ]
    ):
        assert (await feishu_press(http, forged, "ou_alice", f"ev-f{i}")).status_code == 400
    stranger = {
        "request_id": rid,
        "verdict": "approve",
        "grant": {"scope": "agent", "seconds": 1800, "same": []},
    }
    assert (
        "not an approver"
        in (await feishu_press(http, stranger, "ou_carol", "ev-c")).json()["toast"]["content"]
    )
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    assert await grants_of(server) == []
