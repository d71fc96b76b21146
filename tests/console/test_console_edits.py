"""The console and approving with changes: the decision form holds the gate's editable fields
with their current values; changing one approves the changed call; a change the gates do not
allow is shown and changes nothing; a call run otherwise than approved is flagged."""

from __future__ import annotations

import copy
import html
import re
from typing import Any

import pytest

from signoff.app.config import SignoffConfig, parse_config
from tests.conftest import DEFAULT_CONFIG
from tests.console.conftest import Agent, Console

ARGUMENTS = {"to": "acme", "amount": 90000, "memo": "invoice 7"}


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "sends",
            "tools": ["send_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "editable": ["amount", "memo"],
        },
        {
            "type": "confirmation_gate",
            "name": "treasury",
            "tools": ["send_*"],
            "when": "args.amount >= 1000000",
            "channel": "chat",
            "approvers": ["carol"],
        },
    ]
    body["operators"] = {"alice": {"password_hash": password_hashes["alice"], "person": "alice"}}
    return parse_config(body, source="console-edits.yaml")


async def submit(console: Console, rid: str, **fields: str) -> str:
    token = await console.form_token(f"/ui/requests/{rid}")
    r = await console.client.post(
        f"/ui/requests/{rid}/decision", data={"csrf_token": token, "verdict": "approve", **fields}
    )
    assert r.status_code == 303, r.text
    return (await console.get(f"/ui/requests/{rid}")).text


async def test_the_decision_form_approves_with_changes(alice: Console, agent: Agent) -> None:
    rid = await agent.ask("send_payment", arguments=ARGUMENTS, idempotency_key="k-1")
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert "Approve with changes" in page
    assert 'name="edit:json:amount" value="90000"' in page
    assert 'name="edit:text:memo" value="invoice 7"' in page

    shown = html.unescape(
        await submit(alice, rid, **{"edit:json:amount": "40000", "edit:text:memo": "invoice 7"})
    )
    outcome = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", shown.split('id="decide-title">Outcome</h2>')[1]))
    assert re.match(r" approved by Alice via web at [\d-]+ [\d:]+ UTC, with these changes: amount", outcome)
    assert ":." not in outcome, outcome
    changes = shown.split('<ul class="changes">')[1].split("</ul>")[0]
    assert "amount 90000 → 40000" in changes
    assert "memo" not in changes, "an unchanged field is no change"

    replay = await agent.client.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": "send_payment", "arguments": ARGUMENTS, "idempotency_key": "k-1"},
    )
    assert replay.json()["modified_arguments"] == {**ARGUMENTS, "amount": 40000}

    # Run as proposed instead: the request page flags it.
    report = {"tool_name": "send_payment", "arguments": ARGUMENTS, "idempotency_key": "k-1", "result": "ok"}
    assert (await agent.client.post("/v1/hooks/post-tool-use", json=report)).status_code == 200
    flagged = (await alice.get(f"/ui/requests/{rid}")).text
    assert "Executed otherwise than approved" in flagged


async def test_a_change_the_gates_do_not_allow_is_shown_and_changes_nothing(
    alice: Console, agent: Agent
) -> None:
    rid = await agent.ask("send_payment", arguments=ARGUMENTS)
    shown = html.unescape(await submit(alice, rid, **{"edit:json:amount": "5000000"}))
    assert "the gate &#39;treasury&#39;" in shown or "the gate 'treasury'" in shown
    assert await agent.status(rid) == "pending"
    oversized = html.unescape(await submit(alice, rid, **{"edit:text:memo": "x" * 5000}))
    assert "bytes" in oversized
    assert await agent.status(rid) == "pending"
