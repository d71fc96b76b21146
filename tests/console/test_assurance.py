"""How each vote's voter was identified, over real HTTP: recorded with the vote, shown on the
console's request page and in the API, exported in the history (CSV and JSON Lines), and
``min_assurance`` on a gate refusing votes identified less surely, saying so."""

from __future__ import annotations

import copy
import csv
import io
import json
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.audit import Action
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import Vote
from signoff.app.runtime import Runtime
from signoff.channels import ASSURANCE_RANKS, Assurance, below
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server
from tests.console.conftest import Agent, Console, operators
from tests.console.test_console_http import _as, events_of, status_of

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:
    """The default test config plus ``strict_*`` in the console, needing a vote identified by
    the organisation's sign-in (OIDC)."""
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "strict",
            "tools": ["strict_*"],
            "channel": "web",
            "approvers": ["alice", "bob"],
            "min_assurance": "oidc",
        },
    ]
    body["operators"] = operators(password_hashes)
    return parse_config(body, source="console-assurance.yaml")


async def _votes(runtime: Runtime, rid: str) -> list[Vote]:
    async with runtime.reads() as s:
        found = await s.exec(select(Vote).where(col(Vote.request_id) == rid).order_by(col(Vote.id)))
        return list(found.all())


def test_every_level_has_a_rank_and_unknown_is_below_them_all() -> None:
    assert set(ASSURANCE_RANKS) == set(Assurance)
    assert {a.value for a in Assurance} >= {
        "oidc",
        "slack_signed",
        "feishu_signed",
        "teams_jwt",
        "email_link",
        "ntfy_link",
        "console_password",
        "cli_token",
        "cli_local",
    }
    assert all(below(None, level) for level in Assurance)
    assert below("not-a-level", Assurance.CLI_LOCAL)
    assert not below(Assurance.FEISHU_SIGNED, Assurance.SLACK_SIGNED)  # one rank: equally strong
    assert below(Assurance.CONSOLE_PASSWORD, Assurance.OIDC)
    assert below(Assurance.EMAIL_LINK, Assurance.CONSOLE_PASSWORD)


async def test_each_vote_records_how_its_voter_was_identified_and_every_view_shows_it(
    alice: Console, agent: Agent, console_server: Server, runtime: Runtime
) -> None:
    rid = await agent.ask("wire_money", arguments={"to": "x"})
    assert (await alice.decide(rid, "approve")).status_code == 303
    async with httpx.AsyncClient(base_url=console_server.url, headers=ADMIN) as admin:
        answer = await admin.post(
            f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "bob"}
        )
        assert answer.status_code == 200, answer.text
        shown = (await admin.get(f"/v1/admin/requests/{rid}")).json()
    assert await status_of(runtime, rid) == "approved"
    assert [(v.voter, v.assurance) for v in await _votes(runtime, rid)] == [
        ("alice", "console_password"),
        ("bob", "admin_token"),
    ]
    assert [v["assurance"] for v in shown["votes"]] == ["console_password", "admin_token"]
    agent_view = (await agent.client.get(f"/v1/requests/{rid}")).json()
    assert [v["assurance"] for v in agent_view["votes"]] == ["console_password", "admin_token"]

    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert "Identified by" in page
    assert '<span class="assurance">console_password</span>' in page
    assert '<span class="assurance">admin_token</span>' in page

    exported = list(csv.DictReader(io.StringIO((await alice.get("/ui/history/export.csv")).text)))
    (row,) = [r for r in exported if r["id"] == rid]
    assert row["votes"] == "Alice: approve (console_password); Bob: approve (admin_token)"
    lines = [json.loads(line) for line in (await alice.get("/ui/history/export.jsonl")).text.splitlines()]
    (line,) = [r for r in lines if r["id"] == rid]
    assert [v["assurance"] for v in line["votes"]] == ["console_password", "admin_token"]

    voted = [e for e in await events_of(runtime, rid) if e.action == Action.VOTE]
    assert [e.detail["assurance"] for e in voted] == ["console_password", "admin_token"]


async def test_a_gate_needing_oidc_refuses_a_password_or_admin_token_vote_and_says_why(
    alice: Console, agent: Agent, console_server: Server, runtime: Runtime
) -> None:
    rid = await agent.ask("strict_transfer", arguments={"to": "x"})
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert "oidc or stronger" in page  # the gate says what it takes

    refused = await alice.decide(rid, "approve")
    assert refused.status_code == 303
    flash = (await alice.get(refused.headers["location"])).text
    assert "This gate takes votes identified by oidc or stronger and yours was identified by" in flash
    assert "console_password" in flash
    async with httpx.AsyncClient(base_url=console_server.url, headers=ADMIN) as admin:
        answer = await admin.post(
            f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "bob"}
        )
        shown = (await admin.get(f"/v1/admin/requests/{rid}")).json()
    assert answer.status_code == 409
    assert answer.json()["detail"].startswith("This gate takes votes identified by oidc or stronger")
    assert "admin_token" in answer.json()["detail"]
    assert shown["gates"][0]["min_assurance"] == "oidc"
    assert await status_of(runtime, rid) == "pending"
    assert await _votes(runtime, rid) == []
    refusals = [e for e in await events_of(runtime, rid) if e.action == Action.VOTE_REFUSED]
    assert [e.detail["assurance"] for e in refusals] == ["console_password", "admin_token"]

    # A rejection is a vote too: refused alike.
    bob = await _as(alice, "bob")
    try:
        await bob.decide(rid, "reject", "no")
    finally:
        await bob.aclose()
    assert await status_of(runtime, rid) == "pending"


def test_an_unknown_min_assurance_is_a_config_error_naming_the_levels() -> None:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"][0]["min_assurance"] = "sso"
    with pytest.raises(ValueError, match="min_assurance") as caught:
        parse_config(body, source="bad.yaml")
    assert "oidc" in str(caught.value)
