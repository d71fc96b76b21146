"""A callback signed correctly (by Slack's signing secret, by Feishu's encrypt key) is still
bad input when its shape is not the platform's: ``actions`` that is not a list, a modal's
``private_metadata`` or a button's value that is JSON nested past any parser's depth, a
challenge that no encoder can send back. Each is refused (4xx) or ignored, never a 500, and
decides nothing; through ``POST /callbacks/{type}/{channel}`` of the real server."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from signoff.channels.slack import ACTION_APPROVE, ACTION_EDIT, ACTION_REJECT, EDIT_MODAL_CALLBACK_ID
from tests.channels.conftest import (  # noqa: F401  (fixtures)
    _no_proxy,
    fake,
    fake_feishu_server,
    fake_slack,
    slack_gates,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack
from tests.channels.feishu_support import card_action, signed_encrypted
from tests.channels.slack_support import button_payload, signed, submission_payload
from tests.channels.test_feishu_flow import CHANNEL as FEISHU
from tests.channels.test_feishu_flow import feishu_server, pending_request  # noqa: F401  (fixture)
from tests.conftest import Server

SLACK = "ops-slack"
DEEP = "[" * 5000 + "]" * 5000
"""JSON nested deeper than Python's parser recurses."""


def _slack_body(payload: Any) -> bytes:
    return ("payload=" + quote(json.dumps(payload, separators=(",", ":")))).encode()


def _slack_shapes(rid: str) -> dict[str, Any]:
    shapes: dict[str, Any] = {}
    for action in (ACTION_APPROVE, ACTION_REJECT, ACTION_EDIT):
        for actions in (1, True):
            payload = button_payload(action, request_id=rid)
            payload["user"]["id"] = "W0MALLORY"
            payload["actions"] = actions
            shapes[f"{action} with actions {actions!r}"] = payload
    for callback_id in (None, EDIT_MODAL_CALLBACK_ID):
        payload = submission_payload("why", request_id=rid)
        payload["user"]["id"] = "W0MALLORY"
        if callback_id is not None:
            payload["view"]["callback_id"] = callback_id
        payload["view"]["private_metadata"] = DEEP
        shapes[f"{callback_id or 'reject modal'} with deep private_metadata"] = payload
    shapes["url_verification with a lone surrogate for its challenge"] = {
        "type": "url_verification",
        "challenge": "\ud800",
    }
    return shapes


async def test_slack_callbacks_of_a_shape_slack_never_sends_are_not_a_500(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    _server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    answer = await http.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": "pay_x", "arguments": {"amount": 60000}}, headers=agent
    )
    rid = answer.json()["request_id"]
    for what, payload in _slack_shapes(rid).items():
        body = _slack_body(payload)
        answer = await http.post(
            f"/callbacks/slack/{SLACK}", content=body, headers=signed(body, timestamp=int(time.time()))
        )
        assert answer.status_code < 500, (what, answer.status_code, answer.text)
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []


@pytest.mark.parametrize("edit", [False, True])
async def test_a_feishu_button_value_nested_past_the_parser_is_refused_not_a_500(
    feishu_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    edit: bool,
) -> None:
    _server, http = feishu_server
    rid = await pending_request(http, agent_key)
    payload = card_action(rid, open_id="ou_alice", event_id=uuid.uuid4().hex)
    # Legacy callbacks carry the value as a JSON string; here one no parser can read.
    payload["event"]["action"]["value"] = (
        json.dumps({"request_id": rid, "verdict": "approve"})[:-1] + ', "edit": ' + DEEP + "}"
        if edit
        else DEEP
    )
    body, headers = signed_encrypted(json.dumps(payload).encode(), nonce=uuid.uuid4().hex)
    answer = await http.post(f"/callbacks/feishu/{FEISHU}", content=body, headers=headers)
    assert answer.status_code == 400, (answer.status_code, answer.text)
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
