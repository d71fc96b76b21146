"""Teams end to end: the real server, its outbox posting Adaptive Cards to a fake Bot Connector,
invokes signed as the Bot Framework signs them through ``POST /callbacks/teams/{channel}``,
reminders from the dispatcher."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, Delivery, Vote
from signoff.app.outbox import Dispatcher
from signoff.app.requests.eligibility import NOT_HERE, OWN_CALL
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.app.factories import make_request
from tests.channels.teams_fake import CONVERSATION, FakeBotFramework, Scripted
from tests.conftest import DEFAULT_CONFIG, Server
from tests.waiting import eventually

CHANNEL = "ops-teams"
ALICE = "0a11ce00-0000-4000-8000-000000000001"
BOB = "0b0b0000-0000-4000-8000-000000000002"
CAROL = "0ca10100-0000-4000-8000-000000000003"
MALLORY = "0ba0ba00-0000-4000-8000-00000000000f"


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    fake = FakeBotFramework()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


def teams_config(fake: FakeBotFramework) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["channels"][CHANNEL] = fake.config(app_password="${TEAMS_APP_PASSWORD}")
    for person, aad in (("alice", ALICE), ("bob", BOB), ("carol", CAROL)):
        raw["people"][person]["teams"] = aad
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = CHANNEL
    return raw


@pytest.fixture
async def teams_server(
    fake: FakeBotFramework, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    from tests.channels.teams_fake import PASSWORD

    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    runtime = Runtime.create(settings, parse_config(teams_config(fake)))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


def executes(card: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for action in card.get("actions", []):
        if action["type"] == "Action.Execute":
            found.append(action)
        if action["type"] == "Action.ShowCard":
            found += executes(action["card"])
    return found


async def ask(http: httpx.AsyncClient, agent_key: str, tool: str = "pay_invoice", **arguments: Any) -> str:
    answer = await http.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": tool, "arguments": arguments or {"amount": 80000}},
        headers={"Authorization": f"Bearer {agent_key}"},
    )
    assert answer.json()["decision"] == "pending"
    return str(answer.json()["request_id"])


async def posted(fake: FakeBotFramework, count: int = 1) -> list[str]:
    """The activity ids of the cards posted to the conversation, once ``count`` are there."""
    await eventually(lambda: len(fake.messages) >= count or None)
    return [activity for (_, activity) in fake.messages]


async def votes_and_audit(server: Server, rid: str) -> tuple[list[Vote], list[AuditEvent]]:
    async with server.runtime.sessions() as s:
        votes = list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())
        events = list((await s.exec(select(AuditEvent).where(col(AuditEvent.request_id) == rid))).all())
    return votes, events


async def test_card_out_verified_click_in_agent_released_card_updated_audit_names_teams(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    card = fake.card(card_id)
    assert {a["verb"] for a in executes(card)} == {"approve", "reject"}
    assert all(a["data"]["request_id"] == rid for a in executes(card))
    [post] = fake.calls_to("POST", "/activities")
    assert post.token in fake.tokens

    waiter = asyncio.create_task(
        http.get(
            f"/v1/requests/{rid}/wait",
            params={"timeout": 30},
            headers={"Authorization": f"Bearer {agent_key}"},
        )
    )
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, name="Alice Liu", reply_to=card_id))
    answer = await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)
    assert answer.status_code == 200
    assert answer.json()["type"] == "application/vnd.microsoft.card.adaptive"
    assert executes(answer.json()["value"]) == []  # the clicker sees the outcome at once

    done = (await asyncio.wait_for(waiter, 10)).json()
    assert done["status"] == "approved"
    assert done["decided_by"] == {"channel": CHANNEL, "user_id": ALICE, "name": "Alice"}

    # Every copy is redrawn by the outbox through the connector: no actions left.
    await eventually(lambda: fake.calls_to("PUT", card_id) or None)
    assert executes(fake.card(card_id)) == []
    assert "Approved once by Alice" in json.dumps(fake.card(card_id))

    votes, events = await votes_and_audit(server, rid)
    [vote] = votes
    assert (vote.channel, vote.user_id, vote.voter) == (CHANNEL, ALICE, "alice")
    assert vote.assurance == "teams_jwt"  # a Bot Framework JWT checked against the keys
    assert vote.identity["tenant_id"] == fake.config()["tenant_id"]
    assert vote.identity["message_id"] == card_id
    [voted] = [e for e in events if e.action == "vote"]
    assert (voted.actor_channel, voted.actor_id, voted.actor_name) == (CHANNEL, ALICE, "Alice")
    assert len(fake.calls_to("POST", "oauth2")) == 1  # one cached token


async def test_refused_invokes_change_nothing(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    url = f"/callbacks/teams/{CHANNEL}"

    # Not an approver: the card as it stands, saying why, and no vote.
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=MALLORY, name="Mallory", reply_to=card_id))
    refused = await http.post(url, content=body, headers=headers)
    assert refused.status_code == 200
    assert "not an approver" in json.dumps(refused.json()["value"])
    assert executes(refused.json()["value"])  # still pending for everyone else

    # A card in another conversation is not this request's card.
    elsewhere = fake.activity(rid, "approve", aad=ALICE, conversation="19:other@thread.tacv2", reply_to="1")
    answer = await http.post(url, content=fake.invoke(elsewhere)[0], headers=fake.invoke(elsewhere)[1])
    assert NOT_HERE in json.dumps(answer.json()["value"])

    # Forged and mismatched tokens: 401 before anything is read.
    now_claims = fake.claims()
    forged = [
        fake.sign({**now_claims, "aud": "00000000-0000-0000-0000-000000000000"}),
        fake.sign({**now_claims, "exp": now_claims["nbf"] - 100}),
        fake.sign({**now_claims, "iss": "https://attacker.example"}),
        fake.sign({**now_claims, "serviceurl": "https://smba.trafficmanager.net/emea/"}),
        fake.sign(now_claims, kid="unknown", key=fake.keys[fake.kid]),
    ]
    for token in forged:
        body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id), token=token)
        assert (await http.post(url, content=body, headers=headers)).status_code == 401
    assert (
        await http.post(url, content=b"{}", headers={"content-type": "application/json"})
    ).status_code == 401
    assert (await http.post("/callbacks/teams/nope", content=b"{}")).status_code == 404

    votes, events = await votes_and_audit(server, rid)
    assert votes == []
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    async with server.runtime.sessions() as s:
        rejected = (
            await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "callback_rejected"))
        ).all()
    assert rejected  # refused callbacks are sampled into the audit
    refusals = [e for e in events if e.action == "vote_refused"]
    assert {e.actor_id for e in refusals} == {MALLORY, ALICE}


async def test_a_replayed_invoke_and_a_late_conflicting_one_answer_the_decision_as_it_stands(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    url = f"/callbacks/teams/{CHANNEL}"
    request = fake.invoke(
        fake.activity(rid, "reject", aad=BOB, data={"reason": "not this vendor"}, reply_to=card_id)
    )
    first = await http.post(url, content=request[0], headers=request[1])
    again = await http.post(url, content=request[0], headers=request[1])
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert "Reason: not this vendor" in json.dumps(again.json()["value"])

    late = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
    conflicting = await http.post(url, content=late[0], headers=late[1])
    assert conflicting.status_code == 200
    text = json.dumps(conflicting.json()["value"])
    assert "already rejected by Bob" in text
    assert executes(conflicting.json()["value"]) == []

    votes, _ = await votes_and_audit(server, rid)
    assert [(v.voter, v.verdict) for v in votes] == [("bob", "reject")]
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert (state["status"], state["reason"]) == ("rejected", "not this vendor")


async def test_quorum_counts_teams_votes_and_the_card_shows_progress(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = teams_server
    rid = await ask(http, agent_key, tool="wire_money", to="acme")
    [card_id] = await posted(fake)
    url = f"/callbacks/teams/{CHANNEL}"
    one = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
    answer = (await http.post(url, content=one[0], headers=one[1])).json()
    assert "Approvals: 1 of 2 (Alice)" in json.dumps(answer["value"])
    assert executes(answer["value"])
    two = fake.invoke(fake.activity(rid, "approve", aad=CAROL, reply_to=card_id))
    answer = (await http.post(url, content=two[0], headers=two[1])).json()
    assert executes(answer["value"]) == []
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "approved"


async def test_a_rate_limited_post_is_retried_after_retry_after(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    server, http = teams_server
    fake.fail_next("post", Scripted(429, {"Retry-After": "1"}))
    rid = await ask(http, agent_key)
    await eventually(lambda: len(fake.calls_to("POST", "/activities")) >= 1 or None)
    # The refused attempt is recorded once the outbox has its answer, after the fake saw it:
    # surely by the time the retry reached the fake.
    [card_id] = await posted(fake)
    async with server.runtime.sessions() as s:
        row = (await s.exec(select(Delivery).where(col(Delivery.request_id) == rid))).one()
    assert row.attempts >= 1
    assert executes(fake.card(card_id))


async def test_reminders_reply_in_the_cards_thread_mentioning_who_has_not_voted(
    fake: FakeBotFramework, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.channels.teams_fake import PASSWORD

    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    raw = teams_config(fake)
    raw["agents"]["finance-bot"]["hooks"][1]["remind"] = ["50%"]
    runtime = Runtime.create(settings, parse_config(raw))
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            async with transaction(runtime.sessions) as s:
                req = await make_request(s, runtime.config, tool="wire_money", arguments={"to": "acme"})
            t0 = req.created_at
            await dispatcher.run_once(now=t0)
            [card_id] = [a for (_, a) in fake.messages]
            body, headers = fake.invoke(fake.activity(req.id, "approve", aad=ALICE, reply_to=card_id))
            assert (
                await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)
            ).status_code == 200
            await dispatcher.run_once(now=t0 + timedelta(minutes=16))
            [(thread, reply)] = fake.replies
            assert thread == card_id
            mentioned = {e["mentioned"]["id"] for e in reply["entities"]}
            assert mentioned == {BOB, CAROL}  # alice has voted
            assert req.id in reply["text"]
            [call] = [c for c in fake.calls_to("POST", "/activities") if ";messageid=" in c.path]
            assert f"{CONVERSATION};messageid={card_id}" in call.path
    finally:
        await runtime.aclose()


async def test_self_approval_is_refused_by_directory_and_by_the_members_email(
    fake: FakeBotFramework, settings: Settings, monkeypatch: pytest.MonkeyPatch, admin_headers: dict[str, str]
) -> None:
    from signoff.app.audit import Actor
    from signoff.app.keys import create_key
    from tests.channels.teams_fake import PASSWORD

    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    raw = teams_config(fake)
    raw["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "open",
            "tools": ["open_*"],
            "channel": CHANNEL,
            "timeout": "30m",
        }
    )
    runtime = Runtime.create(settings, parse_config(raw))
    try:
        async with Server(runtime, background=True) as server, httpx.AsyncClient(base_url=server.url) as http:
            async with transaction(runtime.sessions) as s:
                _, key = await create_key(s, "finance-bot", actor=Actor("test"))
            agent = {"Authorization": f"Bearer {key}"}

            async def request(tool: str, user: str) -> str:
                answer = await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": tool, "arguments": {"amount": 90000}, "user_id": user},
                    headers=agent,
                )
                return str(answer.json()["request_id"])

            # Alice asked (by her directory key), Alice clicks: refused.
            mine = await request("pay_invoice", "alice")
            await eventually(lambda: len(fake.messages) >= 1 or None)
            body, headers = fake.invoke(fake.activity(mine, "approve", aad=ALICE))
            answer = (await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)).json()
            assert OWN_CALL in json.dumps(answer["value"])
            # Asked for dana@example.com (nobody in the directory); the clicker is not in it
            # either, so only Teams can say who they are: their email is Dana's.
            fake.members[MALLORY] = {
                "id": "29:1dana",
                "name": "Dana",
                "aadObjectId": MALLORY,
                "email": "dana@example.com",
            }
            hers = await request("open_door", "dana@example.com")
            await eventually(lambda: len(fake.messages) >= 2 or None)
            body, headers = fake.invoke(fake.activity(hers, "approve", aad=MALLORY, name="Dana"))
            answer = (await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)).json()
            assert OWN_CALL in json.dumps(answer["value"])
            assert fake.calls_to("GET", f"/members/{MALLORY}")
            for rid in (mine, hers):
                state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
                assert state["status"] == "pending"
                assert state["votes"] == []
    finally:
        await runtime.aclose()


async def test_several_gates_each_decide_on_their_own_card_and_every_copy_is_redrawn(
    fake: FakeBotFramework, settings: Settings, monkeypatch: pytest.MonkeyPatch, admin_headers: dict[str, str]
) -> None:
    from signoff.app.audit import Actor
    from signoff.app.keys import create_key
    from signoff.channels.fake import FakeChannel
    from tests.channels.teams_fake import PASSWORD

    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    raw = teams_config(fake)
    raw["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "treasury",
            "tools": ["pay_*"],
            "channel": "chat",
            "approvers": ["carol"],
            "timeout": "30m",
        }
    )
    chat = FakeChannel("chat")
    runtime = Runtime.create(settings, parse_config(raw), channels={"chat": chat})
    try:
        async with Server(runtime, background=True) as server, httpx.AsyncClient(base_url=server.url) as http:
            async with transaction(runtime.sessions) as s:
                _, key = await create_key(s, "finance-bot", actor=Actor("test"))
            rid = await ask(http, key)
            [card_id] = await posted(fake)
            assert "Reviews (every one must approve)" in json.dumps(fake.card(card_id))
            # Carol is not an approver of the Teams card's gate: her click there does not count.
            body, headers = fake.invoke(fake.activity(rid, "approve", aad=CAROL, reply_to=card_id))
            answer = (await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)).json()
            assert executes(answer["value"])
            body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
            answer = (await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)).json()
            assert "payments: 1 of 1 (Alice) ✓" in json.dumps(answer["value"], ensure_ascii=False)
            state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})).json()
            assert state["status"] == "pending"  # treasury has not approved
            decided = await http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "carol"},
                headers=admin_headers,
            )
            assert decided.status_code == 200, decided.text
            await eventually(
                lambda: (fake.calls_to("PUT", card_id) and not executes(fake.card(card_id))) or None
            )
            await eventually(lambda: [c for c in chat.cards_for(rid) if c.status == "approved"] or None)
    finally:
        await runtime.aclose()


async def test_an_escalation_posts_the_card_in_another_conversation_where_it_decides(
    fake: FakeBotFramework, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from signoff.app.models import utcnow
    from tests.channels.teams_fake import PASSWORD

    pager = "19:pager0000000000000000@thread.tacv2"
    fake.conversations.add(pager)
    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    raw = teams_config(fake)
    raw["channels"]["pager-teams"] = fake.config(app_password="${TEAMS_APP_PASSWORD}", conversation_id=pager)
    raw["agents"]["finance-bot"]["hooks"][0]["approvers"] = ["alice"]
    raw["agents"]["finance-bot"]["hooks"][0]["escalate"] = [
        {"after": "10m", "channel": "pager-teams", "approvers": ["carol"]}
    ]
    runtime = Runtime.create(settings, parse_config(raw))
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            async with transaction(runtime.sessions) as s:
                req = await make_request(
                    s,
                    runtime.config,
                    tool="pay_x",
                    arguments={"amount": 90000},
                    now=utcnow() - timedelta(minutes=11),
                )
            await dispatcher.run_once(now=utcnow())
            cards = dict(fake.messages.keys())
            assert set(cards) == {CONVERSATION, pager}
            # Carol decides on the escalated card, in its own conversation.
            body, headers = fake.invoke(
                fake.activity(req.id, "approve", aad=CAROL, conversation=pager, reply_to=cards[pager])
            )
            answer = (await http.post("/callbacks/teams/pager-teams", content=body, headers=headers)).json()
            assert executes(answer["value"]) == []
            await dispatcher.run_once(now=utcnow())
            for conversation, activity in cards.items():
                assert executes(fake.card(activity, conversation)) == [], conversation
    finally:
        await runtime.aclose()


async def test_a_click_on_an_expired_or_cancelled_request_answers_the_card_in_that_state(
    fake: FakeBotFramework, teams_server: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    _, http = teams_server
    agent = {"Authorization": f"Bearer {agent_key}"}
    url = f"/callbacks/teams/{CHANNEL}"
    expiring = await ask(http, agent_key, tool="quick_fix", n=1)  # the gate's timeout is 1 s
    cancelled = await ask(http, agent_key, tool="pay_invoice", amount=90000)
    assert (await http.post(f"/v1/requests/{cancelled}/cancel", headers=agent)).status_code == 200

    for _ in range(200):
        if (await http.get(f"/v1/requests/{expiring}", headers=agent)).json()["status"] == "expired":
            break
        await asyncio.sleep(0.05)
    for rid, state, words in (
        (expiring, "Expired", "already expired"),
        (cancelled, "Cancelled", "already cancelled"),
    ):
        body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE))
        answer = await http.post(url, content=body, headers=headers)
        assert answer.status_code == 200
        card = answer.json()["value"]
        assert card["body"][0]["text"] == state
        assert words in json.dumps(card)
        assert executes(card) == []
