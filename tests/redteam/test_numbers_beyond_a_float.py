"""Numbers too large for a float in a JSON body, through the real server: read as infinity they
showed approvers ``null`` (SQLite) or told the agent the database was down (PostgreSQL). Each
is a 422 naming the field, in calls, reports and decisions, and nothing is stored."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import ADMIN, POST, PRE, agent, ask, attack_config, property_test, request_count

PROPERTY = property_test(20)


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


HUGE = st.builds(
    lambda sign, mantissa, exponent, plus: f"{sign}{mantissa}e{'+' if plus else ''}{exponent}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["1", "9", "1.5", "0.9", "123456"]),
    st.integers(min_value=315, max_value=99999),
    st.booleans(),
) | st.integers(min_value=309, max_value=2000).map(lambda digits: "9" * digits + ".0")


@pytest.mark.postgres
@PROPERTY
@given(number=HUGE, where=st.sampled_from(["argument", "nested", "metadata"]))
async def test_a_number_too_large_for_a_float_is_refused_before_anything_is_written(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, number: str, where: str
) -> None:
    """``1e400`` is read as infinity: on SQLite approvers were shown ``null`` for a value the
    tool would get as infinity, on PostgreSQL the agent was told the database was down (503).
    It is a 422 naming the field, and nothing is stored."""
    arguments = {"to": "acme", "amount": "AMOUNT"}
    if where == "argument":
        raw_arguments = json.dumps(arguments).replace('"AMOUNT"', number)
        raw_metadata = "{}"
        named = "arguments.amount"
    elif where == "nested":
        raw_arguments = json.dumps({**arguments, "amount": ["AMOUNT"]}).replace('"AMOUNT"', number)
        raw_metadata = "{}"
        named = "arguments.amount[0]"
    else:
        raw_arguments = json.dumps({**arguments, "amount": 90000})
        raw_metadata = json.dumps({"limit": "AMOUNT"}).replace('"AMOUNT"', number)
        named = "metadata.limit"
    body = f'{{"tool_name": "pay_invoice", "arguments": {raw_arguments}, "metadata": {raw_metadata}}}'
    before = await request_count(runtime)
    r = await http.post(
        PRE, content=body.encode(), headers={**agent(agent_key), "content-type": "application/json"}
    )
    assert r.status_code == 422, (number, r.status_code, r.text)
    assert named in r.text, r.text
    assert await request_count(runtime) == before


@pytest.mark.postgres
async def test_numbers_near_the_float_limit_still_pass(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    headers = {**agent(agent_key), "content-type": "application/json"}
    for number in ("1e308", "1.7976931348623157e308", "-1e308", "1e-400", "9" * 400):
        body = f'{{"tool_name": "pay_invoice", "arguments": {{"amount": {number}, "e123": "e4567"}}}}'
        r = await http.post(PRE, content=body.encode(), headers=headers)
        assert r.status_code == 200, (number, r.text)


@pytest.mark.postgres
async def test_a_huge_number_is_refused_in_reports_and_decisions_too(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    headers = {**agent(agent_key), "content-type": "application/json"}
    report = b'{"tool_name": "pay_invoice", "arguments": {"amount": 1}, "result": {"paid": 1e999}}'
    r = await http.post(POST, content=report, headers=headers)
    assert r.status_code == 422, r.text
    rid = (await ask(http, agent_key, {"tool_name": "pay_invoice", "arguments": {"amount": 90000}}))[
        "request_id"
    ]
    decision = b'{"verdict": "approve", "operator": "alice", "reason": "ok", "arguments": {"amount": 1e999}}'
    r = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        content=decision,
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    shown = await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))
    assert shown.json()["status"] == "pending"
