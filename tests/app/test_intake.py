"""New requests written together: one transaction for the calls that arrive at once."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
import hypothesis
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import col, func, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Actor, verify_chain
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import AuditEvent, ConfirmationRequest, Delivery, from_row, utcnow
from signoff.app.requests import grants, intake
from signoff.app.requests.eligibility import gates_of
from signoff.app.requests.gate import GateService
from signoff.app.requests.intake import NewRequest, new_request
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from signoff.hooks import Decision, HookContext, HookResult, ServiceUnavailable
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch written (in the intake or in a call's own transaction)."""
    sizes: list[int] = []
    real = intake.write_new_requests

    async def spy(session: AsyncSession, batch: Sequence[NewRequest]) -> list[ConfirmationRequest | None]:
        sizes.append(len(batch))
        return await real(session, batch)

    monkeypatch.setattr(intake, "write_new_requests", spy)
    return sizes


def _gate(runtime: Runtime) -> ConfirmationGate:
    gate = runtime.config.agents["finance-bot"].hooks[0]
    assert isinstance(gate, ConfirmationGate)
    return gate


def _call(amount: int, key: str | None) -> HookContext:
    return HookContext(
        agent_id="finance-bot", tool_name="pay_invoice", arguments={"amount": amount}, idempotency_key=key
    )


async def _ask(runtime: Runtime, ctx: HookContext) -> HookResult:
    async with transaction(runtime.sessions) as s:
        return await GateService(s, runtime.config, ctx.agent_id, intake=runtime.intake).ask(
            ctx, _gate(runtime)
        )


async def _count(runtime: Runtime, model: Any, *where: Any) -> int:
    async with runtime.reads() as s:
        return int((await s.exec(select(func.count()).select_from(model).where(*where))).one())


@pytest.mark.postgres
async def test_calls_arriving_together_are_written_in_one_transaction(
    runtime: Runtime, batches: list[int]
) -> None:
    results = await asyncio.gather(*(_ask(runtime, _call(60_000 + i, f"k{i}")) for i in range(40)))

    assert all(r.decision is Decision.PENDING for r in results)
    ids = {r.request_id for r in results}
    assert len(ids) == 40
    assert sum(batches) == 40
    assert max(batches) > 1, f"no call shared a transaction: {batches}"
    assert len(batches) < 40
    # Each request is there with its `created` event and its card post, and the chain holds.
    assert await _count(runtime, ConfirmationRequest) == 40
    assert await _count(runtime, AuditEvent, col(AuditEvent.action) == "created") == 40
    assert await _count(runtime, Delivery, col(Delivery.kind) == "post") == 40
    async with runtime.reads() as s:
        count, broken = await verify_chain(s)
        created = (await s.exec(select(AuditEvent.request_id).order_by(col(AuditEvent.seq)))).all()
    assert (count, broken) == (40, None)
    assert set(created) == ids


@pytest.mark.postgres
async def test_the_same_call_twice_in_one_batch_is_one_request(runtime: Runtime, batches: list[int]) -> None:
    first, second = await asyncio.gather(
        _ask(runtime, _call(70_000, "same-key")), _ask(runtime, _call(70_000, "same-key"))
    )

    assert batches == [2]
    assert first.decision is second.decision is Decision.PENDING
    assert first.request_id == second.request_id
    assert await _count(runtime, ConfirmationRequest) == 1
    assert await _count(runtime, AuditEvent, col(AuditEvent.action) == "created") == 1


@pytest.mark.postgres
async def test_a_key_reused_for_another_call_in_the_same_batch_is_denied(
    runtime: Runtime, batches: list[int]
) -> None:
    results = await asyncio.gather(
        _ask(runtime, _call(70_000, "shared-key")), _ask(runtime, _call(99_000, "shared-key"))
    )

    assert batches == [2]
    assert sorted(r.decision.value for r in results) == ["deny", "pending"]
    denied = next(r for r in results if r.decision is Decision.DENY)
    assert "already used for a different call" in (denied.reason or "")
    assert await _count(runtime, ConfirmationRequest) == 1


