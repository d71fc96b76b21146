"""Racing writers: an approve, a reject, a cancel and the expiry sweep hit each request at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest
from sqlmodel import col, select

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, ConfirmationRequest, Status, utcnow
from signoff.app.requests.eligibility import Voter
from signoff.app.requests.states import expire_overdue, transition
from signoff.app.requests.votes import cast_vote
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.app.factories import make_request

pytestmark = pytest.mark.postgres

N = 50
TERMINAL_ACTIONS = {s.value for s in Status if s is not Status.PENDING}


async def test_fifty_requests_four_racers_one_outcome_each(runtime: Runtime) -> None:
    cfg = runtime.config
    async with transaction(runtime.sessions) as s:
        ids = [(await make_request(s, cfg)).id for _ in range(N)]

    async def approve(rid: str) -> tuple[str, bool, str]:
        async with transaction(runtime.sessions) as s:
            r = await cast_vote(
                s,
                rid,
                voter=Voter("chat", "U_ALICE", "Alice", "alice"),
                verdict=Verdict.APPROVE,
                config=cfg,
            )
        assert r is not None
        return rid, r.decided, r.message

    async def reject(rid: str) -> tuple[str, bool, str]:
        async with transaction(runtime.sessions) as s:
            r = await cast_vote(
                s,
                rid,
                voter=Voter("chat", "U_BOB", "Bob", "bob"),
                verdict=Verdict.REJECT,
                config=cfg,
                reason="no",
            )
        assert r is not None
        return rid, r.decided, r.message

    async def cancel(rid: str) -> tuple[str, bool, str]:
        async with transaction(runtime.sessions) as s:
            won = await transition(s, rid, Status.CANCELLED, actor=Actor("agent", "finance-bot"))
        return rid, won, "" if won else "already decided"

    async def sweep() -> list[str]:
        later = utcnow() + timedelta(hours=1)
        expired: list[str] = []
        for _ in range(3):
            async with transaction(runtime.sessions) as s:
                expired += await expire_overdue(s, now=later)
        return expired

    racers = [f(rid) for rid in ids for f in (approve, reject, cancel)]
    results = await asyncio.gather(*racers, sweep(), sweep())
    votes_and_cancels = results[:-2]
    expired = Counter(r for batch in results[-2:] for r in batch)  # type: ignore[union-attr]

    wins: Counter[str] = Counter()
    for rid, won, message in votes_and_cancels:  # type: ignore[misc]
        if won:
            wins[rid] += 1
        else:
            assert "already" in message, message  # losers are told
    wins.update(expired)
    assert all(wins[rid] == 1 for rid in ids), {rid: wins[rid] for rid in ids if wins[rid] != 1}

    async with runtime.sessions() as s:
        rows = (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id).in_(ids)))).all()
        events = (await s.exec(select(AuditEvent).where(col(AuditEvent.request_id).in_(ids)))).all()
    assert all(r.status != Status.PENDING for r in rows)
    for r in rows:
        terminal = [e.action for e in events if e.request_id == r.id and e.action in TERMINAL_ACTIONS]
        assert terminal == [str(r.status)], (r.id, terminal)
