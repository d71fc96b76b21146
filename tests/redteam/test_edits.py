"""Attacks on approving with changes, through the HTTP API: an edit may change only the fields
the gate names, never into what a stricter gate would catch, never past a gate that still waits
or one that reads a redacted value; the call then runs only as approved, once, and a replay
that reaches another gate through its metadata is denied."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.redteam.support import (
    CONFIG,
    POST,
    PRE,
    actions,
    agent,
    attack_config,
    decide,
    pending,
    property_test,
    send,
    status,
)

PROPERTY = property_test(25)


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


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
