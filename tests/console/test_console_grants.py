"""The console and grants: a grant chosen in the decision form, the grants list, revoking one."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from markupsafe import escape
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import AuditEvent, Grant
from signoff.app.runtime import Runtime
from tests.conftest import DEFAULT_CONFIG
from tests.console.conftest import Agent, Console, csrf_of

SESSION = {"scope": "session", "seconds": 3600, "same": ["to"]}
AGENT = {"scope": "agent", "seconds": 1800, "same": []}


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "transfers",
            "tools": ["transfer_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "grants": [{"scope": "session", "for": "1h", "same": ["to"]}, {"scope": "agent", "for": "30m"}],
        }
    )
    body["operators"] = {
        "alice": {"password_hash": password_hashes["alice"], "person": "alice"},
        "mallory": {"password_hash": password_hashes["mallory"]},
    }
    return parse_config(body, source="console-grants.yaml")


def radio(choice: dict[str, Any]) -> str:
    return str(escape(json.dumps(choice, separators=(",", ":"), ensure_ascii=False)))


async def approve(console: Console, rid: str, grant: str) -> str:
    token = await console.form_token(f"/ui/requests/{rid}")
    r = await console.client.post(
        f"/ui/requests/{rid}/decision", data={"csrf_token": token, "verdict": "approve", "grant": grant}
    )
    assert r.status_code == 303, r.text
    page = await console.get(f"/ui/requests/{rid}")
    return page.text


async def grant_rows(runtime: Runtime) -> list[Grant]:
    async with runtime.reads() as s:
        return list((await s.exec(select(Grant))).all())


async def test_the_decision_form_offers_the_gates_grants_and_gives_the_chosen_one(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    rid = await agent.ask("transfer_funds", arguments={"to": "acme"}, session_id="s-1")
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert 'name="grant" value="" checked' in page
    assert f'value="{radio(SESSION)}"' in page
    assert f'value="{radio(AGENT)}"' in page
    assert "while the argument &#34;to&#34; stays the same" in page

    shown = await approve(alice, rid, json.dumps(SESSION))
    assert "Approved for this session until" in shown
    given = (
        r"With a grant for this session until <time [^>]+>[^<]+</time>,"
        r" while the argument &#34;to&#34; stays the same:"
    )
    assert re.search(given, shown)
    [grant] = await grant_rows(runtime)
    assert (grant.scope, grant.session_id, grant.granted_by) == ("session", "s-1", "Alice")
    later = await agent.client.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": "transfer_funds", "arguments": {"to": "acme", "n": 2}, "session_id": "s-1"},
    )
    assert later.json()["grant_id"] == grant.id
    assert later.json()["reason"].endswith(', while the argument "to" stays the same)')


async def test_a_call_without_a_session_is_offered_the_agent_grant_only(alice: Console, agent: Agent) -> None:
    rid = await agent.ask("transfer_funds", arguments={"to": "acme"})
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert f'value="{radio(AGENT)}"' in page
    assert f'value="{radio(SESSION)}"' not in page


@pytest.mark.parametrize(
    ("grant", "why"),
    [
        (json.dumps({"scope": "agent", "seconds": 86400, "same": []}), "does not offer that grant"),
        (json.dumps(SESSION), "names no session"),  # no session to hold it
        ("{not json", "not one this request offers"),
        (json.dumps(["agent", 1800]), "not one this request offers"),
    ],
)
async def test_a_grant_the_form_did_not_offer_is_refused_and_nothing_changes(
    alice: Console, agent: Agent, runtime: Runtime, grant: str, why: str
) -> None:
    rid = await agent.ask("transfer_funds", arguments={"to": "acme"})
    shown = await approve(alice, rid, grant)
    assert 'class="flash error"' in shown
    assert why in shown
    assert await agent.status(rid) == "pending"
    assert await grant_rows(runtime) == []


async def test_a_grant_from_a_gate_that_offers_none_is_refused(alice: Console, agent: Agent) -> None:
    rid = await agent.ask()
    page = (await alice.get(f"/ui/requests/{rid}")).text
    assert 'name="grant"' not in page
    shown = await approve(alice, rid, json.dumps(AGENT))
    assert "offers no grants" in shown
    assert await agent.status(rid) == "pending"


async def test_the_grants_page_lists_who_can_act_and_revokes_with_csrf(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    rid = await agent.ask("transfer_funds", arguments={"to": "acme"})
    await approve(alice, rid, json.dumps(AGENT))
    [grant] = await grant_rows(runtime)
    page = (await alice.get("/ui/grants")).text
    assert f'data-grant-id="{grant.id}"' in page
    assert "transfer_funds" in page
    assert "Alice" in page
    assert f'action="/ui/grants/{grant.id}/revoke"' in page

    forged = await alice.client.post(f"/ui/grants/{grant.id}/revoke", data={"csrf_token": "forged"})
    assert forged.status_code in (400, 403)
    assert (await grant_rows(runtime))[0].revoked_at is None

    token = csrf_of(page)
    done = await alice.client.post(f"/ui/grants/{grant.id}/revoke", data={"csrf_token": token})
    assert done.status_code == 303
    after = (await alice.get("/ui/grants")).text
    assert "is revoked" in after
    assert f'data-grant-id="{grant.id}"' not in after, "the active list no longer shows it"
    assert f'data-grant-id="{grant.id}"' in (await alice.get("/ui/grants?all=1")).text
    [row] = await grant_rows(runtime)
    assert row.revoked_by == "Alice"
    answer = await agent.client.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": "transfer_funds", "arguments": {"to": "acme"}}
    )
    assert answer.json()["decision"] == "pending"
    async with runtime.reads() as s:
        revoked = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "grant_revoked"))).one()
    assert (revoked.actor_channel, revoked.actor_id) == ("web", "alice")

    again = await alice.client.post(f"/ui/grants/{grant.id}/revoke", data={"csrf_token": token})
    assert again.status_code == 303
    assert "already revoked" in (await alice.get("/ui/grants")).text


async def test_the_grants_page_needs_a_sign_in(console: Console) -> None:
    r = await console.get("/ui/grants")
    assert r.status_code in (302, 303)
    assert "/ui/login" in r.headers["location"]
