"""One approval authorizes one call, once (DESIGN: "What an approval authorizes").

Replays of an approved idempotency key answer ``allow`` only until the call is reported as
executed (``POST /v1/hooks/post-tool-use`` with the same key) or until the gate's
``approval_valid_for`` (default 10 minutes) after the decision; after that they deny. A
replay is the approved call only if it is made for the same user and its arguments are the
same JSON (key order and whitespace aside): on behalf of someone else, with other arguments
or text in another normal form, it is denied.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, ConfirmationRequest, utcnow
from signoff.app.requests.single_use import valid_for
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN
from tests.redteam.support import (
    POST,
    agent,
    ask,
    attack_config,
    decide,
    pending,
    property_test,
    request_count,
    send,
)

PRE = "/v1/hooks/pre-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PROPERTY = property_test(25)
CALL = {"tool_name": "pay_invoice", "arguments": {"amount": 60000, "to": "acme"}, "idempotency_key": "pay-1"}


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


async def _approved(http: httpx.AsyncClient, key: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    r = await http.post(PRE, json=CALL, headers=headers)
    assert r.json()["decision"] == "pending", r.text
    rid = str(r.json()["request_id"])
    d = await http.post(
        f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "alice"}, headers=ADMIN
    )
    assert d.status_code == 200, d.text
    again = await http.post(PRE, json=CALL, headers=headers)
    assert again.json()["decision"] == "allow", "a retry of the approved call itself is allowed"
    shown = (await http.get(f"/v1/requests/{rid}", headers=headers)).json()
    decided, until = (datetime.fromisoformat(shown[k]) for k in ("decided_at", "approval_valid_until"))
    assert until - decided == timedelta(minutes=10)
    return rid


async def test_an_executed_approval_cannot_be_replayed(http: httpx.AsyncClient, agent_key: str) -> None:
    """Once the call is reported executed, its key answers deny: the payment runs once."""
    headers = {"Authorization": f"Bearer {agent_key}"}
    await _approved(http, agent_key)
    post = await http.post("/v1/hooks/post-tool-use", json={**CALL, "result": "paid"}, headers=headers)
    assert post.status_code == 200, post.text
    replay = await http.post(PRE, json=CALL, headers=headers)
    assert replay.json()["decision"] == "deny", replay.json()


async def test_an_approval_lapses_after_approval_valid_for(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """Eleven minutes after the decision (default ``approval_valid_for`` 10m), a replay denies."""
    rid = await _approved(http, agent_key)
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        row = (await session.exec(sa.select(table.c.decided_at).where(table.c.id == rid))).one()
        await session.exec(
            sa.update(table).where(table.c.id == rid).values(decided_at=row[0] - timedelta(minutes=11))
        )
    replay = await http.post(PRE, json=CALL, headers={"Authorization": f"Bearer {agent_key}"})
    assert replay.json()["decision"] == "deny", replay.json()


async def test_a_replay_says_why_it_is_denied_and_a_new_key_asks_again(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    headers = {"Authorization": f"Bearer {agent_key}"}
    rid = await _approved(http, agent_key)
    post = await http.post(
        "/v1/hooks/post-tool-use",
        json={**CALL, "result": "paid"},
        headers=headers,
    )
    assert post.status_code == 200, post.text
    replay = (await http.post(PRE, json=CALL, headers=headers)).json()
    assert replay["request_id"] == rid
    assert "used" in replay["reason"]
    assert "new idempotency key" in replay["reason"]
    fresh = (await http.post(PRE, json={**CALL, "idempotency_key": "pay-2"}, headers=headers)).json()
    assert fresh["decision"] == "pending", "the same payment again is a new request for a human"
    shown = (await http.get(f"/v1/requests/{rid}", headers=headers)).json()
    assert shown["executed_at"] is not None
    assert shown["approval_valid_until"] is None
    async with runtime.sessions() as s:
        [event] = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "executed"))).all()
    assert event.request_id == rid
    assert event.detail["arguments"] == CALL["arguments"]


async def test_a_lapsed_approval_says_so(http: httpx.AsyncClient, agent_key: str, runtime: Runtime) -> None:
    rid = await _approved(http, agent_key)
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        await session.exec(
            sa.update(table)
            .where(table.c.id == rid)
            .values(decided_at=utcnow() - timedelta(minutes=10, seconds=1))
        )
    replay = (await http.post(PRE, json=CALL, headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert replay["decision"] == "deny"
    assert "lapsed" in replay["reason"]
    assert "10m after the decision" in replay["reason"]


@pytest.mark.postgres
async def test_replays_racing_reports_close_the_approval_once(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """Replays and reports at once: each answer is allow or deny, never an error; the approval is
    closed by exactly one report; every replay after that denies."""
    headers = {"Authorization": f"Bearer {agent_key}"}
    rid = await _approved(http, agent_key)
    report = {**CALL, "result": "paid"}
    answers = await asyncio.gather(
        *(http.post(PRE, json=CALL, headers=headers) for _ in range(10)),
        *(http.post("/v1/hooks/post-tool-use", json=report, headers=headers) for _ in range(3)),
        *(http.post(PRE, json=CALL, headers=headers) for _ in range(10)),
    )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    assert {a.json()["decision"] for a in answers[:10] + answers[13:]} <= {"allow", "deny"}
    async with runtime.sessions() as s:
        executed = (
            await s.exec(select(AuditEvent.request_id).where(col(AuditEvent.action) == "executed"))
        ).all()
    assert list(executed) == [rid]
    after = (await http.post(PRE, json=CALL, headers=headers)).json()
    assert after["decision"] == "deny"


async def test_only_the_calls_own_key_closes_its_approval(http: httpx.AsyncClient, agent_key: str) -> None:
    headers = {"Authorization": f"Bearer {agent_key}"}
    await _approved(http, agent_key)
    for other in (
        {**CALL, "idempotency_key": "pay-other"},
        {k: v for k, v in CALL.items() if k != "idempotency_key"},
    ):
        assert (
            await http.post("/v1/hooks/post-tool-use", json={**other, "result": 1}, headers=headers)
        ).status_code == 200
    assert (await http.post(PRE, json=CALL, headers=headers)).json()["decision"] == "allow"


async def test_a_report_before_the_approval_changes_nothing(http: httpx.AsyncClient, agent_key: str) -> None:
    headers = {"Authorization": f"Bearer {agent_key}"}
    rid = (await http.post(PRE, json=CALL, headers=headers)).json()["request_id"]
    assert (
        await http.post("/v1/hooks/post-tool-use", json={**CALL, "result": 1}, headers=headers)
    ).status_code == 200
    await http.post(
        f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "alice"}, headers=ADMIN
    )
    assert (await http.post(PRE, json=CALL, headers=headers)).json()["decision"] == "allow"


async def test_session_and_tool_call_ids_are_the_key_when_none_is_sent(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    headers = {"Authorization": f"Bearer {agent_key}"}
    call = {
        "tool_name": "pay_invoice",
        "arguments": {"amount": 60000},
        "session_id": "s-1",
        "tool_call_id": "c-1",
    }
    rid = (await http.post(PRE, json=call, headers=headers)).json()["request_id"]
    await http.post(
        f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "alice"}, headers=ADMIN
    )
    assert (await http.post(PRE, json=call, headers=headers)).json()["decision"] == "allow"
    await http.post("/v1/hooks/post-tool-use", json={**call, "result": "ok"}, headers=headers)
    assert (await http.post(PRE, json=call, headers=headers)).json()["decision"] == "deny"


def test_the_shortest_approval_valid_for_of_the_gates_applies() -> None:
    def request(*seconds: float | None) -> ConfirmationRequest:
        gates = [
            {"key": f"g{i}"} | ({"approval_valid_for_seconds": s} if s else {}) for i, s in enumerate(seconds)
        ]
        return ConfirmationRequest(id="r", gate=gates[0], gates=gates, channel="chat")

    assert valid_for(request(60, 600)) == timedelta(minutes=1)
    assert valid_for(request(3600)) == timedelta(hours=1)
    assert valid_for(request(None)) == timedelta(minutes=10), "gates recorded before it: the default"
    assert valid_for(request(3600, None)) == timedelta(minutes=10)


# --- replays: another user, canonical spellings ----------------------------------------------


def payment(**extra: Any) -> dict[str, Any]:
    return {
        "tool_name": "pay_invoice",
        "arguments": {"amount": 60000, "to": "acme"},
        "user_id": "U_CAROL",
        "session_id": "s-1",
        "idempotency_key": f"pay-{uuid.uuid4().hex}",
        **extra,
    }


async def test_an_approved_key_replayed_on_behalf_of_someone_else_is_denied(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    """Alice approved a payment made for Carol. The same key replayed for Alice herself would
    be a call she approved on her own behalf (which the gate forbids), for Bob or nobody a call
    nobody was asked about: each is denied. Carol under any of her ids still runs it."""
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    for user in ("U_ALICE", "alice", "Alice", "U_BOB", None, "mallory"):
        replay = await ask(http, agent_key, {**call, "user_id": user})
        assert replay["decision"] == "deny", (user, replay)
        assert "on behalf of another user" in replay["reason"], replay
    for user in ("U_CAROL", "carol", " CAROL", "u_carol"):
        replay = await ask(http, agent_key, {**call, "user_id": user})
        assert replay["decision"] == "allow", (user, replay)


async def test_a_pending_key_replayed_on_behalf_of_someone_else_does_not_attach(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    replay = await ask(http, agent_key, {**call, "user_id": "U_BOB"})
    assert replay["decision"] == "deny", replay
    assert await request_count(runtime) == 1
    assert (await ask(http, agent_key, call))["request_id"] == rid


@pytest.mark.parametrize(
    ("replayed", "allowed"),
    [
        ('{"to": "acme", "amount": 60000}', True),  # key order
        ('{ "amount" :60000 ,"to":"acme" }', True),  # whitespace
        ('{"amount": 60000, "to": "\\u0061cme"}', True),  # the same text, escaped
        ('{"amount": 60000.0, "to": "acme"}', False),
        ('{"amount": 6e4, "to": "acme"}', False),
        ('{"amount": 60000, "to": "ACME"}', False),
        ('{"amount": 60000, "to": "acme", "memo": null}', False),
    ],
)
async def test_a_replay_is_the_approved_call_only_if_its_json_is_canonically_equal(
    http: httpx.AsyncClient, agent_key: str, replayed: str, allowed: bool
) -> None:
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    body = json.dumps({**call, "arguments": "ARGS"}).replace('"ARGS"', replayed)
    r = await http.post(
        PRE, content=body.encode(), headers={**agent(agent_key), "content-type": "application/json"}
    )
    assert r.json()["decision"] == ("allow" if allowed else "deny"), (replayed, r.json())


async def test_text_in_another_normal_form_is_another_call(http: httpx.AsyncClient, agent_key: str) -> None:
    call = payment(arguments={"amount": 60000, "to": unicodedata.normalize("NFC", "café")})
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    nfd = {**call, "arguments": {"amount": 60000, "to": unicodedata.normalize("NFD", "café")}}
    assert (await ask(http, agent_key, nfd))["decision"] == "deny"
    assert (await ask(http, agent_key, call))["decision"] == "allow"


# --- single use -----------------------------------------------------------------------------------

OTHER_ARGUMENTS = st.dictionaries(
    st.sampled_from(["to", "memo", "extra"]),
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
        st.booleans(),
        st.none(),
    ),
).flatmap(
    # The amount stays one the 'sends' gate catches: the replay is a gated call.
    lambda d: st.one_of(st.just(60000.0), st.integers(1000, 999_999)).map(lambda a: {**d, "amount": a})
)


@PROPERTY
@given(other=OTHER_ARGUMENTS)
async def test_an_approved_key_replayed_with_other_arguments_is_denied(
    http: httpx.AsyncClient, agent_key: str, other: dict[str, Any]
) -> None:
    call = send(amount=60000)
    changed = {**call["arguments"], **other}
    if changed == call["arguments"] and all(type(changed[k]) is type(call["arguments"][k]) for k in changed):
        return
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    replay = (await http.post(PRE, json={**call, "arguments": changed}, headers=agent(agent_key))).json()
    assert replay["decision"] == "deny", (changed, replay)


@pytest.mark.postgres
async def test_concurrent_replays_after_the_report_are_denied(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    """Once executed is reported, every replay (however many at once) is denied."""
    call = send()
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    ran = await http.post(POST, json={**call, "result": "paid"}, headers=agent(agent_key))
    assert ran.status_code == 200
    answers = await asyncio.gather(*(http.post(PRE, json=call, headers=agent(agent_key)) for _ in range(8)))
    assert {a.json()["decision"] for a in answers} == {"deny"}
