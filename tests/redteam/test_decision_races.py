"""Races on one request's decision, through the real endpoints of a real server: operators
deciding through the operator API and approvers clicking the Slack card at once, the same
click delivered twice at once, the agent cancelling and the expiry sweep running meanwhile,
on SQLite and on PostgreSQL.

Whatever the interleaving, a request ends in one outcome, with one transition in the audit
log (which still verifies), a quorum of two is met only by two people, a rejection beats an
approval it races, a vote after the deadline approves nothing, nobody is answered a 5xx,
and the agent (its replay and its waiter) is answered the decision as recorded."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.audit import Actor, verify_chain
from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import AuditEvent, ConfirmationRequest, Vote, utcnow
from signoff.app.outbox import Dispatcher
from signoff.app.requests.states import expire_overdue
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.slack import ACTION_APPROVE
from tests.channels.conftest import _no_proxy, fake_slack  # noqa: F401  (fixtures)
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.slack_support import SECRET, button_payload, form_body, signed
from tests.conftest import Server
from tests.redteam.support import ADMIN, PRE, property_test, status

pytestmark = pytest.mark.postgres

TRANSITIONS = {"approved", "rejected", "expired", "cancelled"}
PEOPLE = {
    "alice": {"name": "Alice", "web": "alice", "slack": "W0ALICE"},
    "bob": {"name": "Bob", "web": "bob", "slack": "W0BOB"},
    "carol": {"name": "Carol", "web": "carol", "slack": "W0CAROL"},
}
SLACK_ID = {name: p["slack"] for name, p in PEOPLE.items()}


def world_config(fake: FakeSlack) -> dict[str, Any]:
    channel = {
        "type": "slack",
        "bot_token": BOT_TOKEN,
        "signing_secret": SECRET,
        "channel": CHANNEL,
        "base_url": fake.base_url,
    }

    def gate(name: str, tools: str, **extra: Any) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": "ops-slack",
            "approvers": ["alice", "bob", "carol"],
            "timeout": "30m",
            **extra,
        }

    return {
        "channels": {"ops-slack": channel},
        "people": PEOPLE,
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate("two-person", "wire_*", quorum=2),
                    gate("once", "pay_*"),
                    gate("sends", "send_*", editable=["amount"]),
                    gate("transfers", "transfer_*", grants=[{"scope": "agent", "for": "1h"}]),
                ]
            }
        },
    }


class World:
    def __init__(self, server: Server, dispatcher: Dispatcher, http: httpx.AsyncClient, key: str) -> None:
        self.server, self.dispatcher, self.http = server, dispatcher, http
        self.agent = {"Authorization": f"Bearer {key}"}

    @property
    def runtime(self) -> Runtime:
        return self.server.runtime

    async def ask(self, tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
        call = {
            "tool_name": tool,
            "arguments": arguments or {"to": "acme"},
            "idempotency_key": uuid.uuid4().hex,
        }
        answer = (await self.http.post(PRE, json=call, headers=self.agent)).json()
        assert answer["decision"] == "pending", answer
        await self.dispatcher.run_once(now=utcnow())  # the card in Slack: clicks count from there
        return str(answer["request_id"]), call

    async def api(self, rid: str, who: str, verdict: str = "approve", **body: Any) -> httpx.Response:
        if verdict == "reject":
            body.setdefault("reason", "no")
        return await self.http.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": verdict, "operator": who, **body},
            headers=ADMIN,
        )

    async def click(self, rid: str, who: str, *, action_ts: str | None = None) -> httpx.Response:
        payload = button_payload(ACTION_APPROVE, request_id=rid)
        payload["user"]["id"] = SLACK_ID[who]
        payload["actions"][0]["action_ts"] = action_ts or f"{time.time():.6f}"
        body = form_body(payload)
        return await self.http.post(
            "/callbacks/slack/ops-slack", content=body, headers=signed(body, timestamp=int(time.time()))
        )

    async def cancel(self, rid: str) -> httpx.Response:
        return await self.http.post(f"/v1/requests/{rid}/cancel", headers=self.agent)

    async def wait(self, rid: str) -> httpx.Response:
        return await self.http.get(f"/v1/requests/{rid}/wait", params={"timeout": 20}, headers=self.agent)

    async def transitions(self, rid: str) -> list[str]:
        async with self.runtime.sessions() as s:
            stmt = select(AuditEvent.action).where(col(AuditEvent.request_id) == rid)
            return [str(a) for a in (await s.exec(stmt)).all() if str(a) in TRANSITIONS]

    async def votes(self, rid: str) -> list[Vote]:
        async with self.runtime.sessions() as s:
            return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())

    async def audit_ok(self) -> None:
        async with self.runtime.sessions() as s:
            _, broken = await verify_chain(s)
        assert broken is None, broken


@pytest.fixture
async def world(fake_slack: FakeSlack, settings: Settings) -> AsyncIterator[World]:  # noqa: F811
    runtime = Runtime.create(settings, parse_config(world_config(fake_slack)))
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            async with transaction(runtime.sessions) as session:
                _, key = await create_key(session, "finance-bot", actor=Actor("test"))
            yield World(server, dispatcher, http, key)
    finally:
        await runtime.aclose()


async def due_in(runtime: Runtime, rid: str, delta: timedelta) -> None:
    """Move the request's deadline to ``delta`` from now (its creation 30 minutes before)."""
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    due = utcnow() + delta
    async with transaction(runtime.sessions) as session:
        await session.exec(
            sa.update(table)
            .where(table.c.id == rid)
            .values(expires_at=due, created_at=due - timedelta(minutes=30))
        )


