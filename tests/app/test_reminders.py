"""Reminders, escalation and honest expiry on a fake clock: the dispatcher runs at the times the
test gives it (``run_once(now=...)``), votes are cast at given times."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, ConfirmationRequest, Delivery, OutboxStatus, Status
from signoff.app.outbox import Dispatcher
from signoff.app.requests.eligibility import (
    NOT_AN_APPROVER,
    EscalationStep,
    GateSnapshot,
    Voter,
    eligible_gates,
    is_not_yet,
)
from signoff.app.requests.states import decision_for, expire_overdue, get_request
from signoff.app.requests.votes import VoteResult, cast_vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request

PEOPLE = {
    "alice": {"name": "Alice", "web": "alice", "fake": "U_ALICE"},
    "bob": {"name": "Bob", "web": "bob", "fake": "U_BOB"},
    "carol": {"name": "Carol", "web": "carol", "fake": "U_CAROL"},
}
GATES: list[dict[str, Any]] = [
    {
        "type": "confirmation_gate",
        "name": "two-person",
        "tools": ["wire_*"],
        "channel": "chat",
        "approvers": ["alice", "bob"],
        "quorum": 2,
        "timeout": "30m",
        "remind": ["50%", "90%"],
    },
    {
        "type": "confirmation_gate",
        "name": "payments",
        "tools": ["pay_*"],
        "channel": "chat",
        "approvers": ["alice", "bob"],
        "timeout": "30m",
        "remind": ["25m"],
        "escalate": [{"after": "10m", "channel": "pager", "approvers": ["carol"]}],
    },
    {
        "type": "confirmation_gate",
        "name": "in place",
        "tools": ["deploy_*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "escalate": [{"after": "10m", "channel": "chat", "approvers": ["carol"]}],
    },
]
T = timedelta(minutes=1)


def make_config() -> SignoffConfig:
    raw = {
        "channels": {"chat": {"type": "fake"}, "pager": {"type": "fake"}},
        "people": PEOPLE,
        "agents": {"finance-bot": {"hooks": GATES}},
    }
    return parse_config(raw, source="test.yaml")


@pytest.fixture
async def world(settings: Settings) -> AsyncIterator[tuple[Runtime, FakeChannel, FakeChannel]]:
    chat, pager = FakeChannel("chat"), FakeChannel("pager")
    runtime = Runtime.create(settings, make_config(), channels={"chat": chat, "pager": pager})
    try:
        yield runtime, chat, pager
    finally:
        await runtime.aclose()


def dispatcher(runtime: Runtime) -> Dispatcher:
    return Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())


async def new_request(runtime: Runtime, tool: str) -> ConfirmationRequest:
    async with transaction(runtime.sessions) as s:
        return await make_request(s, runtime.config, tool=tool, arguments={"to": "acme"})


async def vote(
    runtime: Runtime,
    rid: str,
    who: str,
    at: datetime,
    *,
    channel: str = "chat",
    verdict: Verdict = Verdict.APPROVE,
) -> VoteResult:
    person = PEOPLE[who]
    voter = Voter(channel, str(person["fake"]), str(person["name"]), who)
    async with transaction(runtime.sessions) as s:
        result = await cast_vote(s, rid, voter=voter, verdict=verdict, config=runtime.config, now=at)
    assert result is not None
    return result


async def events(runtime: Runtime, rid: str, action: str) -> list[AuditEvent]:
    async with runtime.sessions() as s:
        rows = await s.exec(
            select(AuditEvent)
            .where(col(AuditEvent.request_id) == rid, col(AuditEvent.action) == action)
            .order_by(col(AuditEvent.seq))
        )
        return list(rows.all())


async def rows(runtime: Runtime, rid: str, kind: str) -> list[Delivery]:
    async with runtime.sessions() as s:
        found = await s.exec(
            select(Delivery)
            .where(col(Delivery.request_id) == rid, col(Delivery.kind) == kind)
            .order_by(col(Delivery.id))
        )
        return list(found.all())


@pytest.mark.postgres
async def test_reminders_go_once_each_at_their_points_to_whoever_has_not_voted(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, chat, _ = world
    req = await new_request(runtime, "wire_money")
    t0, d = req.created_at, dispatcher(runtime)
    await d.run_once(now=t0)
    assert len(chat.posts) == 1
    assert chat.reminders == []

    await vote(runtime, req.id, "alice", t0 + T)  # quorum 2: still pending
    await d.run_once(now=t0 + 14 * T)
    assert chat.reminders == []  # not before 50% of 30m

    await d.run_once(now=t0 + 15 * T)
    [(ref, card, waiting)] = chat.reminders
    assert ref == {"message_id": "fake-1", "request_id": req.id}
    assert card.request_id == req.id
    assert [p.name for p in waiting] == ["Bob"]  # Alice has voted
    assert [p.user_id for p in waiting] == ["U_BOB"]

    for minute in (16, 20, 26):
        await d.run_once(now=t0 + minute * T)
    assert len(chat.reminders) == 1  # once per point, however often the dispatcher runs

    await d.run_once(now=t0 + 27 * T)
    assert len(chat.reminders) == 2
    assert [p.name for p in chat.reminders[1][2]] == ["Bob"]
    await d.run_once(now=t0 + 29 * T)
    assert len(chat.reminders) == 2

    reminded = await events(runtime, req.id, "reminded")
    assert [e.detail["waiting_on"] for e in reminded] == [["Bob"], ["Bob"]]
    assert [e.detail["point"] for e in reminded] == [0, 1]
    assert {r.status for r in await rows(runtime, req.id, "remind")} == {OutboxStatus.SENT}


async def test_no_reminder_or_escalation_after_the_decision(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, chat, pager = world
    wire = await new_request(runtime, "wire_money")
    pay = await new_request(runtime, "pay_invoice")
    t0, d = wire.created_at, dispatcher(runtime)
    await d.run_once(now=t0)
    await vote(runtime, wire.id, "alice", t0 + T)
    await vote(runtime, wire.id, "bob", t0 + 2 * T)
    await vote(runtime, pay.id, "bob", t0 + 2 * T, verdict=Verdict.REJECT)
    for minute in (10, 15, 25, 27, 29):
        await d.run_once(now=t0 + minute * T + timedelta(seconds=5))
    assert chat.reminders == []
    assert pager.posts == []
    later = await rows(runtime, wire.id, "remind") + await rows(runtime, pay.id, "remind")
    later += await rows(runtime, pay.id, "escalate")
    assert len(later) == 4
    assert {r.status for r in later} == {OutboxStatus.SKIPPED}
    assert all("before the" in (r.last_error or "") for r in later)
    assert await events(runtime, wire.id, "reminded") == []
    assert await events(runtime, pay.id, "escalated") == []


async def test_escalation_posts_once_and_widens_the_approvers_only_from_its_time(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, chat, pager = world
    req = await new_request(runtime, "pay_invoice")
    t0, d = req.created_at, dispatcher(runtime)
    await d.run_once(now=t0)

    # Carol's escalation comes at 10m: before then her clicks are refused, saying from when.
    early = await vote(runtime, req.id, "carol", t0 + 5 * T)
    assert not early.accepted
    assert is_not_yet(early.message)
    assert (t0 + 10 * T).strftime("%H:%M:%S") in early.message
    early_there = await vote(runtime, req.id, "carol", t0 + 9 * T, channel="pager")
    assert not early_there.accepted
    assert is_not_yet(early_there.message)

    await d.run_once(now=t0 + 9 * T)
    assert pager.posts == []
    await d.run_once(now=t0 + 10 * T)
    [escalated] = pager.posts
    assert [p.name for p in escalated.approvers] == ["Alice", "Bob", "Carol"]
    for minute in (11, 12, 20):
        await d.run_once(now=t0 + minute * T)
    assert len(pager.posts) == 1

    [event] = await events(runtime, req.id, "escalated")
    assert event.detail["channel"] == "pager"
    assert event.detail["approvers"] == ["carol"]

    # From 10m on she decides, on the escalated card; every card is redrawn to the outcome.
    done = await vote(runtime, req.id, "carol", t0 + 12 * T, channel="pager")
    assert done.accepted
    assert done.decided
    await d.run_once(now=t0 + 12 * T)
    assert chat.cards_for(req.id)[-1].status == "approved"
    assert pager.cards_for(req.id)[-1].status == "approved"
    assert pager.updates[-1][0] == {"message_id": "fake-1", "request_id": req.id}
    await d.run_once(now=t0 + 26 * T)
    assert chat.reminders == []  # decided before the 25m reminder


async def test_a_stranger_on_the_escalated_card_is_still_refused(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, _, _ = world
    req = await new_request(runtime, "pay_invoice")
    voter = Voter("pager", "U_MALLORY", "Mallory")
    async with transaction(runtime.sessions) as s:
        result = await cast_vote(
            s,
            req.id,
            voter=voter,
            verdict=Verdict.APPROVE,
            config=runtime.config,
            now=req.created_at + 12 * T,
        )
    assert result is not None
    assert not result.accepted
    assert result.message == NOT_AN_APPROVER


async def test_an_escalation_into_the_channel_of_the_card_replies_under_it(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, chat, _ = world
    req = await new_request(runtime, "deploy_api")
    t0, d = req.created_at, dispatcher(runtime)
    await d.run_once(now=t0)
    await d.run_once(now=t0 + 10 * T)
    assert len(chat.posts) == 1  # no second card in the same channel
    [(ref, _, named)] = chat.reminders
    assert ref == {"message_id": "fake-1", "request_id": req.id}
    assert [p.name for p in named] == ["Carol"]
    [event] = await events(runtime, req.id, "escalated")
    assert event.detail["card"] == "replied under the card already there"
    assert (await vote(runtime, req.id, "carol", t0 + 11 * T)).decided


@pytest.mark.postgres
async def test_expiry_says_nobody_decided_and_whom_it_asked(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, chat, pager = world
    req = await new_request(runtime, "pay_invoice")
    t0, d = req.created_at, dispatcher(runtime)
    await d.run_once(now=t0 + 10 * T)
    async with transaction(runtime.sessions) as s:
        assert await expire_overdue(s, now=t0 + 31 * T) == [req.id]
    async with runtime.sessions() as s:
        expired = await get_request(s, req.id)
    assert expired is not None
    assert expired.status == Status.EXPIRED
    assert expired.reason == "nobody decided within 30m; asked Alice, Bob, Carol"
    answer = decision_for(expired)
    assert answer.decision.value == "deny"
    assert answer.reason is not None
    assert answer.reason.startswith("Not decided in time")
    assert "Nobody refused" in answer.reason
    assert "asked Alice, Bob, Carol" in answer.reason
    [event] = await events(runtime, req.id, "expired")
    assert event.detail["reason"] == expired.reason

    await d.run_once(now=t0 + 31 * T)
    for channel in (chat, pager):
        last = channel.cards_for(req.id)[-1]
        assert last.status == "expired"
        assert last.reason == "nobody decided within 30m; asked Alice, Bob, Carol"


async def test_an_expiry_before_the_escalation_names_only_those_asked(
    world: tuple[Runtime, FakeChannel, FakeChannel],
) -> None:
    runtime, _, _ = world
    req = await new_request(runtime, "pay_invoice")
    async with transaction(runtime.sessions) as s:
        await s.exec(  # type: ignore[call-overload]
            ConfirmationRequest.__table__.update()  # type: ignore[attr-defined]
            .where(ConfirmationRequest.__table__.c.id == req.id)  # type: ignore[attr-defined]
            .values(expires_at=req.created_at + 5 * T)
        )
    async with transaction(runtime.sessions) as s:
        await expire_overdue(s, now=req.created_at + 6 * T)
    async with runtime.sessions() as s:
        expired = await get_request(s, req.id)
    assert expired is not None
    assert expired.reason == "nobody decided within 5m; asked Alice, Bob"


# --------------------------------------------------------------------------- the rule itself

CONFIG = make_config()
GATE = GateSnapshot(
    name="g",
    channel="chat",
    approvers=("alice",),
    escalations=(
        EscalationStep(after_seconds=600, channel="pager", approvers=("carol",)),
        EscalationStep(after_seconds=1200, channel="chat", approvers=("bob",)),
    ),
)
START = datetime(2026, 1, 1, tzinfo=UTC)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seconds=st.floats(min_value=0, max_value=1800, allow_nan=False),
    who=st.sampled_from(["alice", "bob", "carol"]),
    channel=st.sampled_from(["chat", "pager", "other"]),
    operator=st.booleans(),
)
def test_an_escalation_approver_counts_only_from_its_time(
    seconds: float, who: str, channel: str, operator: bool
) -> None:
    person = PEOPLE[who]
    voter = Voter(channel, str(person["fake"]), str(person["name"]), who, operator=operator)
    eligible, why = eligible_gates(
        [GATE],
        requesters=(),
        voter=voter,
        config=CONFIG,
        created_at=START,
        now=START + timedelta(seconds=seconds),
    )
    due = {"alice": 0.0, "carol": 600.0, "bob": 1200.0}[who]
    channels = {"chat"} | ({"pager"} if seconds >= 600 else set())
    expected = seconds >= due and (operator or channel in channels)
    assert (eligible == [0]) is expected
    if seconds < due and (operator or channel in {"chat", "pager"}):
        # Their time has not come: they are told when it will.
        assert why is not None
        assert is_not_yet(why)
