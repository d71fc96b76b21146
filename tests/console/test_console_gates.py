"""A call several gates matched, on the console over real HTTP:
the request page shows every gate with its own approvals, the queue each gate's progress,
and the reason one gate requires is required on the console's form."""

from __future__ import annotations

import copy
import csv
import html
import io
import re
from typing import Any

import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.conftest import DEFAULT_CONFIG
from tests.console.conftest import Agent, Console, operators
from tests.console.test_console_http import _as, events_of, status_of


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:
    """The default test config plus two gates on ``deploy_*``: ``deploy`` in the chat (Alice
    and Bob, two approvals, self-approval allowed) and, for calls that name a cost,
    ``finance`` in the console (Carol, one approval, a reason to reject); and ``publish_*``
    in the console alone (Alice)."""
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "deploy",
            "tools": ["deploy_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "quorum": 2,
            "timeout": "30m",
            "allow_self_approval": True,
        },
        {
            "type": "confirmation_gate",
            "name": "finance",
            "tools": ["deploy_*"],
            "when": "has(args.cost)",
            "channel": "web",
            "approvers": ["carol"],
            "timeout": "10m",
            "require_reject_reason": True,
        },
        {
            "type": "confirmation_gate",
            "name": "publish",
            "tools": ["publish_*"],
            "channel": "web",
            "approvers": ["alice"],
        },
    ]
    body["operators"] = operators(password_hashes)
    return parse_config(body, source="console-gates.yaml")


def panels(page: str) -> list[str]:
    """The request page's gate panels, in order."""
    section = page.split('id="gate-title"')[1].split("<h3>The call</h3>")[0]
    return [html.unescape(p.split("</dl>")[0]) for p in section.split("data-gate=")[1:]]


