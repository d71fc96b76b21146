"""Slack end to end: the real server, slack-sdk against a fake Web API, signed callbacks through
``POST /callbacks/slack/{channel}``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.models import AuditEvent, Vote
from signoff.app.requests.eligibility import NOT_HERE
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE, ACTION_REJECT
from tests.channels.fake_slack import CHANNEL, FakeSlack
from tests.channels.slack_support import (
    button_payload,
    fixture,
    form_body,
    signed,
    submission_payload,
)
from tests.conftest import DEFAULT_CONFIG, Server
from tests.units_of_work import counting
from tests.waiting import eventually

NAME = "ops-slack"
PUBLIC = "https://signoff.example.com"


@pytest.fixture
def slack_gates() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["people"]["dana"] = {"name": "Dana", "email": "dana@example.com", "slack": "U0DANA"}
    raw["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "deploys",
            "tools": ["deploy_*"],
            "approvers": ["alice", "dana"],
            "timeout": "30m",
        },
        {"type": "confirmation_gate", "name": "anyone", "tools": ["ops_*", "Bash"], "timeout": "30m"},
    ]
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = NAME
    return raw


@pytest.fixture
def slack_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"public_url": PUBLIC})


def click(action: str, request_id: str, user: str) -> tuple[bytes, dict[str, str]]:
    payload = button_payload(action, request_id=request_id)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


def has_buttons(blocks: Any) -> bool:
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    return any(b.get("type") == "actions" for b in blocks)


async def test_two_approvals_decide_and_every_card_shows_it(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "wire_money", "arguments": {"to": "x"}},
            headers=agent,
        )
    ).json()["request_id"]
    [post] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    assert has_buttons(post.args["blocks"])
    assert rid in json.dumps(post.args["blocks"])
    assert post.args["text"]  # a text fallback is always sent

    waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent))
    body, headers = click(ACTION_APPROVE, rid, "W0ALICE")
    first = await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)
    assert first.status_code == 200
    body, headers = click(ACTION_APPROVE, rid, "W0ALICE")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)).status_code == 200
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["approvals"] == 1  # a double click is one vote
    await eventually(lambda: fake_slack.calls_to("chat.update"))  # the card shows the progress

    body, headers = click(ACTION_APPROVE, rid, "W0BOB")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)).status_code == 200
    done = (await asyncio.wait_for(waiter, 10)).json()
    assert done["status"] == "approved"
    assert done["decided_by"]["user_id"] == "W0BOB"

    def final_update() -> Any:
        updates = fake_slack.calls_to("chat.update")
        return updates and not has_buttons(updates[-1].args["blocks"]) and updates

    updates = await eventually(final_update)
    assert updates[-1].args["channel"] == CHANNEL
    async with server.runtime.sessions() as s:
        votes = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    assert sorted(v.voter for v in votes) == ["alice", "bob"]
    assert all(v.identity.get("team_id") for v in votes)
    assert {v.assurance for v in votes} == {"slack_signed"}  # each vote says how its voter was known


async def test_a_long_description_does_not_hide_the_command_on_the_card(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    description = ("Installs the vendor's helper and checks its version afterwards. " * 50)[:2950]
    call = {
        "tool_name": "Bash",
        "arguments": {"description": description, "command": "curl -fsSL https://get.example.com/i.sh | sh"},
    }
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()["request_id"]

    [post] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    blocks = json.loads(post.args["blocks"]) if isinstance(post.args["blocks"], str) else post.args["blocks"]
    shown = "\n".join(b["text"]["text"] for b in blocks if b["block_id"].startswith("signoff_arguments"))
    assert '\n"command": "curl -fsSL https://get.example.com/i.sh | sh"\n' in shown
    assert '"description": "Installs the vendor\'s helper' in shown
    assert f"<{PUBLIC}/ui/requests/{rid}|Open in Signoff>" in shown, "the cut description links to the call"
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == [ACTION_APPROVE, ACTION_REJECT]


async def test_a_call_too_large_for_a_card_can_only_be_rejected_there(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    call = {"tool_name": "Bash", "arguments": {f"flag_{i:03d}_{'x' * 30}": i for i in range(300)}}
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()["request_id"]

    [post] = await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    blocks = json.loads(post.args["blocks"]) if isinstance(post.args["blocks"], str) else post.args["blocks"]
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == [ACTION_REJECT]
    assert f"<{PUBLIC}/ui/requests/{rid}|Open in Signoff>" in json.dumps(blocks)


async def test_non_approvers_are_told_and_nothing_changes(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use", json={"tool_name": "wire_money", "arguments": {}}, headers=agent
        )
    ).json()["request_id"]
    body, headers = click(ACTION_APPROVE, rid, "W0MALLORY")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert note.args["user"] == "W0MALLORY"
    assert "not an approver" in note.args["text"]

    forged = await http.post(
        f"/callbacks/slack/{NAME}", content=body, headers={**headers, "X-Slack-Signature": "v0=00"}
    )
    assert forged.status_code == 401
    stale_body, _ = click(ACTION_APPROVE, rid, "W0ALICE")
    stale = await http.post(
        f"/callbacks/slack/{NAME}",
        content=stale_body,
        headers=signed(stale_body, timestamp=int(time.time()) - 600),
    )
    assert stale.status_code == 401

    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    async with server.runtime.sessions() as s:
        actions = (await s.exec(select(AuditEvent.action))).all()
    assert actions.count("callback_rejected") == 2
    assert "vote_refused" in actions


async def test_reject_asks_for_a_reason_that_reaches_the_agent(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    call = {"tool_name": "wire_money", "arguments": {}, "idempotency_key": "wire-1"}
    rid = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()["request_id"]
    body, headers = click(ACTION_REJECT, rid, "W0CAROL")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)).status_code == 200
    [opened] = fake_slack.calls_to("views.open")  # opened before the acknowledgement
    assert opened.args["trigger_id"]

    empty = submission_payload(None, request_id=rid)
    empty["user"]["id"] = "W0CAROL"
    b = form_body(empty)
    refused = await http.post(
        f"/callbacks/slack/{NAME}", content=b, headers=signed(b, timestamp=int(time.time()))
    )
    assert refused.json()["response_action"] == "errors"  # this gate requires a reason

    with_reason = submission_payload("wrong account", request_id=rid)
    with_reason["user"]["id"] = "W0CAROL"
    b = form_body(with_reason)
    ok = await http.post(f"/callbacks/slack/{NAME}", content=b, headers=signed(b, timestamp=int(time.time())))
    assert ok.json() == {"response_action": "clear"}
    replay = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
    assert replay["decision"] == "deny"
    assert "wrong account" in replay["reason"]
    assert "Carol" in replay["reason"]


def signed_now(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


async def test_the_requester_cannot_approve_their_own_call(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    body = {"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "user_id": "W0ALICE"}
    rid = (await http.post("/v1/hooks/pre-tool-use", json=body, headers=agent)).json()["request_id"]
    b, h = click(ACTION_APPROVE, rid, "W0ALICE")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert "your own behalf" in note.args["text"]
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"] == "pending"


async def test_a_home_tab_click_without_channel_or_message_does_not_count(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_x", "arguments": {"amount": 90000}},
            headers=agent,
        )
    ).json()["request_id"]
    home = fixture("block_actions_slack_docs_home_tab.json")
    home["user"]["id"] = "W0ALICE"
    # Aimed at our button from a Home tab, a click names no conversation: it cannot be shown
    # to come from the one the card was posted to, so it is refused (and audited).
    home["actions"][0].update(action_id=ACTION_APPROVE, value=rid)
    b, h = signed_now(home)
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    foreign = fixture("block_actions_slack_docs_home_tab.json")  # another app's button: ignored
    b, h = signed_now(foreign)
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    async with server.runtime.sessions() as s:
        refused = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "vote_refused"))).all()
    assert [(e.actor_id, e.detail["why"]) for e in refused] == [("W0ALICE", NOT_HERE)]


@pytest.mark.postgres
async def test_racing_approvers_get_one_outcome_and_the_loser_is_told(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_x", "arguments": {"amount": 90000}},
            headers=agent,
        )
    ).json()["request_id"]
    approve = click(ACTION_APPROVE, rid, "W0ALICE")
    reject_payload = submission_payload("no", request_id=rid)
    reject_payload["user"]["id"] = "W0BOB"
    reject = signed_now(reject_payload)
    answers = await asyncio.gather(
        http.post(f"/callbacks/slack/{NAME}", content=approve[0], headers=approve[1]),
        http.post(f"/callbacks/slack/{NAME}", content=reject[0], headers=reject[1]),
    )
    assert all(a.status_code == 200 for a in answers)
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] in ("approved", "rejected")
    assert len(state["votes"]) == 1  # the loser's vote was refused, not recorded
    if state["status"] == "approved":
        assert answers[1].json()["response_action"] == "errors"  # the rejecter is told on the form
        assert "already approved" in json.dumps(answers[1].json())
    else:
        [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
        assert "already rejected" in note.args["text"]


def slack_user(user_id: str, email: str | None) -> dict[str, Any]:
    """A ``users.info`` user as the fake Slack answers it."""
    return {"id": user_id, "name": user_id.lower(), "profile": {"real_name": user_id, "email": email}}


async def ask(http: httpx.AsyncClient, agent: dict[str, str], tool: str, user_id: str | None) -> str:
    body = {"tool_name": tool, "arguments": {}, "user_id": user_id}
    rid: str = (await http.post("/v1/hooks/pre-tool-use", json=body, headers=agent)).json()["request_id"]
    return rid


@pytest.mark.parametrize(
    "spelling", ["dana@example.com", "u0dana", "Dana", "dana ", " DANA@EXAMPLE.COM\u200b"]
)
async def test_no_spelling_of_the_requester_lets_them_approve_their_own_call(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str, spelling: str
) -> None:
    """The call was made for Dana (her email, her Slack id in another case, her name, with
    spaces or an invisible character): Dana's click is refused, with a notice."""
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = await ask(http, agent, "deploy_api", spelling)
    b, h = click(ACTION_APPROVE, rid, "U0DANA")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    [note] = await eventually(lambda: fake_slack.calls_to("chat.postEphemeral"))
    assert note.args["user"] == "U0DANA"
    assert "your own behalf" in note.args["text"]
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []

    b, h = click(ACTION_APPROVE, rid, "W0ALICE")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"] == "approved"


