"""Attacks on approve-with-edits, escalation, grants and single use, through the HTTP API.

Each test is an attempt to have a gated call allowed without the right people approving
exactly that call; each must fail (the call is refused, or it stays pending)."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, ConfirmationRequest
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PROPERTY = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"] += [
    {
        "type": "confirmation_gate",
        "name": "sends",
        "tools": ["send_*"],
        "when": "args.amount >= 1000",
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "editable": ["amount", "memo", "to"],
        "grants": [{"scope": "session", "for": "1h", "same": ["to"]}],
    },
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
        "name": "escalating",
        "tools": ["deploy_*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "escalate": [{"after": "10m", "channel": "chat", "approvers": ["carol"]}],
    },
]


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def agent(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def send(amount: Any = 90000, **extra: Any) -> dict[str, Any]:
    return {
        "tool_name": "send_payment",
        "arguments": {"to": "acme", "amount": amount, "memo": "invoice 7"},
        "session_id": "s-1",
        "idempotency_key": f"pay-{uuid.uuid4().hex}",
        **extra,
    }


async def pending(http: httpx.AsyncClient, key: str, call: dict[str, Any]) -> str:
    r = await http.post(PRE, json=call, headers=agent(key))
    assert r.json()["decision"] == "pending", r.text
    return str(r.json()["request_id"])


async def decide(http: httpx.AsyncClient, rid: str, **body: Any) -> httpx.Response:
    return await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": "alice", **body},
        headers=ADMIN,
    )


async def status(runtime: Runtime, rid: str) -> str:
    async with runtime.sessions() as s:
        req = (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid))).one()
        return str(req.status.value if hasattr(req.status, "value") else req.status)


async def actions(runtime: Runtime, rid: str) -> list[str]:
    async with runtime.sessions() as s:
        stmt = select(AuditEvent).where(col(AuditEvent.request_id) == rid).order_by(col(AuditEvent.seq))
        return [str(e.action) for e in (await s.exec(stmt)).all()]


async def age(runtime: Runtime, rid: str, by: timedelta) -> None:
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        (created,) = (await session.exec(sa.select(table.c.created_at).where(table.c.id == rid))).one()
        await session.exec(sa.update(table).where(table.c.id == rid).values(created_at=created - by))


# --- edits: escaping the stricter gate ------------------------------------------------------------

TREASURY_AMOUNTS = st.one_of(
    st.integers(min_value=1_000_000, max_value=10**40),
    st.floats(min_value=1_000_000, max_value=1e300, allow_nan=False, allow_infinity=False),
    st.integers(min_value=1_000_000, max_value=10**12).map(str),
    st.integers(min_value=1_000_000, max_value=10**12).map(lambda n: f"{n:.1e}"),
    st.integers(min_value=1_000_000, max_value=10**12).map(lambda n: {"value": n}),
    st.integers(min_value=1_000_000, max_value=10**12).map(lambda n: [n]),
    st.integers(min_value=1_000_000, max_value=10**12).map(lambda n: f"\uff11{n}"),
)


@PROPERTY
@given(amount=TREASURY_AMOUNTS)
async def test_an_edit_into_the_treasury_range_in_any_spelling_is_refused(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, amount: Any
) -> None:
    """The 'sends' approver may change the amount, but never into what 'treasury' (not asked)
    would catch: as int, float, huge int, numeric string, nested object or list."""
    rid = await pending(http, agent_key, send())
    r = await decide(http, rid, arguments={"amount": amount})
    if r.status_code == 200:
        # Accepted only if no spelling of the new value could be a treasury amount to a tool.
        pytest.fail(f"edit to {amount!r} accepted without the treasury gate: {r.text}")
    assert r.status_code == 422, r.text
    assert await status(runtime, rid) == "pending"


@PROPERTY
@given(name=st.sampled_from(["Amount", "amount ", "\u0430mount", "amount\u200b", "AMOUNT", "api_token"]))
async def test_an_edit_to_a_field_not_named_editable_is_refused(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, name: str
) -> None:
    rid = await pending(http, agent_key, send())
    r = await decide(http, rid, arguments={name: 5})
    assert r.status_code == 422, r.text
    assert await status(runtime, rid) == "pending"


async def test_an_edit_with_a_grant_holding_that_field_equal_is_refused(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = await pending(http, agent_key, send())
    r = await decide(http, rid, arguments={"to": "mallory"}, grant={"scope": "session", "for": "1h"})
    assert r.status_code == 422, r.text
    assert await status(runtime, rid) == "pending"


# --- edits then replay ----------------------------------------------------------------------------


async def test_after_an_edit_the_original_call_runs_only_as_approved_and_once(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """The agent replays with the arguments it proposed: it is told to run the approved ones;
    running the original anyway is audited as a mismatch and uses the approval up."""
    call = send()
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid, arguments={"amount": 1200})).status_code == 200
    replay = (await http.post(PRE, json=call, headers=agent(agent_key))).json()
    assert replay["decision"] == "allow"
    assert replay["modified_arguments"]["amount"] == 1200
    # The approved arguments under the same key are a different call: refused.
    edited = {**call, "arguments": {**call["arguments"], "amount": 1200}}
    assert (await http.post(PRE, json=edited, headers=agent(agent_key))).json()["decision"] == "deny"
    ran = await http.post(POST, json={**call, "result": "paid"}, headers=agent(agent_key))
    assert ran.status_code == 200, ran.text
    assert "executed_mismatch" in " ".join(await actions(runtime, rid))
    again = (await http.post(PRE, json=call, headers=agent(agent_key))).json()
    assert again["decision"] == "deny", again


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


async def test_a_session_grant_does_not_follow_the_agent_into_another_session(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    rid = await pending(http, agent_key, send())
    r = await decide(http, rid, grant={"scope": "session", "for": "1h"})
    assert r.status_code == 200, r.text
    same = (await http.post(PRE, json=send(), headers=agent(agent_key))).json()
    assert same["decision"] == "allow", same
    for session_id in ("s-2", "S-1", "s-1 ", None):
        other = (await http.post(PRE, json=send(session_id=session_id), headers=agent(agent_key))).json()
        assert other["decision"] != "allow", (session_id, other)
    # Another destination is not held equal: not covered either.
    moved = send()
    moved["arguments"]["to"] = "mallory"
    assert (await http.post(PRE, json=moved, headers=agent(agent_key))).json()["decision"] != "allow"


# --- escalation -----------------------------------------------------------------------------------


def deploy() -> dict[str, Any]:
    return {
        "tool_name": "deploy_prod",
        "arguments": {"ref": "v1"},
        "user_id": "U_CAROL",
        "session_id": "s-9",
        "idempotency_key": f"deploy-{uuid.uuid4().hex}",
    }


async def test_an_escalation_approver_cannot_decide_through_the_operator_api_before_their_time(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    call = {**deploy(), "user_id": "U_BOB"}
    rid = await pending(http, agent_key, call)
    r = await decide(http, rid, operator="carol")
    assert r.status_code in (403, 409, 422), r.text
    assert await status(runtime, rid) == "pending"
    await age(runtime, rid, timedelta(minutes=11))
    assert (await decide(http, rid, operator="carol")).status_code == 200


async def test_the_requester_cannot_approve_their_own_call_once_it_escalates_to_them(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = await pending(http, agent_key, deploy())
    await age(runtime, rid, timedelta(minutes=11))
    for operator in ("carol", "Carol", "CAROL"):
        r = await decide(http, rid, operator=operator)
        assert r.status_code in (403, 409, 422), r.text
    assert await status(runtime, rid) == "pending"


# --- edits: a stricter gate reading a redacted metadata value --------------------------------------

METADATA_CONFIG: dict[str, Any] = copy.deepcopy(CONFIG)
# Before 'sends' in the chain: on the replay it sees the call as proposed, not as approved.
METADATA_CONFIG["agents"]["finance-bot"]["hooks"].insert(
    0,
    {
        "type": "confirmation_gate",
        "name": "live money",
        "tools": ["send_*"],
        "when": "args.amount >= 5000 && has(metadata.api_token) && metadata.api_token == 'live'",
        "channel": "chat",
        "approvers": ["carol"],
        "timeout": "30m",
    },
)


@pytest.mark.parametrize("config", [parse_config(METADATA_CONFIG, source="test.yaml")])
async def test_an_edit_into_a_gate_reading_redacted_metadata_is_refused(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, config: SignoffConfig
) -> None:
    """The stored request shows ``metadata.api_token`` redacted, so whether 'live money' would
    catch the changed call is not known: the edit is refused (fail closed), not waved through."""
    call = send(amount=2000, metadata={"api_token": "live"})
    rid = await pending(http, agent_key, call)
    r = await decide(http, rid, arguments={"amount": 6000})
    assert r.status_code == 422, r.text
    assert await status(runtime, rid) == "pending"
    assert "api_token" in r.json()["detail"] or "live money" in r.text
    replay = (await http.post(PRE, json=call, headers=agent(agent_key))).json()
    assert replay["decision"] == "pending", replay


# --- edits beside another gate; grants after revoke -----------------------------------------------


@pytest.mark.parametrize("operator", ["alice", "carol"])
async def test_an_edit_cannot_decide_a_request_another_gate_still_waits_on(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, operator: str
) -> None:
    """2,000,000 asks 'sends' (alice) and 'treasury' (carol): neither may edit it down, since
    neither approval decides the request alone."""
    rid = await pending(http, agent_key, send(amount=2_000_000))
    r = await decide(http, rid, operator=operator, arguments={"amount": 1500})
    assert r.status_code == 422, r.text
    assert await status(runtime, rid) == "pending"


async def test_a_revoked_grant_allows_nothing_and_its_request_key_is_single_use(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    call = send()
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid, grant={"scope": "session", "for": "1h"})).status_code == 200
    assert (await http.post(PRE, json=send(), headers=agent(agent_key))).json()["decision"] == "allow"
    [grant] = (await http.get("/v1/admin/grants", params={"active": "true"}, headers=ADMIN)).json()
    assert (await http.delete(f"/v1/admin/grants/{grant['id']}", headers=ADMIN)).status_code == 200
    after = (await http.post(PRE, json=send(), headers=agent(agent_key))).json()
    assert after["decision"] == "pending", after
    # The request it was given with still allows its own call once, then no more.
    assert (await http.post(PRE, json=call, headers=agent(agent_key))).json()["decision"] == "allow"
    assert (await http.post(POST, json={**call, "result": "ok"}, headers=agent(agent_key))).status_code == 200
    assert (await http.post(PRE, json=call, headers=agent(agent_key))).json()["decision"] == "deny"


@pytest.mark.parametrize("config", [parse_config(METADATA_CONFIG, source="test.yaml")])
async def test_a_replay_whose_metadata_reaches_a_gate_not_asked_is_denied(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    """Same key, same arguments, other metadata: the replay now reaches 'live money', which
    never approved it."""
    call = send(amount=6000)
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    live = {**call, "metadata": {"api_token": "live"}}
    replay = (await http.post(PRE, json=live, headers=agent(agent_key))).json()
    assert replay["decision"] == "deny", replay
    assert (await http.post(PRE, json=call, headers=agent(agent_key))).json()["decision"] == "allow"


@pytest.mark.parametrize("config", [parse_config(METADATA_CONFIG, source="test.yaml")])
async def test_an_edited_approval_replayed_with_other_metadata_does_not_pass_a_gate_it_reaches(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    """The edit to 6000 was checked against the call as asked (no live token). Replayed under
    the same key with the live token, the call as approved reaches 'live money' (which runs
    before 'sends' and so sees only the proposed 2000): it is denied, not allowed."""
    call = send(amount=2000)
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid, arguments={"amount": 6000})).status_code == 200
    live = {**call, "metadata": {"api_token": "live"}}
    replay = (await http.post(PRE, json=live, headers=agent(agent_key))).json()
    assert replay["decision"] == "deny", replay
    assert "live money" in replay["reason"], replay
    as_asked = (await http.post(PRE, json=call, headers=agent(agent_key))).json()
    assert as_asked["decision"] == "allow", as_asked
    assert as_asked["modified_arguments"]["amount"] == 6000


# --- Slack: a view_submission whose private_metadata was forged -----------------------------------

from tests.channels.conftest import (  # noqa: E402, F401  (fixtures)
    _no_proxy,
    fake_slack,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack  # noqa: E402
from tests.channels.test_edit_choices import (  # noqa: E402
    SLACK,
    open_modal,
    posted_buttons,
    pre,
    slack_gates,  # noqa: F401  (fixture: the edit gates slack_server runs)
    state,
    submission,
)
from tests.conftest import Server  # noqa: E402

FORGED = st.sampled_from(
    [
        # a field the gate does not list, or that is redacted, typed into a forged input
        {"fields": [["to", "text"]], "typed": "mallory"},
        {"fields": [["api_token", "text"]], "typed": "tok-mine"},
        {"fields": [["amount", "json"]], "typed": "2000000"},
        # the card's channel said to be another conversation
        {"channel_id": "C0OTHER", "fields": [["amount", "json"]], "typed": "5"},
        # another request's id
        {"request_id": "0" * 32, "fields": [["amount", "json"]], "typed": "5"},
    ]
)


@PROPERTY
@given(forged=FORGED)
async def test_a_forged_slack_edit_modal_changes_nothing(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    forged: dict[str, Any],
) -> None:
    """Whatever the modal's metadata claims (fields, channel, request), the server decides by
    the request and the gates: the call stays pending, or the edit is refused."""
    _server, http = slack_server
    call_answer = await pre(http, agent_key)
    rid = call_answer["request_id"]
    assert call_answer["decision"] == "pending", call_answer
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    metadata = json.loads(view["private_metadata"])
    metadata.update({k: v for k, v in forged.items() if k != "typed"})
    view = {**view, "private_metadata": json.dumps(metadata)}
    inputs = [b for b in view["blocks"] if b["type"] == "input"]
    typed = {i: (forged["typed"] if i == 0 else None) for i in range(len(inputs))}
    body, headers = submission(view, "W0ALICE", typed)
    await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    shown = await state(http, agent_key, rid)
    assert shown["status"] == "pending", shown
