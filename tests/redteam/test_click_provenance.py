"""Slack clicks signed correctly but from somewhere the card was not: a listed approver's
press carried from another conversation (a copied or forwarded card, another workspace's
channel, another app of an org-wide install), from a view instead of a message (the Home
tab), or a press in the card's own conversation by someone of another organisation (a Slack
Connect member, whose ``user.team_id`` is not the workspace's). None of them counts: the
request stays pending and each is refused with the channel's notice and audited."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sqlmodel import col, select

from signoff.app.models import AuditEvent
from signoff.app.requests.eligibility import NOT_AN_APPROVER, NOT_HERE
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.conftest import (  # noqa: F401  (fixtures)
    _no_proxy,
    fake_slack,
    slack_gates,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import CHANNEL, FakeSlack
from tests.channels.slack_support import button_payload, form_body, signed
from tests.conftest import Server
from tests.waiting import eventually

SLACK = "ops-slack"


def _press(rid: str, user: str, **changes: Any) -> dict[str, Any]:
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    for key, value in changes.items():
        payload[key] = value
    return payload


def _elsewhere(rid: str) -> dict[str, dict[str, Any]]:
    moved = {"container": {"type": "message", "message_ts": "1.2", "channel_id": "C0OTHER"}}
    return {
        "copied into another channel": _press(rid, "W0ALICE", channel={"id": "C0OTHER"}, **moved),
        "another workspace": _press(
            rid,
            "W0ALICE",
            team={"id": "T0OTHER", "domain": "other"},
            channel={"id": "C0OTHER"},
            **moved,
        ),
        "another app of the org": _press(
            rid,
            "W0ALICE",
            api_app_id="A0OTHER",
            team=None,
            enterprise={"id": "E0OTHER", "name": "Other"},
            is_enterprise_install=True,
            channel={"id": "C0OTHER"},
            **moved,
        ),
        "the Home tab": {
            **{k: v for k, v in _press(rid, "W0ALICE").items() if k not in ("channel", "message")},
            "container": {"type": "view", "view_id": "V0HOME"},
            "view": {"id": "V0HOME", "type": "home"},
        },
    }


async def test_a_signed_press_from_anywhere_but_the_card_decides_nothing(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    answer = await http.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": "pay_x", "arguments": {"amount": 60000}}, headers=agent
    )
    rid = answer.json()["request_id"]
    await eventually(lambda: fake_slack.calls_to("chat.postMessage"))

    presses = _elsewhere(rid)
    # In the card's own conversation, by a member of another organisation (Slack Connect).
    external = _press(rid, "U0EXTERNAL")
    external["user"]["team_id"] = "T0EXTERNAL"
    presses["a Slack Connect member"] = external
    for what, payload in presses.items():
        body = form_body(payload)
        answer = await http.post(
            f"/callbacks/slack/{SLACK}", content=body, headers=signed(body, timestamp=int(time.time()))
        )
        assert answer.status_code == 200, (what, answer.status_code)

    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    async with server.runtime.sessions() as session:
        refused = (
            await session.exec(
                select(AuditEvent)
                .where(col(AuditEvent.action) == "vote_refused", col(AuditEvent.request_id) == rid)
                .order_by(col(AuditEvent.seq))
            )
        ).all()
    assert [(e.actor_id, e.detail["why"]) for e in refused] == [
        *[("W0ALICE", NOT_HERE)] * 4,
        ("U0EXTERNAL", NOT_AN_APPROVER),
    ]
    notes = await eventually(
        lambda: (
            len(fake_slack.calls_to("chat.postEphemeral")) == 4 and fake_slack.calls_to("chat.postEphemeral")
        )
    )
    # The Home tab has no conversation to tell the clicker in; the others are told where they clicked.
    assert sorted(n.args["channel"] for n in notes) == sorted(["C0OTHER"] * 3 + [CHANNEL])