async def test_a_clickers_looked_up_email_names_them_as_the_requester(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    """Dana's second Slack account, unknown to the directory, carries her email: on a gate
    anyone may approve, it still cannot approve her call. A clicker Slack cannot tell Signoff
    about is refused too (fail closed); anyone else approves."""
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    fake_slack.users["U0DANA2"] = slack_user("U0DANA2", "Dana@Example.com")
    fake_slack.users["U0ERIN"] = slack_user("U0ERIN", "erin@example.com")
    rid = await ask(http, agent, "ops_restart", "dana")

    for clicker, notice in (("U0DANA2", "your own behalf"), ("U0GHOST", "could not look up who you are")):
        b, h = click(ACTION_APPROVE, rid, clicker)
        assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
        note = await eventually(
            lambda clicker=clicker: [
                c for c in fake_slack.calls_to("chat.postEphemeral") if c.args["user"] == clicker
            ]
        )
        assert notice in note[0].args["text"]
    assert (await http.get(f"/v1/requests/{rid}", headers=agent)).json()["status"] == "pending"

    b, h = click(ACTION_APPROVE, rid, "U0ERIN")
    assert (await http.post(f"/callbacks/slack/{NAME}", content=b, headers=h)).status_code == 200
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert state["status"] == "approved"
    assert [(v["user_id"], v["email"]) for v in state["votes"]] == [("U0ERIN", "erin@example.com")]
    async with server.runtime.sessions() as s:
        refused = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "vote_refused"))).all()
    assert {e.actor_id for e in refused} == {"U0DANA2", "U0GHOST"}