def facts(panel: str) -> dict[str, str]:
    """A panel's facts, as its reader sees them (tags dropped)."""
    pairs = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", panel, re.S)
    return {dt: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", dd)).strip() for dt, dd in pairs}


def queue_row(page: str, rid: str) -> str:
    m = re.search(rf'<tr data-request-id="{rid}">(.*?)</tr>', page, re.S)
    assert m is not None, f"no row for {rid}"
    return html.unescape(m.group(1))


def approvals_cell(row: str) -> str:
    m = re.search(r'<span class="approvals">(.*?)</span>', row)
    assert m is not None
    return m.group(1)


def flash(page: str) -> str:
    m = re.search(r'<div class="flash (?:ok|error)" role="(?:status|alert)">(.*?)</div>', page, re.S)
    assert m is not None, "no message on the page"
    return html.unescape(m.group(1))


def queue_version(page: str) -> str:
    m = re.search(r'hx-get="/ui/queue/rows\?v=([0-9a-f]+)"', page)
    assert m is not None
    return m.group(1)


async def test_the_queue_names_each_request_s_channels_and_only_a_chat_card_shows_the_reason(
    alice: Console, agent: Agent
) -> None:
    both = await agent.ask("deploy_api", arguments={"service": "api", "cost": 1200})
    chat = await agent.ask("deploy_api", arguments={"service": "api"})
    web = await agent.ask("publish_post", arguments={"title": "x"})
    queue = (await alice.get("/ui/")).text
    assert '<th scope="col">Channel</th>' in queue
    channels = {
        rid: re.search(r'<td data-label="Channel">(.*?)</td>', queue_row(queue, rid))
        for rid in (both, chat, web)
    }
    assert {rid: m.group(1) if m else None for rid, m in channels.items()} == {
        both: "chat · web",
        chat: "chat",
        web: "web",
    }
    hint = "shown to the agent and on the chat card."
    assert hint in (await alice.get(f"/ui/requests/{both}")).text
    assert hint in (await alice.get(f"/ui/requests/{chat}")).text
    page = (await alice.get(f"/ui/requests/{web}")).text
    assert "chat card" not in page
    assert "Recorded with your vote as Alice, shown to the agent." in page


async def test_each_gate_is_shown_with_its_own_progress(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    rid = await agent.ask("deploy_api", arguments={"service": "api", "cost": 1200})
    version = runtime.config.version

    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert "The gates that matched" in page
    assert "The gate that matched" not in page
    deploy, finance = (facts(p) for p in panels(page))
    assert deploy == {
        "Gate": "deploy",
        "Channel": "chat (fake)",
        "Approvers": "Alice (alice), Bob (bob)",
        "Approvals": "0 of 2",
        "Timeout": "30m",
        "Self-approval": "allowed",
        "Reject reason": "optional",
        "Configuration": version,
        "Tools": "deploy_*",
        "Condition": "always",
    }
    assert finance == {
        "Gate": "finance",
        "Channel": "web (web)",
        "Approvers": "Carol (carol)",
        "Approvals": "0 of 1",
        "Timeout": "10m",
        "Self-approval": "not allowed",
        "Reject reason": "required",
        "Configuration": version,
        "Tools": "deploy_*",
        "Condition": "has(args.cost)",
    }
    assert '<label for="reason">Reason (required to reject)</label>' in page, "finance asks for one"
    assert "Your vote counts for deploy only: finance has to approve too." in html.unescape(page)
    assert 'Votes <span class="muted">(deploy 0/2 · finance 0/1)</span>' in page

    queue = (await alice.get("/ui/")).text
    assert approvals_cell(queue_row(queue, rid)) == "deploy 0/2 · finance 0/1"
    before = queue_version(queue)

    # Alice's approval counts for deploy, hers to approve, and nothing else.
    await alice.decide(rid, "approve")
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert flash(page) == (
        "Approval recorded (deploy 1 of 2); still waiting for deploy 1 of 2, finance 0 of 1."
    )
    assert [facts(p)["Approvals"] for p in panels(page)] == ["1 of 2", "0 of 1"]
    assert 'Votes <span class="muted">(deploy 1/2 · finance 0/1)</span>' in page
    assert '<td data-label="Gate">deploy</td>' in page, "the vote names the gate it counts for"
    changed = await alice.get(f"/ui/queue/rows?v={before}", headers={"HX-Request": "true"})
    assert changed.status_code == 200, "the queue sees the vote"
    assert approvals_cell(queue_row(changed.text, rid)) == "deploy 1/2 · finance 0/1"
    history = (await alice.get("/ui/history?status=pending")).text
    assert "deploy 1/2 · finance 0/1" in queue_row(history, rid)

    # Carol's approval completes finance; deploy still waits for its second approver.
    carol = await _as(alice, "carol-ops")
    try:
        await carol.decide(rid, "approve")
        assert flash((await carol.get(f"/ui/requests/{rid}")).text) == (
            "Approval recorded (finance 1 of 1); still waiting for deploy 1 of 2."
        )
    finally:
        await carol.aclose()
    assert await status_of(runtime, rid) == "pending"
    queue = (await alice.get("/ui/")).text
    assert approvals_cell(queue_row(queue, rid)) == "deploy 1/2 · finance 1/1"
    export = list(csv.DictReader(io.StringIO((await alice.get("/ui/history/export.csv")).text)))
    (row,) = [r for r in export if r["id"] == rid]
    assert (row["approvals"], row["quorum"], row["gate"]) == ("2", "3", "deploy · finance")

    bob = await _as(alice, "bob")
    try:
        await bob.decide(rid, "approve")
    finally:
        await bob.aclose()
    assert await status_of(runtime, rid) == "approved"
    assert rid not in (await alice.get("/ui/")).text


async def test_the_second_gates_reject_reason_is_required_on_the_form(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    rid = await agent.ask("deploy_api", arguments={"service": "api", "cost": 1200})
    carol = await _as(alice, "carol-ops")
    try:
        page = html.unescape((await carol.get(f"/ui/requests/{rid}")).text)
        assert '<label for="reason">Reason (required to reject)</label>' in page
        assert "Your vote counts for finance only: deploy has to approve too." in page

        await carol.decide(rid, "reject", "   ")
        page = (await carol.get(f"/ui/requests/{rid}")).text
        assert flash(page) == "A reason is required to reject this request."
        assert await status_of(runtime, rid) == "pending"
        assert [e.action for e in await events_of(runtime, rid)] == ["created", "vote_refused"]

        await carol.decide(rid, "reject", "over budget")
        assert flash((await carol.get(f"/ui/requests/{rid}")).text) == "Rejected by Carol."
    finally:
        await carol.aclose()
    assert await status_of(runtime, rid) == "rejected"


async def test_a_call_one_gate_matched_shows_that_gate_alone(alice: Console, agent: Agent) -> None:
    rid = await agent.ask("deploy_api", arguments={"service": "api"})  # no cost: deploy alone
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert "The gate that matched" in page
    assert "The gates that matched" not in page
    (deploy,) = (facts(p) for p in panels(page))
    shown = (deploy["Gate"], deploy["Approvals needed"], deploy["Reject reason"])
    assert shown == ("deploy", "2", "optional")
    assert "Approvals" not in deploy
    assert '<label for="reason">Reason (optional)</label>' in page
    assert "Your vote counts for" not in page
    await alice.decide(rid, "approve")
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert flash(page) == "Approval recorded (1 of 2)."
    assert 'Votes <span class="muted">(1 of 2 approvals)</span>' in page
    assert 'data-label="Gate"' not in page
    assert approvals_cell(queue_row((await alice.get("/ui/")).text, rid)) == "1 / 2"
