"""Grants through the HTTP API: given with an approval (operator API),
used by later calls (pre-tool-use), listed and revoked (operator API), never wider than given."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, Grant, Vote, utcnow
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG

PRE = "/v1/hooks/pre-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

TRANSFERS: dict[str, Any] = {
    "type": "confirmation_gate",
    "name": "transfers",
    "tools": ["transfer_*"],
    "channel": "chat",
    "approvers": ["alice", "bob"],
    "timeout": "30m",
    "grants": [{"scope": "session", "for": "1h", "same": ["to"]}, {"scope": "agent", "for": "30m"}],
}
CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"] += [
    TRANSFERS,
    {
        "type": "confirmation_gate",
        "name": "treasury",
        "tools": ["transfer_*"],
        "when": "has(args.amount) && args.amount >= 1000000",
        "channel": "chat",
        "approvers": ["carol"],
        "timeout": "30m",
    },
    {
        "type": "confirmation_gate",
        "name": "dual",
        "tools": ["move_*"],
        "channel": "chat",
        "approvers": ["alice", "bob", "carol"],
        "quorum": 2,
        "timeout": "30m",
        "grants": [{"scope": "session", "for": "2h", "same": ["to"]}, {"scope": "agent", "for": "1h"}],
    },
]
CONFIG["agents"]["second-bot"] = {"hooks": [TRANSFERS]}


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="grants.yaml")


@pytest.fixture
async def second_key(runtime: Runtime) -> str:
    from signoff.app.audit import Actor
    from signoff.app.keys import create_key

    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, "second-bot", actor=Actor("test"))
    return token


def call(tool: str = "transfer_funds", session: str | None = "s-1", **arguments: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"tool_name": tool, "arguments": {"to": "acme", "amount": 10, **arguments}}
    if session is not None:
        body["session_id"] = session
    return body


async def ask(http: httpx.AsyncClient, key: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(PRE, json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def decide(
    http: httpx.AsyncClient, rid: str, grant: dict[str, Any] | None, operator: str = "alice"
) -> httpx.Response:
    body: dict[str, Any] = {"verdict": "approve", "operator": operator}
    if grant is not None:
        body["grant"] = grant
    return await http.post(f"/v1/admin/requests/{rid}/decision", json=body, headers=ADMIN)


async def granted(
    http: httpx.AsyncClient, key: str, grant: dict[str, Any], body: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """A call approved with ``grant``: its request id and the grant as the request shows it."""
    first = await ask(http, key, body or call())
    assert first["decision"] == "pending", first
    d = await decide(http, first["request_id"], grant)
    assert d.status_code == 200, d.text
    shown = (
        await http.get(f"/v1/requests/{first['request_id']}", headers={"Authorization": f"Bearer {key}"})
    ).json()
    assert shown["grant"] is not None, shown
    return first["request_id"], shown["grant"]


async def actions(runtime: Runtime) -> list[str]:
    async with runtime.sessions() as s:
        return list((await s.exec(select(AuditEvent.action).order_by(col(AuditEvent.seq)))).all())


async def test_a_session_grant_allows_the_sessions_later_calls_and_nothing_else(
    http: httpx.AsyncClient, agent_key: str, second_key: str, runtime: Runtime
) -> None:
    rid, grant = await granted(http, agent_key, {"scope": "session", "for": "1h"})
    assert (grant["scope"], grant["session_id"], grant["same"]) == ("session", "s-1", {"to": "acme"})
    assert grant["granted_by"] == "Alice"
    assert grant["active"] is True
    assert grant["request_id"] == rid

    later = await ask(http, agent_key, call(amount=999, note="another payment"))
    assert later["decision"] == "allow", later
    assert later["grant_id"] == grant["id"]
    assert grant["id"] in later["reason"]
    assert "Alice" in later["reason"]
    assert later["request_id"] is None

    # Anything the grant was not given for asks again.
    for body in (
        call(session="s-2"),  # another session
        call(session=None),  # no session at all
        call(to="evil"),  # another value of a field held equal
        call(tool="transfer_all"),  # another tool the same gate covers
        call(tool="Transfer_Funds"),  # the same tool to the gate (its key), another to the grant
        call(tool="transfer_fund\u0455"),  # a Cyrillic look-alike s
        call(tool="transfer_funds\u200b"),  # a zero-width space
    ):
        answer = await ask(http, agent_key, body)
        assert answer["decision"] == "pending", (body, answer)
        assert answer.get("grant_id") is None
    other_agent = await ask(http, second_key, call())
    assert other_agent["decision"] == "pending", "a grant of one agent never allows another"

    listed = (await http.get("/v1/admin/grants", params={"active": "true"}, headers=ADMIN)).json()
    assert [(g["id"], g["uses"]) for g in listed] == [(grant["id"], 1)]
    events = await actions(runtime)
    assert events.count("grant_created") == 1
    assert events.count("grant_used") == 1
    async with runtime.sessions() as s:
        used = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "grant_used"))).one()
    assert used.detail["grant"] == grant["id"]
    assert used.detail["session_id"] == "s-1"
    assert used.actor_channel == "agent"
    assert used.actor_id == "finance-bot"


async def test_an_agent_grant_covers_every_session_of_that_agent(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    _, grant = await granted(http, agent_key, {"scope": "agent", "for": 1800})
    assert grant["session_id"] is None
    assert grant["same"] == {}
    for body in (call(session="s-9", to="anyone"), call(session=None)):
        answer = await ask(http, agent_key, body)
        assert (answer["decision"], answer["grant_id"]) == ("allow", grant["id"])
    assert (await ask(http, agent_key, call(tool="transfer_all")))["decision"] == "pending"


@pytest.mark.parametrize(
    "grant",
    [
        {"scope": "agent", "for": "1h"},  # a scope and time the gate does not offer together
        {"scope": "session", "for": "2h"},
        {"scope": "session", "for": "1h", "same": []},  # fewer fields held equal than offered
        {"scope": "session", "for": "1h", "same": ["to", "amount"]},
    ],
)
async def test_a_grant_the_gate_does_not_offer_is_refused_and_nothing_changes(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, grant: dict[str, Any]
) -> None:
    rid = (await ask(http, agent_key, call()))["request_id"]
    refused = await decide(http, rid, grant)
    assert refused.status_code == 409, refused.text
    assert "offer" in refused.json()["detail"]
    state = (await http.get(f"/v1/admin/requests/{rid}", headers=ADMIN)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    assert (await http.get("/v1/admin/grants", headers=ADMIN)).json() == []


@pytest.mark.parametrize(
    "grant",
    [
        {"scope": "forever", "for": "1h"},
        {"scope": "session", "for": "soon"},
        {"scope": "session", "for": True},
        {"scope": "session", "for": -5},
        {"scope": "session", "for": 10**30},
        {"scope": "session", "for": "99999999999999999999d"},
        {"scope": "session", "for": "1h", "extra": 1},
        {"scope": "session"},
    ],
)
async def test_a_malformed_grant_is_422(
    http: httpx.AsyncClient, agent_key: str, grant: dict[str, Any]
) -> None:
    rid = (await ask(http, agent_key, call()))["request_id"]
    assert (await decide(http, rid, grant)).status_code == 422
    assert (await http.get(f"/v1/admin/requests/{rid}", headers=ADMIN)).json()["status"] == "pending"


async def test_a_gate_without_grants_and_a_non_approver_cannot_give_one(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await ask(http, agent_key, {"tool_name": "pay_invoice", "arguments": {"amount": 60000}}))[
        "request_id"
    ]
    no_grants = await decide(http, rid, {"scope": "session", "for": "1h"})
    assert no_grants.status_code == 409
    assert "no grants" in no_grants.json()["detail"]

    rid = (await ask(http, agent_key, call()))["request_id"]
    stranger = await decide(http, rid, {"scope": "session", "for": "1h"}, operator="carol")
    assert stranger.status_code == 409
    assert "not an approver" in stranger.json()["detail"]
    reject = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "reject", "operator": "alice", "grant": {"scope": "session", "for": "1h"}},
        headers=ADMIN,
    )
    assert reject.status_code == 409
    assert "approval" in reject.json()["detail"]
    state = (await http.get(f"/v1/admin/requests/{rid}", headers=ADMIN)).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
    assert "grant_created" not in await actions(runtime)


async def test_a_session_grant_needs_a_call_that_names_its_session(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    rid = (await ask(http, agent_key, call(session=None)))["request_id"]
    refused = await decide(http, rid, {"scope": "session", "for": "1h"})
    assert refused.status_code == 409
    assert "names no session" in refused.json()["detail"]


async def test_a_revoked_grant_never_allows_again(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    _, grant = await granted(http, agent_key, {"scope": "session", "for": "1h"})
    assert (await ask(http, agent_key, call()))["decision"] == "allow"
    revoked = await http.delete(f"/v1/admin/grants/{grant['id']}", params={"operator": "bob"}, headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["active"] is False
    assert revoked.json()["revoked_by"] == "bob"
    assert (await ask(http, agent_key, call()))["decision"] == "pending"
    again = await http.delete(f"/v1/admin/grants/{grant['id']}", headers=ADMIN)
    assert again.status_code == 409
    assert "already revoked" in again.json()["detail"]
    assert (await http.delete("/v1/admin/grants/nope", headers=ADMIN)).status_code == 404
    assert (await http.get("/v1/admin/grants", params={"active": "true"}, headers=ADMIN)).json() == []
    inactive = (await http.get("/v1/admin/grants", params={"active": "false"}, headers=ADMIN)).json()
    assert [g["id"] for g in inactive] == [grant["id"]]
    events = await actions(runtime)
    assert events.count("grant_revoked") == 1
    assert events.count("grant_used") == 1


@pytest.mark.postgres
async def test_an_expired_grant_never_allows(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    _, grant = await granted(http, agent_key, {"scope": "agent", "for": "30m"})
    async with transaction(runtime.sessions) as s:
        await s.exec(
            sa.update(Grant)
            .where(col(Grant.id) == grant["id"])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    assert (await ask(http, agent_key, call()))["decision"] == "pending"
    assert (await http.get("/v1/admin/grants", params={"active": "true"}, headers=ADMIN)).json() == []


async def test_with_a_quorum_the_narrowest_choice_applies(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    first = await ask(http, agent_key, call(tool="move_funds"))
    rid = first["request_id"]
    assert (await decide(http, rid, {"scope": "agent", "for": "1h"}, "bob")).status_code == 200
    assert (await decide(http, rid, {"scope": "session", "for": "2h"}, "alice")).status_code == 200
    shown = (await http.get(f"/v1/admin/requests/{rid}", headers=ADMIN)).json()
    assert shown["status"] == "approved"
    assert sorted((v["name"], v["grant"]["scope"]) for v in shown["votes"]) == [
        ("Alice", "session"),
        ("Bob", "agent"),
    ]
    grant = shown["grant"]
    # The narrowest of the two: alice's session and its field, bob's shorter time.
    assert (grant["scope"], grant["same"]) == ("session", {"to": "acme"})
    lasts = _seconds(grant["expires_at"]) - _seconds(shown["decided_at"])
    assert abs(lasts - 3600) < 1
    assert "Alice" in grant["granted_by"]
    assert "Bob" in grant["granted_by"]

    # One approval once among them: the approval is once.
    rid = (await ask(http, agent_key, call(tool="move_other")))["request_id"]
    assert (await decide(http, rid, {"scope": "agent", "for": "1h"}, "bob")).status_code == 200
    assert (await decide(http, rid, None, "carol")).status_code == 200
    again = (await http.get(f"/v1/admin/requests/{rid}", headers=ADMIN)).json()
    assert again["status"] == "approved"
    assert again["grant"] is None
    async with runtime.sessions() as s:
        assert len((await s.exec(select(Grant))).all()) == 1
        choices = (await s.exec(select(Vote.grant_choice).where(col(Vote.request_id) == rid))).all()
    assert sorted(c["scope"] if c else "once" for c in choices) == ["agent", "once"]


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def test_a_grant_stands_in_for_its_own_gate_only(http: httpx.AsyncClient, agent_key: str) -> None:
    await granted(http, agent_key, {"scope": "session", "for": "1h"})
    big = call(amount=5_000_000)  # matches transfers (granted) and treasury (not)
    big["idempotency_key"] = "big-1"
    pending = await ask(http, agent_key, big)
    assert pending["decision"] == "pending", pending
    assert [g["name"] for g in pending["request"]["gates"]] == ["treasury"]
    approved = await decide(http, pending["request_id"], None, "carol")
    assert approved.status_code == 200, approved.text
    replay = await ask(http, agent_key, big)
    assert replay["decision"] == "allow", replay
    assert replay["request_id"] == pending["request_id"]
    assert replay["grant_id"]
    assert "Carol" in replay["reason"]
    assert "grant" in replay["reason"]


async def test_a_grant_never_covers_a_call_made_for_its_grantor(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    rid = (await ask(http, agent_key, {**call(), "user_id": "alice"}))["request_id"]
    assert (await decide(http, rid, {"scope": "agent", "for": "30m"}, "bob")).status_code == 200
    assert (await ask(http, agent_key, {**call(), "user_id": "alice"}))["decision"] == "allow"
    for spelling in ("bob", " BOB ", "U_BOB"):
        own = await ask(http, agent_key, {**call(), "user_id": spelling})
        assert own["decision"] == "pending", (spelling, own)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("approved", "later"),
    [(1, "1"), (1, 1.0), (1, True), ("café", "cafe\u0301"), ({"a": 1}, {"a": "1"}), (None, "")],
)
async def test_same_fields_compare_type_and_text_exactly(
    http: httpx.AsyncClient, agent_key: str, approved: Any, later: Any
) -> None:
    await granted(http, agent_key, {"scope": "session", "for": "1h"}, call(to=approved))
    assert (await ask(http, agent_key, call(to=approved)))["decision"] == "allow"
    assert (await ask(http, agent_key, call(to=later)))["decision"] == "pending"


async def test_a_field_absent_from_the_approved_call_must_stay_absent(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    body = {"tool_name": "transfer_funds", "arguments": {"amount": 1}, "session_id": "s-1"}
    await granted(http, agent_key, {"scope": "session", "for": "1h"}, body)
    assert (await ask(http, agent_key, body))["decision"] == "allow"
    assert (await ask(http, agent_key, {**body, "arguments": {"amount": 1, "to": None}}))[
        "decision"
    ] == "pending"


async def test_taking_grants_off_the_gate_ends_them(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    await granted(http, agent_key, {"scope": "agent", "for": "30m"})
    changed = copy.deepcopy(CONFIG)
    next(h for h in changed["agents"]["finance-bot"]["hooks"] if h.get("name") == "transfers")["grants"] = []
    path = tmp_path / "signoff.yaml"
    path.write_text(yaml.safe_dump(changed))
    assert (await runtime.reload(path)).ok
    assert (await ask(http, agent_key, call()))["decision"] == "pending"


async def test_an_approval_on_gates_offering_no_grant_reads_no_votes_for_one(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """Approving a request whose gates offer no grant gives none, without reading its votes
    for one; a gate that offers grants still gives the one chosen."""
    from signoff.app.audit import Actor
    from signoff.app.models import ConfirmationRequest
    from signoff.app.requests import grants

    plain = (await ask(http, agent_key, {"tool_name": "pay_invoice", "arguments": {"amount": 60000}}))[
        "request_id"
    ]
    offering = (await ask(http, agent_key, call()))["request_id"]
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = runtime.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        async with transaction(runtime.sessions) as session:
            req = await session.get(ConfirmationRequest, plain)
            assert req is not None
            statements.clear()
            assert (
                await grants.create_for_approval(session, req, actor=Actor("web", "alice"), now=utcnow())
                == []
            )
            assert not any("vote" in s.lower() for s in statements), statements
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    d = await decide(http, offering, {"scope": "session", "for": "1h", "same": ["to"]})
    assert d.status_code == 200, d.text
    async with runtime.sessions() as s:
        given = (await s.exec(select(Grant).where(col(Grant.request_id) == offering))).all()
    assert [g.scope for g in given] == ["session"]
