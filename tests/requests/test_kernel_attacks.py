"""The decision kernel's order, attacked through the real HTTP endpoints (DESIGN: "Order of
answers"): a key whose request is decided answers from that request before any grant, and a
late answer (a gate that timed out while a held database kept it waiting) is never the
answer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DEFAULT_CONFIG, _truncate
from tests.requests.support import ADMIN, PRE, Served, Stall, serving

AGENT = "finance-bot"
FINANCE: dict[str, Any] = {
    "type": "confirmation_gate",
    "name": "finance",
    "tools": ["pay_*"],
    "channel": "chat",
    "approvers": ["alice", "bob"],
    "editable": ["amount"],
    "grants": [{"scope": "session", "for": "1h", "same": ["to"]}],
}
SECURITY: dict[str, Any] = {
    "type": "confirmation_gate",
    "name": "security",
    "tools": ["pay_*"],
    "channel": "chat",
    "approvers": ["carol"],
}
CALL: dict[str, Any] = {
    "tool_name": "pay_invoice",
    "arguments": {"to": "acme", "amount": 90000},
    "session_id": "s-1",
}
TIME_LIMIT = 0.2
"""Seconds each hook may take while a stall holds the database for :data:`HELD`."""
HELD = 1.0


def gated(*gates: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(DEFAULT_CONFIG)
    data["agents"][AGENT] = {"hooks": [copy.deepcopy(g) for g in gates]}
    return data


async def ask(served: Served, key: str, **changes: Any) -> dict[str, Any]:
    r = await served.http.post(
        PRE, json={**CALL, "idempotency_key": key, **changes}, headers=served.agent_headers
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def decide(served: Served, rid: str, operator: str, **body: Any) -> httpx.Response:
    return await served.http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": operator, **body},
        headers=ADMIN,
    )


async def pending(served: Served, key: str) -> str:
    answer = await ask(served, key)
    assert answer["decision"] == "pending", answer
    return str(answer["request_id"])


async def test_an_approval_with_changes_and_a_grant_runs_as_approved(db_url: str, tmp_path: Path) -> None:
    """Approved with the amount changed and a session grant in one vote: the key's own request
    answers its replay, with the approved arguments; no grant lets the call run as proposed."""
    async with serving(db_url, tmp_path / "signoff.yaml", gated(FINANCE), AGENT) as served:
        rid = await pending(served, "pay-1")
        vote = await decide(
            served,
            rid,
            "alice",
            arguments={"amount": 40000},
            grant={"scope": "session", "for": "1h", "same": ["to"]},
        )
        replay = await ask(served, "pay-1")
        if vote.status_code == 200:
            assert replay["decision"] == "allow", replay
            assert replay["modified_arguments"] == {"to": "acme", "amount": 40000}, replay
        else:  # refusing the vote is as good: nothing was approved
            assert vote.status_code in (409, 422), vote.text
            assert replay["decision"] == "pending", replay
        fresh = await ask(served, "pay-2")
        assert fresh["decision"] != "allow" or fresh["modified_arguments"] == {
            "to": "acme",
            "amount": 40000,
        }, (
            "a grant from an approval with changes let the call run as proposed",
            fresh,
        )


async def test_a_rejected_call_stays_rejected_whatever_grant_comes_later(db_url: str, tmp_path: Path) -> None:
    async with serving(db_url, tmp_path / "signoff.yaml", gated(FINANCE), AGENT) as served:
        rejected = await pending(served, "pay-1")
        vote = await decide(served, rejected, "alice", verdict="reject", reason="not this one")
        assert vote.status_code == 200, vote.text
        # The same call under another key, approved with a grant covering the session.
        granting = await pending(served, "pay-2")
        vote = await decide(served, granting, "bob", grant={"scope": "session", "for": "1h", "same": ["to"]})
        assert vote.status_code == 200, vote.text
        assert (await ask(served, "pay-3"))["decision"] == "allow", "the grant covers new calls"

        replay = await ask(served, "pay-1")
        assert replay["decision"] == "deny", replay
        assert replay["request_id"] == rejected, replay


@pytest.mark.postgres
async def test_a_gate_timing_out_on_a_held_database_denies_the_whole_call(
    db_url: str, tmp_path: Path
) -> None:
    """An approved call's replay, once a reload added a gate its request never asked: held up
    on the database, the first gate times out; whatever its late answer, the call is denied
    (or answered 503), and the gate added since is never skipped."""
    async with serving(db_url, tmp_path / "signoff.yaml", gated(FINANCE), AGENT) as served:
        rid = await pending(served, "pay-1")
        assert (await decide(served, rid, "alice")).status_code == 200
        assert (await ask(served, "pay-1"))["decision"] == "allow"
        await served.reload(gated(FINANCE, SECURITY))
        assert (await ask(served, "pay-1"))["decision"] == "deny", "security was never asked"

        served.hook_time_limit(AGENT, TIME_LIMIT)
        async with Stall(db_url, HELD, table="confirmation_request"):
            r = await served.http.post(
                PRE, json={**CALL, "idempotency_key": "pay-1"}, headers=served.agent_headers
            )
        assert r.status_code == 503 or r.json()["decision"] == "deny", r.text


@pytest.fixture
def postgres_only(postgres_url: str) -> str:
    _truncate(postgres_url)
    return postgres_url


@pytest.mark.postgres
async def test_a_grant_read_held_up_never_stands_in_for_another_gate(
    postgres_only: str, tmp_path: Path
) -> None:
    """Finance's grant covers the call, security's approval does not: with the grants table
    locked by another connection, finance times out reading it; the late grant is not the
    answer for security too (PostgreSQL: SQLite's readers are never held up)."""
    url = postgres_only
    async with serving(url, tmp_path / "signoff.yaml", gated(FINANCE, SECURITY), AGENT) as served:
        rid = await pending(served, "pay-1")
        granted = await decide(served, rid, "alice", grant={"scope": "session", "for": "1h", "same": ["to"]})
        assert granted.status_code == 200, granted.text
        assert (await decide(served, rid, "carol")).status_code == 200
        asks = await ask(served, "pay-2")
        assert asks["decision"] == "pending", "security still asks"
        assert [g["name"] for g in asks["request"]["gates"]] == ["security"], asks

        served.hook_time_limit(AGENT, TIME_LIMIT)
        async with Stall(url, HELD, table="approval_grant"):
            r = await served.http.post(
                PRE, json={**CALL, "idempotency_key": "pay-3"}, headers=served.agent_headers
            )
        assert r.status_code == 503 or r.json()["decision"] in ("deny", "pending"), r.text
