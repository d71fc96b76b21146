"""Approving with changes through the HTTP API: an approver changes the gate's ``editable``
fields (operator API ``arguments``), the agent is answered with the call as approved
(``modified_arguments``, the request's ``changes``), the audit records proposed and approved
values, and every change the gates do not allow is a 422 that changes nothing."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import ConfigError, SignoffConfig, parse_config
from signoff.app.metrics import REGISTRY
from signoff.app.models import AuditEvent, ConfirmationRequest, Vote
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG
from tests.waiting import eventually

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

SENDS: dict[str, Any] = {
    "type": "confirmation_gate",
    "name": "sends",
    "tools": ["send_*"],
    "when": "args.amount >= 1000",
    "channel": "chat",
    "approvers": ["alice", "bob"],
    "timeout": "30m",
    "editable": ["amount", "memo", "to"],
    "grants": [{"scope": "session", "for": "1h", "same": ["to"]}, {"scope": "agent", "for": "30m"}],
}
CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"] += [
    SENDS,
    {
        "type": "confirmation_gate",
        "name": "treasury",
        "tools": ["send_*"],
        "when": "args.amount >= 1000000",
        "channel": "chat",
        "approvers": ["carol"],
        "timeout": "30m",
    },
    {
        "type": "confirmation_gate",
        "name": "blocked routes",
        "tools": ["send_*"],
        "when": "args.to == 'offshore'",
        "channel": "chat",
        "approvers": ["carol"],
        "timeout": "30m",
    },
    {
        "type": "confirmation_gate",
        "name": "fixed",
        "tools": ["fixed_*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
    },
]

CALL: dict[str, Any] = {
    "tool_name": "send_payment",
    "arguments": {"to": "acme", "amount": 90000, "memo": "invoice 7", "api_token": "tok-live-123"},
    "session_id": "s-1",
    "idempotency_key": "pay:acme:90000",
}


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def agent(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(http: httpx.AsyncClient, key: str, call: dict[str, Any] = CALL) -> dict[str, Any]:
    answer: dict[str, Any] = (await http.post(PRE, json=call, headers=agent(key))).json()
    return answer


async def decide(http: httpx.AsyncClient, rid: str, **body: Any) -> httpx.Response:
    return await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": "alice", **body},
        headers=ADMIN,
    )


async def actions(runtime: Runtime, rid: str) -> list[AuditEvent]:
    async with runtime.sessions() as s:
        stmt = select(AuditEvent).where(col(AuditEvent.request_id) == rid).order_by(col(AuditEvent.seq))
        return list((await s.exec(stmt)).all())


async def row(runtime: Runtime, rid: str) -> ConfirmationRequest:
    async with runtime.sessions() as s:
        return (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid))).one()


# --- configuration -------------------------------------------------------------------------------


def _with_gate(**gate: Any) -> dict[str, Any]:
    raw = copy.deepcopy(DEFAULT_CONFIG)
    raw["agents"]["finance-bot"]["hooks"] = [{**SENDS, "grants": [], **gate}]
    return raw


def test_editable_beside_a_quorum_is_refused_saying_why() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_with_gate(quorum=2), source="s.yaml")
    [problem] = caught.value.problems
    assert problem.startswith("s.yaml: agents.finance-bot.hooks[0]")
    assert "editable needs quorum 1" in problem
    assert "decides alone" in problem


@pytest.mark.parametrize("field", ["api_token", "Password", "x-api-key", "clientSecret"])
def test_a_redacted_field_cannot_be_editable(field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_with_gate(editable=["amount", field]), source="s.yaml")
    [problem] = caught.value.problems
    assert problem.startswith("s.yaml: agents.finance-bot.hooks[0].editable[1]:")
    assert "is redacted" in problem


def test_an_agents_own_redact_words_count_for_editable() -> None:
    raw = _with_gate(editable=["amount", "iban"])
    raw["agents"]["finance-bot"]["redact"] = ["iban"]
    with pytest.raises(ConfigError, match=r"editable\[1\]: 'iban' is redacted"):
        parse_config(raw)


@pytest.mark.parametrize("editable", [["amount", "amount"], [""], ["x" * 101], "amount", [1]])
def test_bad_editable_values_are_refused(editable: Any) -> None:
    with pytest.raises(ConfigError, match=r"hooks\[0\]\.editable"):
        parse_config(_with_gate(editable=editable))


# --- approving with changes ----------------------------------------------------------------------


async def test_an_approval_with_changes_runs_the_changed_call(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    pending = (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()
    assert pending["editable"] == ["amount", "memo", "to"]

    answer = await decide(http, rid, arguments={"amount": 40000, "memo": "invoice 7"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["changes"] == [
        {"field": "amount", "proposed": 90000, "approved": 40000, "proposed_absent": False}
    ], "a field given its proposed value is no change"

    state = (await http.get(f"/v1/requests/{rid}/wait", headers=agent(agent_key))).json()
    assert state["status"] == "approved"
    assert state["approved_arguments"] == {
        "to": "acme",
        "amount": 40000,
        "memo": "invoice 7",
        "api_token": "[redacted]",
    }
    assert state["arguments"]["amount"] == 90000, "what was asked stays on record"

    # The agent asks again with its call (the idempotency key): it runs the approved one, with
    # its own values for everything the approver did not change, secrets included.
    replay = await ask(http, agent_key)
    assert replay["decision"] == "allow"
    assert replay["modified_arguments"] == {**CALL["arguments"], "amount": 40000}
    assert "with changes: amount → 40000" in replay["reason"]

    vote = next(e for e in await actions(runtime, rid) if e.action == "vote")
    assert vote.detail["arguments"] == {"proposed": {"amount": 90000}, "approved": {"amount": 40000}}
    approved = await row(runtime, rid)
    assert approved.approved_arguments is not None
    assert approved.approved_arguments["amount"] == 40000


@pytest.mark.parametrize(
    "body",
    [
        {"arguments": {"amount": 40000, "memo": "smaller"}},
        {"grant": {"scope": "session", "for": "1h"}},
        {},
        {"verdict": "reject", "reason": "not this month"},
    ],
    ids=["changes", "grant", "once", "reject"],
)
async def test_a_waiting_agent_is_answered_from_the_commit_as_a_read_after_it_shows_the_request(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, body: dict[str, Any]
) -> None:
    """The agent parked on the request is answered with what the deciding transaction read just
    before it committed (not read again): the same request, changes and grant as any read after."""
    rid = (await ask(http, agent_key))["request_id"]
    waiter = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent(agent_key))
    )
    await eventually(lambda: runtime.hub.waiting)
    assert (await decide(http, rid, **body)).status_code == 200
    waited = (await asyncio.wait_for(waiter, 10)).json()
    assert waited["status"] == body.get("verdict", "approve").replace("approve", "approved").replace(
        "reject", "rejected"
    )
    assert waited["receipt"] is not None
    assert waited == (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()


async def test_an_edit_that_changes_nothing_is_an_approval_as_asked(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    answer = await decide(http, rid, arguments={"amount": 90000, "to": "acme"})
    assert answer.status_code == 200
    assert answer.json()["changes"] == []
    assert answer.json()["approved_arguments"] is None
    replay = await ask(http, agent_key)
    assert (replay["decision"], replay["modified_arguments"]) == ("allow", None)


async def test_no_grant_goes_with_an_edit(http: httpx.AsyncClient, agent_key: str, runtime: Runtime) -> None:
    # A grant holds the proposed values: with it, a later call could run as proposed.
    rid = (await ask(http, agent_key))["request_id"]
    answer = await decide(http, rid, arguments={"amount": 5000}, grant={"scope": "agent", "for": "30m"})
    assert answer.status_code == 422, answer.text
    assert "a grant cannot be given with them" in answer.json()["detail"]
    async with runtime.sessions() as s:
        assert (await s.exec(select(Vote))).all() == []
    assert (await decide(http, rid, grant={"scope": "agent", "for": "30m"})).status_code == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"arguments": {"api_token": "tok-other"}}, "api_token cannot be changed"),
        ({"arguments": {"currency": "EUR"}}, "currency cannot be changed"),
        ({"arguments": {"amount": 2_000_000}}, "would also need the approval of the gate 'treasury'"),
        ({"arguments": {"to": "offshore"}}, "gate 'blocked routes'"),
        ({"arguments": {"memo": "sk-abcdefghijklmnopqrstuvwx"}}, "looks like a secret"),
        (
            {"arguments": {"to": "other"}, "grant": {"scope": "session", "for": "1h"}},
            "a grant cannot be given with them",
        ),
        ({"verdict": "reject", "arguments": {"amount": 1}}, "with an approval, not a rejection"),
    ],
)
async def test_a_change_the_gates_do_not_allow_is_a_422_and_changes_nothing(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, body: dict[str, Any], says: str
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    answer = await decide(http, rid, **body)
    assert answer.status_code == 422, answer.text
    assert says in answer.json()["detail"]
    state = (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()
    assert (state["status"], state["votes"], state["approved_arguments"]) == ("pending", [], None)
    assert [e.action for e in await actions(runtime, rid)] == ["created", "vote_refused"]
    async with runtime.sessions() as s:
        assert (await s.exec(select(Vote))).all() == []


async def test_a_value_shown_redacted_cannot_be_changed(http: httpx.AsyncClient, agent_key: str) -> None:
    call = {
        **CALL,
        "idempotency_key": "pay:bearer",
        "arguments": {**CALL["arguments"], "memo": "Authorization: Bearer abcdef0123456789"},
    }
    rid = (await ask(http, agent_key, call))["request_id"]
    answer = await decide(http, rid, arguments={"memo": "paid"})
    assert answer.status_code == 422
    assert "memo is redacted" in answer.json()["detail"]


@pytest.mark.parametrize(
    "arguments",
    [
        {"amount": "x" * 5000},
        {f"f{i}": i for i in range(21)},
        {"memo": "a\u0000b"},
        {"": 1},
        {"memo": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]},
    ],
)
async def test_edits_out_of_bounds_are_a_422_before_anything_is_read(
    http: httpx.AsyncClient, agent_key: str, arguments: dict[str, Any], runtime: Runtime
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    answer = await decide(http, rid, arguments=arguments)
    assert answer.status_code == 422
    assert [e.action for e in await actions(runtime, rid)] == ["created"]


async def test_a_gate_without_editable_fields_takes_no_changes(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    rid = (await ask(http, agent_key, {"tool_name": "fixed_fee", "arguments": {"amount": 3}}))["request_id"]
    answer = await decide(http, rid, arguments={"amount": 2})
    assert answer.status_code == 422
    assert "lets its approver change no arguments" in answer.json()["detail"]


async def test_a_request_that_needs_other_gates_too_takes_no_changes(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    call = {**CALL, "idempotency_key": "big", "arguments": {**CALL["arguments"], "amount": 3_000_000}}
    rid = (await ask(http, agent_key, call))["request_id"]
    answer = await decide(http, rid, arguments={"amount": 2_000_000})
    assert answer.status_code == 422
    assert "decides the request alone" in answer.json()["detail"]
    assert "'treasury'" in answer.json()["detail"]


# --- single use: the approved call is the changed one --------------------------------------------


def _mismatches() -> float:
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "signoff_executed_mismatches"
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("agent") == "finance-bot"
    )


async def test_running_the_proposed_call_after_an_edit_is_audited_as_a_mismatch(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    assert (await decide(http, rid, arguments={"amount": 40000})).status_code == 200
    before = _mismatches()
    report = {**CALL, "result": "paid"}  # the original arguments, not the approved ones
    assert (await http.post(POST, json=report, headers=agent(agent_key))).status_code == 200
    events = await actions(runtime, rid)
    mismatch = next(e for e in events if e.action == "executed_mismatch")
    assert mismatch.detail["approved"]["amount"] == 40000
    assert mismatch.detail["executed"]["amount"] == 90000
    assert mismatch.detail["executed"]["api_token"] == "[redacted]"
    assert _mismatches() == before + 1
    metrics = (await http.get("/metrics")).text
    assert 'signoff_executed_mismatches_total{agent="finance-bot"}' in metrics
    state = (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()
    assert state["executed_mismatch"] is True
    assert (await ask(http, agent_key))["decision"] == "deny", "the approval is used all the same"


async def test_running_the_approved_call_is_no_mismatch(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await ask(http, agent_key))["request_id"]
    assert (await decide(http, rid, arguments={"amount": 40000})).status_code == 200
    before = _mismatches()
    report = {**CALL, "arguments": {**CALL["arguments"], "amount": 40000}, "result": "paid"}
    assert (await http.post(POST, json=report, headers=agent(agent_key))).status_code == 200
    assert [e.action for e in await actions(runtime, rid)][-1] == "executed"
    assert _mismatches() == before
    state = (await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))).json()
    assert state["executed_mismatch"] is False
