"""The transition table, walked whole; votes and quorum; the audit chain."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from signoff.app import audit
from signoff.app.audit import Actor, verify_chain
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, Delivery, Status, utcnow
from signoff.app.requests.eligibility import Voter
from signoff.app.requests.states import (
    ALLOWED_TRANSITIONS,
    TERMINAL,
    expire_overdue,
    get_request,
    transition,
)
from signoff.app.requests.tally import votes_for
from signoff.app.requests.votes import cast_vote
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.app.factories import make_request, make_row

PAIRS = list(itertools.product(list(Status), [s for s in Status if s is not Status.PENDING]))


def test_terminal_states_have_no_way_out() -> None:
    assert set(TERMINAL) == {Status.APPROVED, Status.REJECTED, Status.EXPIRED, Status.CANCELLED}
    assert ALLOWED_TRANSITIONS[Status.PENDING] == TERMINAL


@pytest.mark.postgres
@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
async def test_transition_table(runtime: Runtime, source: Status, target: Status) -> None:
    async with transaction(runtime.sessions) as s:
        req = await make_row(s, status=source)
    async with transaction(runtime.sessions) as s:
        moved = await transition(s, req.id, target, actor=Actor("test", "u1", "Tess"), reason="because")
    allowed = target in ALLOWED_TRANSITIONS[source]
    assert moved is allowed
    async with runtime.sessions() as s:
        after = await get_request(s, req.id)
        assert after is not None
        assert after.status == (target if allowed else source)
        events = (await s.exec(select(AuditEvent.action).where(col(AuditEvent.request_id) == req.id))).all()
        updates = (
            await s.exec(
                select(Delivery).where(col(Delivery.request_id) == req.id, col(Delivery.kind) == "update")
            )
        ).all()
    if allowed:
        assert after.decided_by_name == "Tess"
        assert after.reason == "because"
        assert events == ["created", target.value]
        assert len(updates) == 1, "every transition owes its card a redraw"
    else:
        assert events == ["created"]
        assert updates == []


def voter(person: str, user_id: str | None = None) -> Voter:
    return Voter(
        channel="chat",
        user_id=user_id or f"U_{person.upper()}",
        person=person,
        name=person.title(),
    )


async def test_quorum_two_needs_two_distinct_approvers(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, cfg, tool="wire_money")
    async with transaction(runtime.sessions) as s:
        first = await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
    assert first is not None
    assert first.accepted
    assert not first.decided
    assert "1 of 2" in first.message
    async with transaction(runtime.sessions) as s:
        twice = await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
    assert twice is not None
    assert not twice.accepted
    assert "already voted" in twice.message
    async with transaction(runtime.sessions) as s:
        second = await cast_vote(s, req.id, voter=voter("bob"), verdict=Verdict.APPROVE, config=cfg)
    assert second is not None
    assert second.decided
    assert second.request.status == Status.APPROVED


async def test_votes_read_in_a_transaction_are_read_again_once_it_votes(runtime: Runtime) -> None:
    """A transaction remembers the votes it read, and forgets them when it votes: the second
    vote's decision, its receipt and every read after it see both votes."""
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, cfg, tool="wire_money")
    async with transaction(runtime.sessions) as s:
        assert await votes_for(s, req.id) == []
        first = await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
        assert first is not None
        assert not first.decided
        assert [v.voter for v in await votes_for(s, req.id)] == ["alice"]
        second = await cast_vote(s, req.id, voter=voter("bob"), verdict=Verdict.APPROVE, config=cfg)
        assert second is not None
        assert second.decided
        assert [v.voter for v in await votes_for(s, req.id)] == ["alice", "bob"]
        receipt = second.request.receipt
    assert receipt is not None
    assert [v["person"] for v in receipt["payload"]["votes"]] == ["alice", "bob"]
    async with transaction(runtime.sessions) as s:
        assert [v.voter for v in await votes_for(s, req.id)] == ["alice", "bob"]