def no_5xx(*answers: httpx.Response) -> None:
    bad = [(a.request.url.path, a.status_code, a.text) for a in answers if a.status_code >= 500]
    assert not bad, bad


async def test_one_person_on_every_surface_at_once_is_one_vote_of_two(world: World) -> None:
    """Alice through the operator API twice and her Slack button twice, all at once."""
    rid, call = await world.ask("wire_money")
    answers = await asyncio.gather(
        world.api(rid, "alice"),
        world.click(rid, "alice"),
        world.api(rid, "Alice "),
        world.click(rid, "alice"),
    )
    no_5xx(*answers)
    assert await status(world.runtime, rid) == "pending"
    people = {v.voter for v in await world.votes(rid) if v.verdict == "approve"}
    assert people == {"alice"}
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == "pending", replay
    await world.audit_ok()


async def test_two_people_at_once_approve_once(world: World) -> None:
    rid, call = await world.ask("wire_money")
    waiter = asyncio.create_task(world.wait(rid))
    await asyncio.sleep(0.2)
    answers = await asyncio.gather(
        world.api(rid, "alice"), world.click(rid, "bob"), world.click(rid, "alice")
    )
    no_5xx(*answers)
    assert await status(world.runtime, rid) == "approved"
    assert await world.transitions(rid) == ["approved"]
    waited = (await waiter).json()
    assert waited["status"] == "approved", waited
    assert {v.voter for v in await world.votes(rid)} == {"alice", "bob"}
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == "allow", replay
    await world.audit_ok()


async def test_a_rejection_racing_the_approvals_of_a_quorum_wins_or_comes_too_late(world: World) -> None:
    """Alice and Bob approve while Carol rejects: the request is rejected unless both approvals
    committed before the rejection, and the agent is answered what was recorded."""
    rid, call = await world.ask("wire_money")
    waiter = asyncio.create_task(world.wait(rid))
    await asyncio.sleep(0.2)
    answers = await asyncio.gather(
        world.click(rid, "alice"), world.api(rid, "carol", "reject"), world.api(rid, "bob")
    )
    no_5xx(*answers)
    final = await status(world.runtime, rid)
    assert await world.transitions(rid) == [final]
    votes = await world.votes(rid)
    if final == "approved":
        assert {v.voter for v in votes if v.verdict == "approve"} == {"alice", "bob"}
        assert not [v for v in votes if v.verdict == "reject"]
    else:
        assert final == "rejected"
    assert (await waiter).json()["status"] == final
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == ("allow" if final == "approved" else "deny"), replay
    await world.audit_ok()


