"""Approving with changes on chat cards, end to end: the real server, signed Slack callbacks (the
"Edit and approve" button opening a modal through ``views.open``, then its ``view_submission``)
and signed Feishu card forms. The agent gets the changed call; a
change the gates do not allow is shown to the approver and changes nothing."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from slack_sdk.models.blocks import Block

from signoff.app.config import parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_EDIT, EDIT_ACTION_ID, EDIT_MODAL_CALLBACK_ID
from tests.channels.fake_slack import FakeSlack, Scripted
from tests.channels.feishu_fake import MESSAGES_PATH, FakeFeishu, validate_card
from tests.channels.feishu_support import CHAT, card_action, make_channel, signed_encrypted, walk
from tests.channels.slack_support import button_payload, fixture, form_body, signed
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

SLACK = "ops-slack"
FEISHU = "ops-feishu"
CALL: dict[str, Any] = {
    "tool_name": "send_payment",
    "arguments": {"to": "acme", "amount": 90000, "memo": "invoice 7", "api_token": "tok-live-123"},
    "session_id": "s-1",
    "idempotency_key": "pay:acme:90000",
}


def _config(channel: str) -> dict[str, Any]:
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    raw["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "sends",
            "tools": ["send_*"],
            "channel": channel,
            "approvers": ["alice", "bob"],
            "timeout": "30m",
            "editable": ["amount", "memo"],
        },
        {
            "type": "confirmation_gate",
            "name": "treasury",
            "tools": ["send_*"],
            "when": "args.amount >= 1000000",
            "channel": channel,
            "approvers": ["carol"],
            "timeout": "30m",
        },
    ]
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
    for person in ("alice", "bob", "carol"):
        raw["people"][person]["feishu"] = f"ou_{person}"
    runtime = Runtime.create(settings, parse_config(raw), channels={FEISHU: channel})
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def pre(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    answer: dict[str, Any] = (
        await http.post("/v1/hooks/pre-tool-use", json=CALL, headers={"Authorization": f"Bearer {key}"})
    ).json()
    return answer


async def state(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    answer: dict[str, Any] = (
        await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})
    ).json()
    return answer


# --- Slack ---------------------------------------------------------------------------------------


async def posted_buttons(fake_slack: FakeSlack) -> list[dict[str, Any]]:
    [post] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    blocks = post.args["blocks"]
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    for block in blocks:
        Block.parse(block).validate_json()  # type: ignore[union-attr]
    [actions] = [b for b in blocks if b["type"] == "actions"]
    elements: list[dict[str, Any]] = actions["elements"]
    return elements


def press_edit(rid: str, user: str, trigger: str) -> tuple[bytes, dict[str, str]]:
    payload = button_payload(ACTION_EDIT, request_id=rid)
    payload["user"]["id"] = user
    payload["trigger_id"] = trigger
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


def submission(view: dict[str, Any], user: str, typed: dict[int, str | None]) -> tuple[bytes, dict[str, str]]:
    """The bolt-python ``view_submission``, as Slack sends it for the modal ``view`` we opened."""
    payload = fixture("view_submission_bolt_python_input_block.json")
    payload["user"]["id"] = user
    sent = payload["view"]
    sent.update(
        id=f"V{uuid.uuid4().hex[:8]}",
        callback_id=view["callback_id"],
        private_metadata=view["private_metadata"],
        blocks=view["blocks"],
    )
    sent["state"]["values"] = {
        block["block_id"]: {
            EDIT_ACTION_ID: {
                "type": "plain_text_input",
                "value": typed.get(i, block["element"].get("initial_value")),
            }
        }
        for i, block in enumerate(b for b in view["blocks"] if b["type"] == "input")
    }
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


async def open_modal(
    fake_slack: FakeSlack, http: httpx.AsyncClient, rid: str, user: str = "W0ALICE"
) -> dict[str, Any]:
    trigger = f"{uuid.uuid4().hex}.trigger"
    body, headers = press_edit(rid, user, trigger)
    answer = await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    assert answer.status_code == 200
    opened = [c for c in fake_slack.calls_to("views.open") if c.args["trigger_id"] == trigger]
    assert len(opened) == 1, "views.open is called before the acknowledgement"
    view = opened[0].args["view"]
    view = json.loads(view) if isinstance(view, str) else view
    assert isinstance(view, dict)
    return view


async def test_edit_and_approve_in_slack_runs_the_changed_call(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    elements = await posted_buttons(fake_slack)
    assert [e["text"]["text"] for e in elements] == ["Approve", "Edit and approve", "Reject"]

    view = await open_modal(fake_slack, http, rid)
    assert view["callback_id"] == EDIT_MODAL_CALLBACK_ID
    inputs = [b for b in view["blocks"] if b["type"] == "input"]
    assert [(b["label"]["text"], b["element"]["initial_value"]) for b in inputs] == [
        ("amount", "90000"),
        ("memo", "invoice 7"),
    ], "the modal opens with the current values; the redacted field is not offered"

    body, headers = submission(view, "W0ALICE", {0: "40000"})
    answer = await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    assert answer.status_code == 200
    assert answer.json() == {"response_action": "clear"}

    decided = await state(http, agent_key, rid)
    assert decided["status"] == "approved"
    assert decided["changes"] == [
        {"field": "amount", "proposed": 90000, "approved": 40000, "proposed_absent": False}
    ]
    replay = await pre(http, agent_key)
    assert replay["modified_arguments"] == {**CALL["arguments"], "amount": 40000}

    def decided_card() -> Any:
        updates = fake_slack.calls_to("chat.update")
        return updates and "with changes" in json.dumps(updates[-1].args["blocks"]) and updates

    updates = await eventually(decided_card)
    outcome = json.dumps(updates[-1].args["blocks"], ensure_ascii=False)
    assert "*Approved* by <@W0ALICE> *with changes:* amount 90000 → 40000" in outcome


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ({0: "2000000"}, "the gate 'treasury'"),
        ({1: "é" * 2500}, "bytes"),
    ],
)
async def test_a_refused_slack_edit_is_shown_on_the_modal_and_changes_nothing(
    fake_slack: FakeSlack,
    slack_server: tuple[Server, httpx.AsyncClient],
    agent_key: str,
    typed: dict[int, str],
    says: str,
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    body, headers = submission(view, "W0ALICE", typed)
    answer = (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).json()
    assert answer["response_action"] == "errors"
    [message] = answer["errors"].values()
    assert says in message
    assert (await state(http, agent_key, rid))["status"] == "pending"


async def test_a_slack_edit_by_a_non_approver_is_refused(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid, user="W0CAROL")
    body, headers = submission(view, "W0CAROL", {0: "1"})
    answer = (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).json()
    assert "not an approver" in next(iter(answer["errors"].values()))
    assert (await state(http, agent_key, rid))["votes"] == []


async def test_an_unsigned_slack_edit_is_refused(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    body, headers = submission(view, "W0ALICE", {0: "1"})
    headers["X-Slack-Signature"] = "v0=" + "0" * 64
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 401
    assert (await state(http, agent_key, rid))["status"] == "pending"


async def test_a_call_too_large_for_the_card_offers_no_edit_and_opens_no_form(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    many = {f"line_item_{i:03d}_{'x' * 30}": i for i in range(300)}
    call = {**CALL, "arguments": {**CALL["arguments"], **many}, "idempotency_key": "pay:many"}
    agent = {"Authorization": f"Bearer {agent_key}"}
    answer = await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)
    rid = answer.json()["request_id"]
    elements = await posted_buttons(fake_slack)
    assert [e["text"]["text"] for e in elements] == ["Reject"]

    # A press of "Edit and approve" all the same (an older card, a forged button) opens nothing.
    body, headers = press_edit(rid, "W0ALICE", "large.trigger")
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "does not fit on a card" in note.args["text"]
    assert fake_slack.calls_to("views.open") == []
    assert (await state(http, agent_key, rid))["votes"] == []


async def test_a_failed_views_open_tells_the_clicker(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    fake_slack.fail_next("views.open", Scripted(error="expired_trigger_id"))
    body, headers = press_edit(rid, "W0ALICE", "stale.trigger")
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "Could not open the edit form" in note.args["text"]
    # A trigger is taken once: pressing again with the spent one fails the same way.
    body, headers = press_edit(rid, "W0ALICE", "once.trigger")
    await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    body, headers = press_edit(rid, "W0ALICE", "once.trigger")
    await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    notes = await eventually(lambda: len(fake_slack.calls_to("chat.postEphemeral")) >= 2 or None)
    assert notes
    assert (await state(http, agent_key, rid))["status"] == "pending"


# --- Feishu --------------------------------------------------------------------------------------


def edit_form(card_json: dict[str, Any]) -> dict[str, Any]:
    [form] = [e for e in walk(card_json) if e["tag"] == "form" and e["name"] == "edit_form"]
    return form


async def feishu_submit(
    http: httpx.AsyncClient, form: dict[str, Any], who: str, typed: dict[str, str], event: str
) -> httpx.Response:
    [submit] = [e for e in form["elements"] if e["tag"] == "button"]
    [behavior] = submit["behaviors"]
    payload = card_action(behavior["value"]["request_id"], "approve", open_id=who, event_id=event)
    action = payload["event"]["action"]
    action["value"] = behavior["value"]
    action["name"] = submit["name"]
    action["form_value"] = {
        e["name"]: typed.get(e["name"], e.get("default_value", ""))
        for e in form["elements"]
        if e["tag"] == "input"
    }
    body, headers = signed_encrypted(payload)
    return await http.post(f"/callbacks/feishu/{FEISHU}", content=body, headers=headers)


async def test_a_feishu_edit_form_approves_with_changes(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = feishu_server
    rid = (await pre(http, agent_key))["request_id"]
    [send] = await eventually(lambda: fake.calls("POST", MESSAGES_PATH))
    posted = validate_card(send.json["content"])
    form = edit_form(posted)
    inputs = [e for e in form["elements"] if e["tag"] == "input"]
    assert [(e["label"]["content"], e["default_value"]) for e in inputs] == [
        ("amount", "90000"),
        ("memo", "invoice 7"),
    ]
    answer = (await feishu_submit(http, form, "ou_alice", {"edit_0": "40000"}, "ev-edit")).json()
    assert answer["toast"]["type"] == "success"
    assert "with changes: amount 90000 → 40000" in answer["toast"]["content"]
    redrawn = json.dumps(answer["card"]["data"], ensure_ascii=False)
    assert "Approved by Alice with changes: amount 90000 → 40000" in redrawn
    assert "edit_form" not in redrawn
    decided = await state(http, agent_key, rid)
    assert decided["approved_arguments"]["amount"] == 40000


async def test_a_refused_feishu_edit_is_a_warning_and_changes_nothing(
    fake: FakeFeishu, feishu_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _server, http = feishu_server
    rid = (await pre(http, agent_key))["request_id"]
    [send] = await eventually(lambda: fake.calls("POST", MESSAGES_PATH))
    form = edit_form(validate_card(send.json["content"]))
    escaped = (await feishu_submit(http, form, "ou_alice", {"edit_0": "5000000"}, "ev-1")).json()
    assert escaped["toast"]["type"] == "warning"
    assert "the gate 'treasury'" in escaped["toast"]["content"]
    oversized = (await feishu_submit(http, form, "ou_alice", {"edit_1": "é" * 2100}, "ev-2")).json()
    assert oversized["toast"]["type"] == "warning"
    assert "bytes" in oversized["toast"]["content"]
    stranger = (await feishu_submit(http, form, "ou_carol", {"edit_0": "1"}, "ev-3")).json()
    assert "not an approver" in stranger["toast"]["content"]
    decided = await state(http, agent_key, rid)
    assert (decided["status"], decided["votes"]) == ("pending", [])