async def test_one_rejection_rejects(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, cfg, tool="wire_money")
        await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
    async with transaction(runtime.sessions) as s:
        no_reason = await cast_vote(s, req.id, voter=voter("bob"), verdict=Verdict.REJECT, config=cfg)
        assert no_reason is not None
        assert not no_reason.accepted
        assert "reason is required" in no_reason.message
        rejected = await cast_vote(
            s, req.id, voter=voter("bob"), verdict=Verdict.REJECT, config=cfg, reason="no"
        )
    assert rejected is not None
    assert rejected.decided
    assert rejected.request.status == Status.REJECTED
    assert rejected.request.reason == "no"


async def test_non_approvers_and_the_requester_are_refused_and_audited(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, cfg, user_id="alice")
    async with transaction(runtime.sessions) as s:
        outsider = await cast_vote(s, req.id, voter=voter("carol"), verdict=Verdict.APPROVE, config=cfg)
        stranger = await cast_vote(
            s, req.id, voter=Voter("chat", "U_NOBODY"), verdict=Verdict.APPROVE, config=cfg
        )
        requester = await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
    assert outsider is not None
    assert stranger is not None
    assert requester is not None
    assert not outsider.accepted
    assert "not an approver" in outsider.message
    assert not stranger.accepted
    assert "not an approver" in stranger.message
    assert not requester.accepted
    assert "your own behalf" in requester.message
    async with runtime.sessions() as s:
        refused = (
            await s.exec(
                select(AuditEvent).where(
                    col(AuditEvent.request_id) == req.id, col(AuditEvent.action) == "vote_refused"
                )
            )
        ).all()
        assert [e.actor_id for e in refused] == ["U_CAROL", "U_NOBODY", "U_ALICE"]
        assert (await get_request(s, req.id)).status == Status.PENDING  # type: ignore[union-attr]


async def test_a_vote_on_a_decided_request_says_who_decided(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, cfg)
        await cast_vote(s, req.id, voter=voter("alice"), verdict=Verdict.APPROVE, config=cfg)
    async with transaction(runtime.sessions) as s:
        late = await cast_vote(s, req.id, voter=voter("bob"), verdict=Verdict.REJECT, config=cfg)
    assert late is not None
    assert not late.accepted
    assert late.message == "This request was already approved by Alice."


@pytest.mark.postgres
async def test_audit_chain_detects_edits_and_deletions(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        for _ in range(3):
            await make_request(s, cfg)
    async with runtime.sessions() as s:
        count, broken = await verify_chain(s)
    assert (count, broken) == (3, None)
    async with transaction(runtime.sessions) as s:
        await s.exec(sa.update(AuditEvent).where(col(AuditEvent.seq) == 2).values(detail={"tool": "forged"}))
    async with runtime.sessions() as s:
        count, broken = await verify_chain(s)
    assert broken is not None
    assert broken.seq == 2
    assert count == 1
    async with transaction(runtime.sessions) as s:
        await s.exec(sa.delete(AuditEvent).where(col(AuditEvent.seq) == 2))
    async with runtime.sessions() as s:
        _, broken = await verify_chain(s)
    assert broken is not None
    assert broken.seq == 3
    assert "missing" in broken.problem


async def test_the_audit_log_takes_only_the_actions_it_knows(runtime: Runtime) -> None:
    with pytest.raises(ValueError, match="'approve'"):
        async with transaction(runtime.sessions) as s:
            await audit.append(s, "approve", actor=Actor("test"))  # type: ignore[arg-type]
    async with runtime.sessions() as s:
        assert (await s.exec(select(AuditEvent))).all() == []
        assert await verify_chain(s) == (0, None)


@pytest.mark.postgres
async def test_the_sweep_expires_at_most_a_batch_the_oldest_deadline_first(runtime: Runtime) -> None:
    start = utcnow()
    async with transaction(runtime.sessions) as s:
        made = [
            await make_request(s, runtime.config, idempotency_key=f"k{i}", now=start + timedelta(seconds=i))
            for i in range(5)
        ]
    later = start + timedelta(hours=2)  # past every deadline (30 minutes)
    async with transaction(runtime.sessions) as s:
        first = await expire_overdue(s, now=later, batch=3)
    async with transaction(runtime.sessions) as s:
        rest = await expire_overdue(s, now=later, batch=3)
    assert first == sorted(r.id for r in made[:3])
    assert rest == sorted(r.id for r in made[3:])