async def test_an_operator_and_a_click_at_once_make_one_decision(world: World) -> None:
    rid, call = await world.ask("pay_vendor")
    waiter = asyncio.create_task(world.wait(rid))
    await asyncio.sleep(0.2)
    api, click = await asyncio.gather(world.api(rid, "alice", "reject"), world.click(rid, "bob"))
    no_5xx(api, click)
    final = await status(world.runtime, rid)
    assert await world.transitions(rid) == [final]
    assert final in {"approved", "rejected"}
    waited = (await waiter).json()
    assert waited["status"] == final
    who = "alice" if final == "rejected" else "bob"
    assert waited["decided_by"]["name"] == who.capitalize(), waited
    if final == "approved":
        assert api.status_code == 409, api.text
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == ("allow" if final == "approved" else "deny"), replay
    await world.audit_ok()


async def test_the_same_click_delivered_twice_at_once_is_one_vote(world: World) -> None:
    rid, _ = await world.ask("wire_money")
    ts = f"{time.time():.6f}"
    answers = await asyncio.gather(*(world.click(rid, "alice", action_ts=ts) for _ in range(4)))
    no_5xx(*answers)
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert await status(world.runtime, rid) == "pending"
    assert len(await world.votes(rid)) == 1
    await world.audit_ok()


async def test_approvals_racing_a_cancel_and_the_sweep_make_one_outcome(world: World) -> None:
    rid, call = await world.ask("pay_vendor")
    await due_in(world.runtime, rid, timedelta(milliseconds=20))

    async def sweep() -> list[str]:
        async with transaction(world.runtime.sessions) as s:
            return await expire_overdue(s)

    answers = await asyncio.gather(
        world.click(rid, "alice"), world.cancel(rid), world.api(rid, "bob"), sweep(), world.api(rid, "carol")
    )
    no_5xx(*(a for a in answers if isinstance(a, httpx.Response)))
    final = await status(world.runtime, rid)
    assert await world.transitions(rid) == [final]
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == ("allow" if final == "approved" else "deny"), replay
    await world.audit_ok()


async def test_a_vote_after_the_deadline_before_the_sweep_approves_nothing(world: World) -> None:
    rid, call = await world.ask("pay_vendor")
    await due_in(world.runtime, rid, -timedelta(seconds=1))
    answers = await asyncio.gather(world.click(rid, "alice"), world.api(rid, "bob"), world.api(rid, "carol"))
    no_5xx(*answers)
    assert await status(world.runtime, rid) == "expired"
    assert await world.transitions(rid) == ["expired"]
    assert answers[1].status_code == 410, answers[1].text
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == "deny", replay
    await world.audit_ok()


async def test_an_edit_racing_a_plain_approval_runs_only_what_was_decided(world: World) -> None:
    """Alice approves with the amount changed while Bob approves as asked: whichever is
    recorded, the agent (waiting, and replaying) runs that call, never the other."""
    rid, call = await world.ask("send_money", to="acme", amount=900)
    waiter = asyncio.create_task(world.wait(rid))
    await asyncio.sleep(0.2)
    edit, plain = await asyncio.gather(
        world.api(rid, "alice", arguments={"amount": 5}), world.click(rid, "bob")
    )
    no_5xx(edit, plain)
    assert await status(world.runtime, rid) == "approved"
    assert await world.transitions(rid) == ["approved"]
    waited = (await waiter).json()
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == "allow"
    if edit.status_code == 200:
        assert waited["approved_arguments"] == {"to": "acme", "amount": 5}, waited
        assert replay["modified_arguments"] == {"to": "acme", "amount": 5}, replay
    else:
        assert waited.get("approved_arguments") in (None, {"to": "acme", "amount": 900}), waited
        assert replay.get("modified_arguments") is None, replay
    await world.audit_ok()


ACTIONS = st.lists(
    st.sampled_from(
        [
            ("api", "alice", "approve"),
            ("api", "bob", "approve"),
            ("api", "carol", "reject"),
            ("api", "Alice", "approve"),
            ("click", "alice", "approve"),
            ("click", "bob", "approve"),
            ("click", "carol", "approve"),
            ("cancel", "", ""),
        ]
    ),
    min_size=2,
    max_size=5,
)


