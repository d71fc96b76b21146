"""Gate conditions (``when``) through the real ``POST /v1/hooks/pre-tool-use``, on SQLite and
PostgreSQL: a condition that cannot be evaluated for a call denies it, naming the gate and the
error, logged, audited and counted; no request is made and nobody is asked. ``has()`` keeps a
field calls may leave out a clean non-match."""

from __future__ import annotations

import copy
import logging
import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import AuditEvent, ConfirmationRequest
from signoff.app.runtime import Runtime
from tests.app.test_ops import sample
from tests.conftest import DEFAULT_CONFIG

PRE = "/v1/hooks/pre-tool-use"
ERRORS = "signoff_condition_errors_total"
PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"] += [
    {
        "type": "confirmation_gate",
        "name": "limits",
        "tools": ["send_*"],
        "when": "args.amount >= 50000",
        "channel": "chat",
        "approvers": ["alice"],
    },
    {
        # Runs after `two-person` (priority 100), which asks first for every wire_* call.
        "type": "confirmation_gate",
        "name": "wire limits",
        "tools": ["wire_*"],
        "when": "args.amount >= 1000",
        "channel": "chat",
        "approvers": ["carol"],
        "priority": 200,
    },
]


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def call(tool: str = "send_payment", **arguments: Any) -> dict[str, Any]:
    return {
        "tool_name": tool,
        "arguments": arguments,
        "session_id": "s-1",
        "tool_call_id": "tc-1",
        "idempotency_key": f"k-{uuid.uuid4().hex}",
    }


async def requests(runtime: Runtime) -> int:
    async with runtime.sessions() as s:
        return int((await s.exec(sa.select(sa.func.count()).select_from(ConfirmationRequest))).one()[0])


async def condition_errors(runtime: Runtime) -> list[AuditEvent]:
    async with runtime.sessions() as s:
        stmt = (
            select(AuditEvent)
            .where(col(AuditEvent.action) == "condition_error")
            .order_by(col(AuditEvent.seq))
        )
        return list((await s.exec(stmt)).all())


async def errors_counted(http: httpx.AsyncClient, gate: str) -> float:
    return sample((await http.get("/metrics")).text, ERRORS, agent="finance-bot", gate=gate)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"amount": "a lot"}, "No such overload"),
        ({"to": "acme"}, "no field 'amount' in the call"),
        ({"amount": None}, "No such overload"),
        ({"amount": [90000]}, "No such overload"),
    ],
    ids=["string", "absent", "null", "list"],
)
async def test_a_condition_that_cannot_be_evaluated_denies_naming_the_gate_and_the_error(
    http: httpx.AsyncClient,
    agent_key: str,
    runtime: Runtime,
    caplog: pytest.LogCaptureFixture,
    arguments: dict[str, Any],
    error: str,
) -> None:
    counted = await errors_counted(http, "limits")
    with caplog.at_level(logging.WARNING, logger="signoff"):
        answer = await http.post(
            PRE, json=call(**arguments), headers={"Authorization": f"Bearer {agent_key}"}
        )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["decision"] == "deny"
    assert body["request_id"] is None
    assert body["reason"].startswith("gate 'limits' could not evaluate its condition for this call (")
    assert error in body["reason"]
    assert body["reason"].endswith("), so the call is denied")

    assert await requests(runtime) == 0, "nobody is asked"
    [event] = await condition_errors(runtime)
    assert event.request_id is None
    assert (event.actor_channel, event.actor_id) == ("agent", "finance-bot")
    assert event.detail["gate"] == "limits"
    assert event.detail["when"] == "args.amount >= 50000"
    assert event.detail["tool"] == "send_payment"
    assert event.detail["tool_call_id"] == "tc-1"
    assert error in event.detail["error"]
    assert await errors_counted(http, "limits") == counted + 1
    [logged] = [r for r in caplog.records if "could not be evaluated" in r.getMessage()]
    assert logged.levelno == logging.WARNING
    assert "'limits'" in logged.getMessage()
    assert "args.amount >= 50000" in logged.getMessage()


async def test_has_keeps_an_absent_field_a_clean_non_match(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    counted = await errors_counted(http, "payments")
    answer = await http.post(
        PRE, json=call("pay_invoice", to="acme"), headers={"Authorization": f"Bearer {agent_key}"}
    )
    assert answer.json()["decision"] == "allow", answer.text
    assert await condition_errors(runtime) == []
    assert await errors_counted(http, "payments") == counted


async def test_a_later_gate_that_cannot_evaluate_denies_what_an_earlier_gate_would_ask(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """`two-person` asks about every wire_* call and runs first; it must not make a request
    that `wire limits` could not judge."""
    counted = await errors_counted(http, "wire limits")
    answer = await http.post(
        PRE, json=call("wire_money", amount="lots"), headers={"Authorization": f"Bearer {agent_key}"}
    )
    body = answer.json()
    assert body["decision"] == "deny", body
    assert body["reason"].startswith("gate 'wire limits' could not evaluate its condition")
    assert await requests(runtime) == 0
    [event] = await condition_errors(runtime)
    assert event.detail["gate"] == "wire limits"
    assert await errors_counted(http, "wire limits") == counted + 1

    fine = await http.post(
        PRE, json=call("wire_money", amount=5000), headers={"Authorization": f"Bearer {agent_key}"}
    )
    assert fine.json()["decision"] == "pending", fine.text
    assert {g["name"] for g in fine.json()["request"]["gates"]} == {"two-person", "wire limits"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@PROPERTY
@given(amount=json_values)
async def test_whatever_the_amount_a_call_is_asked_about_only_when_the_condition_holds(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, amount: Any
) -> None:
    before = await requests(runtime)
    answer = await http.post(PRE, json=call(amount=amount), headers={"Authorization": f"Bearer {agent_key}"})
    assert answer.status_code in (200, 422), answer.text
    if answer.status_code == 422:  # text the API refuses (NUL, lone surrogates): nothing written
        assert await requests(runtime) == before
        return
    decision = answer.json()["decision"]
    number = isinstance(amount, int | float) and not isinstance(amount, bool)
    if not number:
        assert decision == "deny", answer.text
        assert "'limits' could not evaluate" in answer.json()["reason"]
    else:
        assert decision == ("pending" if amount >= 50000 else "allow"), answer.text
    assert await requests(runtime) == before + (decision == "pending")