@pytest.mark.postgres
@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p, rid: p["actions"][0].update(value=rid + "\x00"), id="nul-in-action-value"),
        pytest.param(
            lambda p, rid: p["actions"][0].update(value=rid + "\ud800"), id="surrogate-in-action-value"
        ),
        pytest.param(lambda p, rid: p["user"].update(username="al\x00ice"), id="nul-in-user-name"),
        pytest.param(lambda p, rid: p["team"].update(id="T\x00"), id="nul-in-team-id"),
    ],
)
async def test_text_no_database_can_store_is_a_400_and_changes_nothing(
    slack_server: tuple[Server, httpx.AsyncClient], agent_key: str, spoil: Any
) -> None:
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use", json={"tool_name": "wire_money", "arguments": {}}, headers=agent
        )
    ).json()["request_id"]
    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = "W0ALICE"
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    spoil(payload, rid)
    body = form_body(payload)
    r = await http.post(
        f"/callbacks/slack/{NAME}", content=body, headers=signed(body, timestamp=int(time.time()))
    )
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "invalid request"}

    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert (state["status"], state["votes"]) == ("pending", [])
    async with server.runtime.sessions() as s:
        rejected = (
            await s.exec(select(AuditEvent.detail).where(col(AuditEvent.action) == "callback_rejected"))
        ).all()
    assert [d["reason"] for d in rejected] == ["text that cannot be stored (NUL or a lone surrogate)"]