@pytest.mark.postgres
async def test_a_call_the_database_refuses_fails_alone(runtime: Runtime, batches: list[int]) -> None:
    gates = runtime.config.confirmation_gates("finance-bot")[:1]
    good = [
        new_request(_call(80_000 + i, f"good-{i}"), gates, runtime.config, now=utcnow()) for i in range(3)
    ]
    bad = new_request(_call(80_000, "bad"), gates, runtime.config, now=utcnow())
    bad.row["tool_name"] = None  # NOT NULL: the database refuses this one row

    async def create(new: NewRequest) -> ConfirmationRequest | None:
        async with transaction(runtime.sessions) as s:
            return await runtime.intake.create_request(s, new)

    results = await asyncio.gather(
        *(create(n) for n in [good[0], bad, good[1], good[2]]), return_exceptions=True
    )

    assert [results[0], results[2], results[3]] == [None, None, None]
    assert isinstance(results[1], sa.exc.IntegrityError)
    # The batch failed, then each call was written on its own.
    assert batches == [4, 1, 1, 1, 1]
    async with runtime.reads() as s:
        stored = set((await s.exec(select(ConfirmationRequest.id))).all())
        assert (await verify_chain(s))[1] is None
    assert stored == {n.id for n in good}


@pytest.mark.postgres
async def test_an_unreachable_database_fails_the_whole_batch_once(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    async def down(session: AsyncSession, batch: Sequence[NewRequest]) -> list[ConfirmationRequest | None]:
        calls.append(len(batch))
        raise sa.exc.OperationalError("INSERT", {}, ConnectionRefusedError("connection refused"))

    monkeypatch.setattr(intake, "write_new_requests", down)
    results = await asyncio.gather(
        *(_ask(runtime, _call(60_000, f"down-{i}")) for i in range(5)), return_exceptions=True
    )

    # Each call is told to retry (the route answers 503), naming the database's error.
    assert all(isinstance(r, ServiceUnavailable) and "OperationalError" in str(r) for r in results)
    assert calls == [5]  # not retried call by call against a database that is down


@pytest.mark.postgres
async def test_a_call_with_a_transaction_of_its_own_writes_in_it(
    runtime: Runtime, batches: list[int]
) -> None:
    async with transaction(runtime.sessions) as s:
        await s.exec(select(1))  # another hook has begun the call's transaction
        result = await GateService(s, runtime.config, "finance-bot", intake=runtime.intake).ask(
            _call(60_000, "own"), _gate(runtime)
        )
        assert result.decision is Decision.PENDING
        # Visible in the call's own transaction before it commits.
        found = (
            await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == result.request_id))
        ).one()
        assert found.tool_name == "pay_invoice"
    assert batches == [1]
    assert await _count(runtime, ConfirmationRequest) == 1


async def test_a_web_channel_under_another_name_is_owed_no_card(settings: Settings) -> None:
    """A channel is web by its type, not its name: no card post (or redraw) is queued for it."""
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    raw["channels"]["console"] = {"type": "web"}
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = "console"
    runtime = Runtime.create(settings, parse_config(raw))
    try:
        async with transaction(runtime.sessions) as s:
            _, key = await create_key(s, "finance-bot", actor=Actor("test"))
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            answer = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "pay_invoice", "arguments": {"amount": 90000}},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert answer.json()["decision"] == "pending"
            rid = answer.json()["request_id"]
            decided = await http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
            assert decided.json()["status"] == "approved"
        assert await _count(runtime, Delivery, col(Delivery.request_id) == rid) == 0
    finally:
        await runtime.aclose()


def _slow_bot(settings: Settings, hooks: list[dict[str, Any]]) -> Runtime:
    """A runtime whose agent ``slow-bot`` has ``hooks`` (unnamed: they go by their labels)."""
    raw = copy.deepcopy(DEFAULT_CONFIG)
    raw["agents"]["slow-bot"] = {"hooks": hooks}
    runtime = Runtime.create(settings, parse_config(raw), channels={"chat": FakeChannel("chat")})
    runtime.registries["slow-bot"].timeout = 0.1
    return runtime


async def _slow_bot_key(runtime: Runtime) -> str:
    async with transaction(runtime.sessions) as s:
        _, key = await create_key(s, "slow-bot", actor=Actor("test"))
    return key


_UNNAMED_GATE = {"type": "confirmation_gate", "tools": ["slow_*"], "channel": "chat"}
_UNNAMED_LIMIT = {"type": "rate_limit", "tools": ["slow_*"], "limit": 100}


