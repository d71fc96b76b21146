"""A Slack edit modal whose ``private_metadata`` was forged (fields the gate does not list or
redacts, another conversation, another request) changes nothing: the server decides by the
request and its gates."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from tests.channels.conftest import (  # noqa: F401  (fixtures)
    _no_proxy,
    fake_slack,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack
from tests.channels.test_edit_choices import (
    SLACK,
    open_modal,
    posted_buttons,
    pre,
    slack_gates,  # noqa: F401  (fixture: the edit gates slack_server runs)
    state,
    submission,
)
from tests.conftest import Server
from tests.redteam.support import property_test

PROPERTY = property_test(25)


FORGED = st.sampled_from(
    [
        # a field the gate does not list, or that is redacted, typed into a forged input
        {"fields": [["to", "text"]], "typed": "mallory"},
        {"fields": [["api_token", "text"]], "typed": "tok-mine"},
        {"fields": [["amount", "json"]], "typed": "2000000"},
        # the card's channel said to be another conversation
        {"channel_id": "C0OTHER", "fields": [["amount", "json"]], "typed": "5"},
        # another request's id
        {"request_id": "0" * 32, "fields": [["amount", "json"]], "typed": "5"},
    ]
)


@PROPERTY
@given(forged=FORGED)
async def test_a_forged_slack_edit_modal_changes_nothing(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    forged: dict[str, Any],
) -> None:
    """Whatever the modal's metadata claims (fields, channel, request), the server decides by
    the request and the gates: the call stays pending, or the edit is refused."""
    _server, http = slack_server
    call_answer = await pre(http, agent_key)
    rid = call_answer["request_id"]
    assert call_answer["decision"] == "pending", call_answer
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    metadata = json.loads(view["private_metadata"])
    metadata.update({k: v for k, v in forged.items() if k != "typed"})
    view = {**view, "private_metadata": json.dumps(metadata)}
    inputs = [b for b in view["blocks"] if b["type"] == "input"]
    typed = {i: (forged["typed"] if i == 0 else None) for i in range(len(inputs))}
    body, headers = submission(view, "W0ALICE", typed)
    await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    shown = await state(http, agent_key, rid)
    assert shown["status"] == "pending", shown