@property_test(6)
@given(actions=ACTIONS)
async def test_any_mix_of_deciders_at_once_ends_in_one_outcome(
    world: World, actions: list[tuple[str, str, str]]
) -> None:
    rid, call = await world.ask("wire_money")

    async def run(kind: str, who: str, verdict: str) -> httpx.Response:
        if kind == "api":
            return await world.api(rid, who, verdict)
        if kind == "click":
            return await world.click(rid, who)
        return await world.cancel(rid)

    answers = await asyncio.gather(*(run(*a) for a in actions))
    no_5xx(*answers)
    final = await status(world.runtime, rid)
    moved = await world.transitions(rid)
    assert moved == ([] if final == "pending" else [final])
    votes = await world.votes(rid)
    approvers = Counter(v.voter for v in votes if v.verdict == "approve")
    assert all(n == 1 for n in approvers.values()), approvers
    if final == "approved":
        assert len(approvers) >= 2
    replay = (await world.http.post(PRE, json=call, headers=world.agent)).json()
    assert replay["decision"] == {"approved": "allow", "pending": "pending"}.get(final, "deny"), replay
    await world.audit_ok()


EDITS = st.lists(
    st.sampled_from(
        [
            ("alice", None),
            ("bob", None),
            ("alice", 5),
            ("bob", 7),
            ("carol", 11),
            ("carol", "reject"),
            ("replay", None),
            ("replay", None),
        ]
    ),
    min_size=3,
    max_size=7,
)


@property_test(6)
@given(moves=EDITS)
async def test_replays_racing_edits_and_approvals_run_only_the_call_as_decided(
    world: World, moves: list[tuple[str, Any]]
) -> None:
    """Approvals with and without changes, a rejection and the agent's replays, all at once:
    every allow the agent was given runs the call exactly as finally approved."""
    rid, call = await world.ask("send_money", to="acme", amount=900)

    async def move(who: str, what: Any) -> httpx.Response:
        if who == "replay":
            return await world.http.post(PRE, json=call, headers=world.agent)
        if what == "reject":
            return await world.api(rid, who, "reject")
        if what is None:
            return await world.click(rid, who)
        return await world.api(rid, who, arguments={"amount": what})

    answers = await asyncio.gather(*(move(*m) for m in moves))
    no_5xx(*answers)
    answers.append(await world.http.post(PRE, json=call, headers=world.agent))
    final = await status(world.runtime, rid)
    assert await world.transitions(rid) == ([] if final == "pending" else [final])
    shown = (await world.http.get(f"/v1/requests/{rid}", headers=world.agent)).json()
    approved = {**call["arguments"], **{c["field"]: c["approved"] for c in shown.get("changes") or []}}
    for (who, _), answer in zip([*moves, ("replay", None)], answers, strict=True):
        if who != "replay":
            continue
        got = answer.json()
        if got["decision"] == "allow":
            assert final == "approved"
            assert (got.get("modified_arguments") or call["arguments"]) == approved, (got, shown)
    await world.audit_ok()


async def test_calls_racing_the_revocation_of_their_grant_are_each_counted_or_asked(world: World) -> None:
    """Calls the grant covers race its revocation: each allow counted one use (audited), and
    once the revocation has answered no call is allowed by it."""
    rid, _ = await world.ask("transfer_funds")
    approved = await world.api(rid, "alice", grant={"scope": "agent", "for": "1h"})
    assert approved.status_code == 200, approved.text
    gid = approved.json()["grant"]["id"]

    def call(n: int) -> dict[str, Any]:
        return {"tool_name": "transfer_funds", "arguments": {"n": n}, "idempotency_key": uuid.uuid4().hex}

    async def revoke() -> httpx.Response:
        await asyncio.sleep(0.01)
        return await world.http.delete(f"/v1/admin/grants/{gid}", headers=ADMIN)

    answers = await asyncio.gather(
        *(world.http.post(PRE, json=call(n), headers=world.agent) for n in range(6)), revoke(), revoke()
    )
    no_5xx(*answers)
    assert sorted(a.status_code for a in answers[-2:]) == [200, 409], [a.text for a in answers[-2:]]
    allowed = [a.json() for a in answers[:-2] if a.json()["decision"] == "allow"]
    assert all(a["grant_id"] == gid for a in allowed), allowed
    async with world.runtime.sessions() as s:
        used = [
            e
            for e in (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "grant_used"))).all()
            if (e.detail or {}).get("grant") == gid
        ]
    assert len(used) == len(allowed), (len(used), len(allowed))
    after = (await world.http.post(PRE, json=call(99), headers=world.agent)).json()
    assert after["decision"] == "pending", after
    await world.audit_ok()