@pytest.mark.postgres
@pytest.mark.parametrize("joined", [False, True], ids=["through-the-intake", "in-the-call's-transaction"])
async def test_a_request_write_past_the_time_limit_denies_and_is_never_the_answer(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, joined: bool
) -> None:
    """A late write is never the call's answer: the call is denied naming the gate. Written by
    the intake, the request is committed all the same and a retry under the key finds it;
    written in the call's own unit of work, it is rolled back with it."""
    real = intake.write_new_requests
    slow_writes = [True]

    async def slow(session: AsyncSession, batch: Sequence[NewRequest]) -> list[ConfirmationRequest | None]:
        if slow_writes[0]:
            await asyncio.sleep(0.4)  # well past the hooks' 0.1 s timeout
        return await real(session, batch)

    monkeypatch.setattr(intake, "write_new_requests", slow)
    # A rate limit first has the call's own transaction begun, so the request joins it.
    limit = {**_UNNAMED_LIMIT, "timeout": "10s"}  # only the request's write is slow
    runtime = _slow_bot(settings, [limit, _UNNAMED_GATE] if joined else [_UNNAMED_GATE])
    call = {"tool_name": "slow_transfer", "arguments": {"amount": 1}, "idempotency_key": "slow-1"}
    try:
        key = await _slow_bot_key(runtime)
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            headers = {"Authorization": f"Bearer {key}"}
            r = await http.post("/v1/hooks/pre-tool-use", json=call, headers=headers)
            assert r.status_code == 200, r.text
            answer = r.json()
            assert answer["decision"] == "deny", answer
            assert (
                answer["reason"]
                == "gate 'confirmation_gate[slow_*]' could not record its request within 0.1s"
            )
            assert answer["request_id"] is None
            if joined:
                assert await _count(runtime, ConfirmationRequest) == 0
                assert await _count(runtime, Delivery) == 0
                return
            await eventually_async(lambda: _count(runtime, ConfirmationRequest))
            slow_writes[0] = False
            again = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=headers)).json()
            assert again["decision"] == "pending", again
            async with runtime.reads() as s:
                stored = (await s.exec(select(ConfirmationRequest.id, ConfirmationRequest.status))).all()
            assert [tuple(row) for row in stored] == [(again["request_id"], "pending")]
    finally:
        await runtime.aclose()


async def eventually_async(check: Callable[[], Awaitable[int]], timeout: float = 10) -> int:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, f"nothing within {timeout:g} s"
        await asyncio.sleep(0.02)
    return value


async def test_a_hook_that_times_out_is_named_by_its_label(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = GateService.take_token

    async def slow(self: GateService, bucket: str, **kw: float) -> float:
        await asyncio.sleep(0.4)
        return await real(self, bucket, **kw)

    monkeypatch.setattr(GateService, "take_token", slow)
    runtime = _slow_bot(settings, [_UNNAMED_LIMIT, _UNNAMED_GATE])
    try:
        key = await _slow_bot_key(runtime)
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            r = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "slow_transfer", "arguments": {"amount": 1}},
                headers={"Authorization": f"Bearer {key}"},
            )
        assert r.status_code == 200, r.text
        assert r.json()["decision"] == "deny"
        assert r.json()["reason"] == "hook 'rate_limit[slow_*]' did not answer within 0.1s"
        assert await _count(runtime, ConfirmationRequest) == 0
    finally:
        await runtime.aclose()


def _granting(quorum: int = 1) -> dict[str, Any]:
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    gate = raw["agents"]["finance-bot"]["hooks"][0]
    gate["quorum"] = quorum
    gate["grants"] = [{"scope": "session", "for": "1h", "same": ["to"]}]
    return raw


@hypothesis.settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.integers(), st.none()), min_size=1, max_size=6))
def test_each_request_records_its_own_call_and_the_gate_as_configured(targets: list[Any]) -> None:
    """What a gate records is made once per configuration, but each request keeps the digests
    of its own call, as stored and as typed; no request's record changes another's, and a new
    configuration records its own gate."""
    config = parse_config(_granting(), source="grants.yaml")
    (_, gate), *_ = keyed = config.confirmation_gates("finance-bot")
    made = []
    for to in targets:
        ctx = HookContext(
            agent_id="finance-bot", tool_name="pay_invoice", arguments={"amount": 90_000, "to": to}
        )
        new = new_request(ctx, keyed[:1], config, now=utcnow())
        made.append((to, copy.deepcopy(new.row["gates"]), new))
    for to, stored_then, new in made:
        digests = grants.argument_digests(gate, {"amount": 90_000, "to": to})
        assert new.row["gates"] == stored_then  # untouched by the calls after it
        assert stored_then[0]["argument_digests"] == digests
        assert new.gates[0].argument_digests == digests
        assert list(new.gates) == gates_of(from_row(ConfirmationRequest, new.row))
    again = parse_config(_granting(quorum=2), source="grants.yaml")
    rekeyed = again.confirmation_gates("finance-bot")
    ctx = HookContext(agent_id="finance-bot", tool_name="pay_invoice", arguments={"amount": 90_000, "to": 1})
    new = new_request(ctx, rekeyed[:1], again, now=utcnow())
    assert new.row["gates"][0]["quorum"] == new.gates[0].quorum == 2
    assert new.gates[0].config_version == again.version != config.version