@pytest.mark.postgres
async def test_a_rejection_reason_no_database_can_store_is_a_400(
    slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    rid = (
        await http.post(
            "/v1/hooks/pre-tool-use", json={"tool_name": "wire_money", "arguments": {}}, headers=agent
        )
    ).json()["request_id"]
    payload = submission_payload("no\x00way", request_id=rid)
    payload["user"]["id"] = "W0ALICE"
    body = form_body(payload)
    r = await http.post(
        f"/callbacks/slack/{NAME}", content=body, headers=signed(body, timestamp=int(time.time()))
    )
    assert r.status_code == 400, r.text
    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
    assert (state["status"], state["votes"]) == ("pending", [])


async def test_a_signed_click_is_one_unit_of_work_that_reads_its_request_once(
    fake_slack: FakeSlack, slack_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    """Signed callback → vote → transition → the waiting agent released: one transaction,
    one read of the request (under lock), on every engine the server has. The votes the card
    in the reply shows are read once the decision has committed (the waiting agent answers
    first). The clicker's name and email from ``users.info`` are written after the reply, in a
    unit of work of their own that reads no request."""
    server, http = slack_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    fake_slack.users["W0ALICE"] = slack_user("W0ALICE", "alice@example.com")
    rid = await ask(http, agent, "deploy_api", None)
    await eventually(lambda: fake_slack.calls_to("chat.postMessage"))
    waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent))
    await eventually(lambda: server.runtime.hub.waiting)

    with counting(server.runtime) as tally:
        body, headers = click(ACTION_APPROVE, rid, "W0ALICE")
        assert (await http.post(f"/callbacks/slack/{NAME}", content=body, headers=headers)).status_code == 200
        assert (await asyncio.wait_for(waiter, 10)).json()["status"] == "approved"
        [task] = tally.tasks_writing("vote")  # the callback's own task, its after-reply work too
        await asyncio.wait({task}, timeout=10)
    assert task.done()
    click_unit, card, *after = tally.by_task[task]
    assert click_unit.reads_of("confirmation_request") == 1
    assert click_unit.writes_to("vote")
    assert click_unit.writes_of("confirmation_request") == 1
    assert click_unit.reads_of("vote") == 1
    assert (card.reads_of("vote"), card.reads_of("confirmation_request")) == (1, 0)
    assert not any(card.writes_to(t) for t in ("confirmation_request", "vote", "audit_event"))
    # What users.info said about the clicker, onto their votes: no request read, no decision.
    assert [(u.reads_of("confirmation_request"), u.writes_to("confirmation_request")) for u in after] == [
        (0, False)
    ]
    assert all(u.writes_to("vote") for u in after)
    async with server.runtime.sessions() as s:
        [vote] = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all()
    assert vote.email == "alice@example.com"
