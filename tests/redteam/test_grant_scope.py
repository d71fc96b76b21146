"""A grant covers the tool it was given for as named, in the session or agent it names, with its
``same`` fields equal by canonical JSON, while it is active; attempts to stretch it past any of
these, through the real server, allow nothing."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sqlmodel import func, select

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.models import Grant
from signoff.app.requests import grants
from signoff.app.runtime import Runtime
from tests.redteam.support import (
    ADMIN,
    MCP_TOOL,
    POST,
    PRE,
    agent,
    ask,
    attack_config,
    decide,
    pending,
    property_test,
    send,
)

PROPERTY = property_test(20)


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


async def _granted(http: httpx.AsyncClient, key: str, call: dict[str, Any], grant: dict[str, Any]) -> str:
    rid = (await ask(http, key, call))["request_id"]
    r = await decide(http, rid, grant=grant)
    assert r.status_code == 200, r.text
    return str(r.json()["grant"]["id"])


_CONFUSABLE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "i": "\u0456", "u": "\u057d"}
SPELLINGS = st.one_of(
    st.sampled_from(
        [
            "MCP__github__create_issue",
            "mcp__GitHub__create_issue",
            "mcp_github__create_issue",
            "mcp__github_create_issue",
            "mcp__github__create_issue ",
            " mcp__github__create_issue",
            "mcp__github__create-issue",
            "mcp__github__create_issues",
            "mcp__\uff47ithub__create_issue",
        ]
    ),
    st.builds(
        lambda at, char: MCP_TOOL[:at] + char + MCP_TOOL[at:],
        st.integers(0, len(MCP_TOOL)),
        st.sampled_from(["\u200b", "\u2060", "\ufeff", "\u200e", "\u00ad"]),
    ),
    st.builds(
        lambda at: MCP_TOOL[:at] + _CONFUSABLE.get(MCP_TOOL[at], MCP_TOOL[at].upper()) + MCP_TOOL[at + 1 :],
        st.integers(0, len(MCP_TOOL) - 1),
    ),
)


@PROPERTY
@given(spelling=SPELLINGS)
async def test_an_agent_grant_covers_its_tool_as_named_and_no_other_spelling(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, spelling: str
) -> None:
    """Every spelling the gate still catches asks again; none is allowed by the grant."""
    assume(spelling != MCP_TOOL)
    async with runtime.sessions() as s:
        given_already = (await s.exec(select(func.count()).select_from(Grant))).one()
    if not given_already:
        first = {"tool_name": MCP_TOOL, "arguments": {"title": "x"}}
        await _granted(http, agent_key, first, {"scope": "agent", "for": "1h"})
    exact = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "y"}})
    assert exact["decision"] == "allow"
    assert exact["grant_id"] is not None
    other = await ask(http, agent_key, {"tool_name": spelling, "arguments": {"title": "y"}})
    assert other["grant_id"] is None, (spelling, other)
    assert "grant" not in (other["reason"] or ""), (spelling, other)
    [gate] = [g for key, g in runtime.config.confirmation_gates("finance-bot") if key == "github"]
    if gate.matches_tool(spelling):
        assert other["decision"] == "pending", (spelling, other)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab1", max_size=3),
    lambda inner: st.dictionaries(st.text("xyz", min_size=1, max_size=2), inner, min_size=1, max_size=4),
    max_leaves=6,
).filter(lambda v: isinstance(v, dict) and len(v) > 1)


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    return value


@settings(PROPERTY, max_examples=10)
@given(to=JSON_VALUES)
async def test_a_same_field_holds_by_canonical_json_whatever_the_key_order(
    http: httpx.AsyncClient, agent_key: str, to: dict[str, Any]
) -> None:
    """The approved ``to`` sent again with its keys in another order is the same value; with
    one value changed (or given another type) it is not."""
    session = f"s-{uuid.uuid4().hex}"

    def transfer(value: Any) -> dict[str, Any]:
        return {"tool_name": "transfer_funds", "arguments": {"to": value, "n": 1}, "session_id": session}

    await _granted(http, agent_key, transfer(to), {"scope": "session", "for": "1h"})
    assert (await ask(http, agent_key, transfer(_reordered(to))))["decision"] == "allow"
    first = next(iter(to))
    changed = {**to, first: [to[first]]}
    assert (await ask(http, agent_key, transfer(changed)))["decision"] == "pending"


@pytest.mark.postgres
async def test_a_grant_revoked_between_its_look_up_and_its_use_allows_nothing(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call finds the grant active; the operator revokes it before the answer counts its
    use; the answer is a deny, and no use is counted."""
    grant_id = await _granted(
        http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "x"}}, {"scope": "agent", "for": "1h"}
    )
    found = grants.find_for_call

    async def found_then_revoked(*args: Any, **kwargs: Any) -> dict[str, Grant]:
        result = await found(*args, **kwargs)
        async with transaction(runtime.sessions) as session:
            for grant in result.values():
                await grants.revoke(session, grant.id, actor=Actor("api", "bob", "Bob"))
        return result

    monkeypatch.setattr(grants, "find_for_call", found_then_revoked)
    answer = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "y"}})
    assert answer["decision"] == "deny", answer
    assert grant_id in answer["reason"]
    monkeypatch.undo()
    [shown] = (await http.get("/v1/admin/grants", headers=ADMIN)).json()
    assert (shown["uses"], shown["active"]) == (0, False)
    after = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "z"}})
    assert after["decision"] == "pending"


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
