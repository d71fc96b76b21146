"""Card delivery through the outbox: posts, redraws, retries and permanent failures."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlmodel import col, select

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.models import Delivery, OutboxStatus, Status, utcnow
from signoff.app.outbox import Dispatcher, backoff
from signoff.app.requests.eligibility import Voter
from signoff.app.requests.states import get_request, transition
from signoff.app.requests.votes import cast_vote
from signoff.app.runtime import Runtime
from signoff.channels import PermanentDeliveryError, RetryableDeliveryError, Verdict
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request
from tests.units_of_work import counting


def dispatcher(runtime: Runtime) -> Dispatcher:
    return Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())


async def deliveries(runtime: Runtime, request_id: str) -> list[Delivery]:
    async with runtime.sessions() as s:
        return list(
            (
                await s.exec(
                    select(Delivery).where(col(Delivery.request_id) == request_id).order_by(col(Delivery.id))
                )
            ).all()
        )


async def test_post_then_redraw_to_the_outcome(runtime: Runtime, fake_channel: FakeChannel) -> None:
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool="wire_money")
    d = dispatcher(runtime)
    assert await d.run_once() == 1
    assert [c.status for c in fake_channel.posts] == ["pending"]
    post = (await deliveries(runtime, req.id))[0]
    assert post.status == OutboxStatus.SENT
    assert post.message_ref == {"message_id": "fake-1", "request_id": req.id}

    async with transaction(runtime.sessions) as s:
        await cast_vote(
            s,
            req.id,
            voter=Voter("chat", "U_ALICE", "Alice", "alice"),
            verdict=Verdict.APPROVE,
            config=runtime.config,
        )
    await d.run_once()
    ref, card = fake_channel.updates[-1]
    assert ref == post.message_ref
    assert card.status == "pending"
    assert [p.name for p in card.approvals] == ["Alice"]

    async with transaction(runtime.sessions) as s:
        await cast_vote(
            s,
            req.id,
            voter=Voter("chat", "U_BOB", "Bob", "bob"),
            verdict=Verdict.APPROVE,
            config=runtime.config,
        )
    await d.run_once()
    final = fake_channel.updates[-1][1]
    assert final.status == "approved"
    assert final.decided_by is not None
    assert final.decided_by.name == "Bob"
    assert all(x.status == OutboxStatus.SENT for x in await deliveries(runtime, req.id))


@pytest.mark.postgres
async def test_transient_failures_back_off_and_then_deliver(
    runtime: Runtime, fake_channel: FakeChannel
) -> None:
    fake_channel.failures = [
        RetryableDeliveryError("ratelimited", retry_after=30),
        RetryableDeliveryError("HTTP 503"),
    ]
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
    d = dispatcher(runtime)
    before = utcnow()
    await d.run_once()
    after = utcnow()
    row = (await deliveries(runtime, req.id))[0]
    assert row.status == OutboxStatus.PENDING
    assert row.attempts == 1
    assert row.last_error == "ratelimited"
    # Retry-After counts from the provider's answer, which came between ``before`` and ``after``.
    retry_after = timedelta(seconds=30)
    assert before + retry_after <= row.next_attempt_at <= after + retry_after, "Retry-After is honoured"
    assert await d.run_once() == 0, "not due yet"
    await d.run_once(now=utcnow() + timedelta(seconds=31))
    await d.run_once(now=utcnow() + timedelta(minutes=10))
    row = (await deliveries(runtime, req.id))[0]
    assert row.status == OutboxStatus.SENT
    assert row.attempts == 3
    assert len(fake_channel.posts) == 1


async def test_permanent_failure_cancels_the_request_with_the_reason(
    runtime: Runtime, fake_channel: FakeChannel
) -> None:
    fake_channel.failures = [PermanentDeliveryError("channel_not_found")]
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
    await dispatcher(runtime).run_once()
    async with runtime.sessions() as s:
        after = await get_request(s, req.id)
    assert after is not None
    assert after.status == Status.CANCELLED
    assert after.reason is not None
    assert "channel_not_found" in after.reason
    rows = await deliveries(runtime, req.id)
    assert rows[0].status == OutboxStatus.FAILED
    # The redraw owed by the cancellation has no card to redraw and is dropped.
    await dispatcher(runtime).run_once()
    assert [r.status for r in await deliveries(runtime, req.id)] == [OutboxStatus.FAILED, OutboxStatus.FAILED]


async def test_redraw_waits_for_the_post(runtime: Runtime, fake_channel: FakeChannel) -> None:
    fake_channel.failures = [RetryableDeliveryError("HTTP 500")]
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
    d = dispatcher(runtime)
    await d.run_once()  # the post fails once
    async with transaction(runtime.sessions) as s:
        await transition(s, req.id, Status.CANCELLED, actor=Actor("agent", "finance-bot"))
    later = utcnow() + timedelta(minutes=5)
    await d.run_once(now=later)  # post (now showing the outcome) and the redraw
    await d.run_once(now=later + timedelta(seconds=5))
    assert [c.status for c in fake_channel.posts] == ["cancelled"]
    assert all(r.status == OutboxStatus.SENT for r in await deliveries(runtime, req.id))


@pytest.mark.postgres
async def test_a_claimed_delivery_is_not_sent_twice(runtime: Runtime, fake_channel: FakeChannel) -> None:
    async with transaction(runtime.sessions) as s:
        await make_request(s, runtime.config)
    counts = await asyncio.gather(*(dispatcher(runtime).run_once() for _ in range(4)))
    assert sorted(counts) == [0, 0, 0, 1]
    assert len(fake_channel.posts) == 1


@pytest.mark.postgres
async def test_a_claim_leases_each_due_row_once_in_one_statement(
    runtime: Runtime, fake_channel: FakeChannel
) -> None:
    async with transaction(runtime.sessions) as s:
        made = [await make_request(s, runtime.config, idempotency_key=f"k{i}") for i in range(5)]
    rows = [d for r in made for d in await deliveries(runtime, r.id)]
    posts = sorted(d.id for d in rows if d.kind == "post")
    assert len(posts) == 5
    d, now = dispatcher(runtime), utcnow() + timedelta(seconds=1)
    with counting(runtime) as tally:
        first = await d._claim(now, 3)
    [unit] = [u for units in tally.by_task.values() for u in units]
    [statement] = unit.statements
    assert "UPDATE delivery SET leased_until" in statement
    # The oldest first; a leased row is not claimed again until its lease runs out.
    assert first == posts[:3]
    assert await d._claim(now, 3) == posts[3:]
    assert await d._claim(now, 3) == []
    later = now + timedelta(seconds=31)  # the lease is 30 s
    assert await d._claim(later, 10) == posts
    assert fake_channel.posts == []


def test_backoff_grows_and_honours_retry_after() -> None:
    assert backoff(0) <= 0.5
    assert 4 <= backoff(4) <= 8
    assert backoff(50) <= 300
    assert backoff(0, retry_after=42) == 42
