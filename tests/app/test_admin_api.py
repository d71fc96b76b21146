"""The operator API over HTTP, in process (``tests.conftest.InProcess``): what it answers, not
how a server carries it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, SecretStr
from sqlmodel import col

from signoff.app.audit import Actor
from signoff.app.channel_types import CHANNEL_TYPES, ChannelType
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import AuditEvent, utcnow
from signoff.app.requests.gate import GateService
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from signoff.hooks import HookContext
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, InProcess, in_process_http
from tests.units_of_work import counting
from tests.waiting import eventually

VAULT_SECRET = "hunter2-the-vault-password"


class VaultConfig(BaseModel):
    """A channel type with secrets in its config, to see them masked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = "vaulted"
    password: SecretStr
    empty_secret: SecretStr = SecretStr("")
    region: str = "eu"


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch) -> SignoffConfig:
    """The default test config, plus a channel with secrets and a second gated agent."""
    monkeypatch.setitem(
        CHANNEL_TYPES, "vaulted", ChannelType(VaultConfig, lambda name, cfg: FakeChannel(name))
    )
    monkeypatch.setenv("SIGNOFF_TEST_VAULT_PASSWORD", VAULT_SECRET)
    body = copy.deepcopy(DEFAULT_CONFIG)
    body["channels"]["vault"] = {"type": "vaulted", "password": "${SIGNOFF_TEST_VAULT_PASSWORD}"}
    body["agents"]["ops-bot"] = {
        "hooks": [
            {
                "type": "confirmation_gate",
                "name": "deploys",
                "tools": ["deploy_*"],
                "channel": "chat",
                "approvers": ["carol"],
            }
        ]
    }
    return parse_config(body, source="test.yaml")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(http: httpx.AsyncClient, key: str, tool: str = "pay_invoice", **body: Any) -> str:
    """Send a gated call; return the pending request's id."""
    body.setdefault("arguments", {"amount": 90000})
    r = await http.post("/v1/hooks/pre-tool-use", json={"tool_name": tool, **body}, headers=auth(key))
    assert r.status_code == 200, r.text
    assert r.json()["decision"] == "pending", r.json()
    rid: str = r.json()["request_id"]
    return rid


class Admin:
    def __init__(self, http: httpx.AsyncClient, headers: dict[str, str]) -> None:
        self.http = http
        self.headers = headers

    async def decide(
        self, rid: str, verdict: str, operator: str, reason: str | None = None
    ) -> httpx.Response:
        body: dict[str, Any] = {"verdict": verdict, "operator": operator}
        if reason is not None:
            body["reason"] = reason
        return await self.http.post(f"/v1/admin/requests/{rid}/decision", json=body, headers=self.headers)

    async def get(self, path: str, **params: Any) -> Any:
        r = await self.http.get(path, params=params, headers=self.headers)
        assert r.status_code == 200, r.text
        return r.json()

    async def request(self, rid: str) -> Any:
        return await self.get(f"/v1/admin/requests/{rid}")

    async def actions(self, rid: str) -> list[str]:
        return [e["action"] for e in (await self.request(rid))["audit"]]


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process_http(runtime) as client:
        yield client


@pytest.fixture
def admin(http: httpx.AsyncClient, admin_headers: dict[str, str]) -> Admin:
    return Admin(http, admin_headers)


# --- authentication -------------------------------------------------------------------------------


@pytest.fixture
async def tokenless_server(db_url: str, config: SignoffConfig) -> AsyncIterator[InProcess]:
    rt = Runtime.create(
        Settings(database_url=db_url, admin_token=None), config, channels={"chat": FakeChannel("chat")}
    )
    try:
        async with InProcess(rt) as s:
            yield s
    finally:
        await rt.aclose()


@pytest.mark.parametrize(
    "path",
    [
        "/v1/admin/requests",
        "/v1/admin/requests/x",
        "/v1/admin/audit",
        "/v1/admin/audit/verify",
        "/v1/admin/config",
    ],
)
async def test_operator_api_is_disabled_without_an_admin_token(
    tokenless_server: InProcess, path: str
) -> None:
    async with tokenless_server.client() as client:
        for headers in ({}, auth(ADMIN_TOKEN), auth("wrong")):
            r = await client.get(path, headers=headers)
            assert r.status_code == 403, (headers, r.text)
            assert "SIGNOFF_ADMIN_TOKEN" in r.json()["detail"]
        decision = await client.post(
            "/v1/admin/requests/x/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers=auth(ADMIN_TOKEN),
        )
        assert decision.status_code == 403


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"},
        {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": ADMIN_TOKEN},
    ],
    ids=["none", "wrong", "prefix", "longer", "basic", "no-scheme"],
)
async def test_wrong_admin_token_is_401(
    http: httpx.AsyncClient, agent_key: str, headers: dict[str, str]
) -> None:
    rid = await ask(http, agent_key)
    for method, path, body in [
        ("GET", "/v1/admin/requests", None),
        ("GET", f"/v1/admin/requests/{rid}", None),
        ("POST", f"/v1/admin/requests/{rid}/decision", {"verdict": "approve", "operator": "alice"}),
        ("GET", "/v1/admin/audit", None),
        ("GET", "/v1/admin/config", None),
    ]:
        r = await http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    # The refused decision changed nothing.
    read = await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))
    assert read.json()["status"] == "pending"


async def test_an_agent_key_is_not_an_admin_token(http: httpx.AsyncClient, agent_key: str) -> None:
    assert (await http.get("/v1/admin/requests", headers=auth(agent_key))).status_code == 401


# --- listing and reading --------------------------------------------------------------------------


async def test_list_and_filter_by_status_agent_and_tool(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, runtime: Runtime
) -> None:
    async with transaction(runtime.sessions) as s:
        _, ops_key = await create_key(s, "ops-bot", actor=Actor("test"))
    paid = await ask(http, agent_key, "pay_invoice")
    wired = await ask(http, agent_key, "wire_money")
    refused = await ask(http, agent_key, "pay_refund")
    deploy = await ask(http, ops_key, "deploy_prod", arguments={})
    assert (await admin.decide(paid, "approve", "alice")).status_code == 200
    assert (await admin.decide(refused, "reject", "bob", "no")).status_code == 200

    async def ids(**params: Any) -> list[str]:
        return [r["id"] for r in await admin.get("/v1/admin/requests", **params)]

    assert await ids() == [deploy, refused, wired, paid], "newest first"
    assert await ids(status="pending") == [deploy, wired]
    assert await ids(status="approved") == [paid]
    assert await ids(status="rejected") == [refused]
    assert await ids(status="expired") == []
    assert await ids(agent="ops-bot") == [deploy]
    assert await ids(agent="finance-bot") == [refused, wired, paid]
    assert await ids(agent="finance-bot", status="pending") == [wired]
    assert await ids(agent="nobody") == []
    assert await ids(tool="wire_money") == [wired]
    assert await ids(limit=2) == [deploy, refused]

    listed = {r["id"]: r for r in await admin.get("/v1/admin/requests")}
    assert listed[paid]["status"] == "approved"
    assert listed[paid]["approvals"] == 1
    assert listed[wired]["quorum"] == 2
    assert listed[deploy]["agent_id"] == "ops-bot"
    assert listed[deploy]["gate"] == "deploys"

    bad = await http.get("/v1/admin/requests", params={"status": "maybe"}, headers=admin.headers)
    assert bad.status_code == 422
    assert (
        await http.get("/v1/admin/requests", params={"limit": 0}, headers=admin.headers)
    ).status_code == 422


async def test_read_one_request_with_votes_and_audit_trail(
    http: httpx.AsyncClient, agent_key: str, admin: Admin
) -> None:
    rid = await ask(http, agent_key, arguments={"amount": 90000, "password": "pw"}, user_id="carol")
    before = await admin.request(rid)
    assert before["status"] == "pending"
    assert before["arguments"] == {"amount": 90000, "password": "[redacted]"}
    assert before["votes"] == []
    assert [e["action"] for e in before["audit"]] == ["created"]
    created = before["audit"][0]
    assert created["actor_channel"] == "agent"
    assert created["actor_id"] == "finance-bot"
    assert created["detail"]["tool"] == "pay_invoice"
    assert created["detail"]["gate"] == "payments"

    r = await admin.decide(rid, "approve", "alice", "looks right")
    assert r.status_code == 200, r.text

    after = await admin.request(rid)
    assert after == r.json(), "the decision answers with the same view as a read"
    assert [e["action"] for e in after["audit"]] == ["created", "vote", "approved"]
    seqs = [e["seq"] for e in after["audit"]]
    assert seqs == sorted(seqs)
    vote_event, approved_event = after["audit"][1:]
    assert (vote_event["actor_channel"], vote_event["actor_id"], vote_event["actor_name"]) == (
        "web",
        "alice",
        "Alice",
    )
    assert vote_event["detail"]["verdict"] == "approve"
    assert vote_event["detail"]["reason"] == "looks right"
    assert vote_event["detail"]["identity"] == {"via": "api"}
    assert approved_event["actor_id"] == "alice"
    assert approved_event["detail"] == {"reason": "looks right"}
    assert all(e["request_id"] == rid for e in after["audit"])
    [vote] = after["votes"]
    assert (vote["verdict"], vote["channel"], vote["user_id"], vote["name"]) == (
        "approve",
        "web",
        "alice",
        "Alice",
    )
    assert vote["reason"] == "looks right"


async def test_unknown_request_is_404(admin: Admin) -> None:
    r = await admin.http.get("/v1/admin/requests/nope", headers=admin.headers)
    assert r.status_code == 404
    assert "nope" in r.json()["detail"]
    d = await admin.decide("nope", "approve", "alice")
    assert d.status_code == 404
    assert "nope" in d.json()["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"verdict": "maybe", "operator": "alice"},
        {"verdict": "approve"},
        {"verdict": "approve", "operator": ""},
        {"verdict": "approve", "operator": "alice", "extra": 1},
        {"verdict": "approve", "operator": "alice", "reason": "x" * 2001},
    ],
    ids=["verdict", "no-operator", "empty-operator", "extra-field", "long-reason"],
)
async def test_malformed_decision_is_422_and_changes_nothing(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, body: dict[str, Any]
) -> None:
    rid = await ask(http, agent_key)
    r = await http.post(f"/v1/admin/requests/{rid}/decision", json=body, headers=admin.headers)
    assert r.status_code == 422, r.text
    assert (await admin.request(rid))["status"] == "pending"
    assert await admin.actions(rid) == ["created"]


# --- decisions ------------------------------------------------------------------------------------


async def test_decision_by_an_approver(http: httpx.AsyncClient, agent_key: str, admin: Admin) -> None:
    rid = await ask(http, agent_key)
    r = await admin.decide(rid, "approve", "alice")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "approved"
    assert body["decided_by"] == {"channel": "web", "user_id": "alice", "name": "Alice"}
    assert body["decided_at"] is not None
    assert body["approvals"] == 1
    # The agent sees the same outcome.
    seen = (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()
    assert seen["status"] == "approved"
    assert seen["decided_by"] == {"channel": "web", "user_id": "alice", "name": "Alice"}


async def test_reject_by_an_approver(http: httpx.AsyncClient, agent_key: str, admin: Admin) -> None:
    rid = await ask(http, agent_key)
    r = await admin.decide(rid, "reject", "bob", "not this month")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "rejected"
    assert r.json()["reason"] == "not this month"
    assert r.json()["decided_by"]["name"] == "Bob"
    assert await admin.actions(rid) == ["created", "vote", "rejected"]


@pytest.mark.parametrize("operator", ["carol", "mallory"], ids=["person-not-listed", "stranger"])
async def test_decision_by_someone_not_an_approver_is_refused_and_audited(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, operator: str
) -> None:
    rid = await ask(http, agent_key)
    for verdict in ("approve", "reject"):
        r = await admin.decide(rid, verdict, operator, "because")
        assert r.status_code == 409, r.text
        assert r.json()["detail"] == "You are not an approver for this request."
    view = await admin.request(rid)
    assert view["status"] == "pending"
    assert view["decided_by"] is None
    assert view["votes"] == []
    assert [e["action"] for e in view["audit"]] == ["created", "vote_refused", "vote_refused"]
    refused = view["audit"][1]
    assert refused["actor_channel"] == "web"
    assert refused["actor_id"] == operator
    assert refused["detail"]["why"] == "You are not an approver for this request."
    assert refused["detail"]["verdict"] == "approve"
    # Still decidable by a real approver.
    assert (await admin.decide(rid, "approve", "bob")).json()["status"] == "approved"


async def test_second_decision_is_409_already_decided(
    http: httpx.AsyncClient, agent_key: str, admin: Admin
) -> None:
    rid = await ask(http, agent_key)
    assert (await admin.decide(rid, "approve", "alice")).status_code == 200
    for operator, verdict in [("bob", "approve"), ("bob", "reject"), ("alice", "reject")]:
        again = await admin.decide(rid, verdict, operator, "late")
        assert again.status_code == 409
        assert again.json() == {"detail": "This request was already approved by Alice.", "status": "approved"}
    # The same operator's same decision again: the request as it stands (200).
    repeated = await admin.decide(rid, "approve", "alice", "late")
    assert repeated.status_code == 200, repeated.text
    assert repeated.json()["status"] == "approved"
    view = await admin.request(rid)
    assert view["status"] == "approved"
    assert view["decided_by"]["user_id"] == "alice"
    assert len(view["votes"]) == 1
    assert [e["action"] for e in view["audit"]] == ["created", "vote", "approved"] + ["vote_refused"] * 4


async def test_decision_after_the_deadline_expires_the_request(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, runtime: Runtime
) -> None:
    gate = runtime.config.agents["finance-bot"].hooks[0]
    async with transaction(runtime.sessions) as s:
        approvals = GateService(s, runtime.config, "finance-bot", now=utcnow() - timedelta(hours=2))
        await approvals.ask(
            HookContext(agent_id="finance-bot", tool_name="pay_x", arguments={"amount": 90000}), gate
        )
        assert approvals.created is not None
        rid = approvals.created.id
    r = await admin.decide(rid, "approve", "alice")
    assert r.status_code == 410
    assert r.json() == {"detail": "This request has already expired.", "status": "expired"}
    view = await admin.request(rid)
    assert view["status"] == "expired"
    assert view["votes"] == []
    assert [e["action"] for e in view["audit"]] == ["created", "expired", "vote_refused"]


async def test_quorum_two_needs_two_distinct_approvers(
    http: httpx.AsyncClient, agent_key: str, admin: Admin
) -> None:
    rid = await ask(http, agent_key, "wire_money", arguments={"amount": 10})

    first = await admin.decide(rid, "approve", "alice")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "pending"
    assert first.json()["approvals"] == 1
    assert first.json()["decided_by"] is None

    twice = await admin.decide(rid, "approve", "alice")
    assert twice.status_code == 200  # the same decision again: the request as it stands
    assert (twice.json()["status"], twice.json()["approvals"]) == ("pending", 1)
    otherwise = await admin.decide(rid, "reject", "alice", "changed my mind")
    assert otherwise.status_code == 409
    assert otherwise.json()["detail"] == "You have already voted on this request."
    assert (await admin.request(rid))["status"] == "pending"

    second = await admin.decide(rid, "approve", "carol")
    assert second.status_code == 200, second.text
    body = second.json()
    assert body["status"] == "approved"
    assert body["approvals"] == 2
    assert body["decided_by"] == {"channel": "web", "user_id": "carol", "name": "Carol"}
    assert [v["user_id"] for v in body["votes"]] == ["alice", "carol"]
    assert [e["action"] for e in body["audit"]] == [
        "created",
        "vote",
        *["vote_refused"] * 2,
        "vote",
        "approved",
    ]


async def test_quorum_two_first_approval_then_reject_rejects(
    http: httpx.AsyncClient, agent_key: str, admin: Admin
) -> None:
    rid = await ask(http, agent_key, "wire_money", arguments={})
    assert (await admin.decide(rid, "approve", "alice")).status_code == 200
    r = await admin.decide(rid, "reject", "bob", "wrong account")
    assert r.status_code == 200
    assert r.json()["status"] == "rejected"
    assert r.json()["reason"] == "wrong account"


@pytest.mark.parametrize("reason", [None, "", "   "], ids=["missing", "empty", "blank"])
async def test_reject_without_a_required_reason_is_refused(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, reason: str | None
) -> None:
    rid = await ask(http, agent_key, "wire_money", arguments={})
    r = await admin.decide(rid, "reject", "bob", reason)
    assert r.status_code == 409
    assert r.json()["detail"] == "A reason is required to reject this request."
    view = await admin.request(rid)
    assert view["status"] == "pending"
    assert view["votes"] == []
    assert [e["action"] for e in view["audit"]] == ["created", "vote_refused"]
    # The refused reject did not use up bob's vote.
    ok = await admin.decide(rid, "reject", "bob", "wrong account")
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "rejected"
    assert ok.json()["reason"] == "wrong account"


async def test_reject_reason_is_optional_where_not_required(
    http: httpx.AsyncClient, agent_key: str, admin: Admin
) -> None:
    rid = await ask(http, agent_key)
    r = await admin.decide(rid, "reject", "alice")
    assert r.status_code == 200
    assert r.json()["status"] == "rejected"
    assert r.json()["reason"] is None


@pytest.mark.parametrize("user_id", ["alice", "U_ALICE"], ids=["directory-key", "channel-id"])
async def test_the_requester_cannot_approve_their_own_call(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, user_id: str
) -> None:
    rid = await ask(http, agent_key, user_id=user_id)
    own = await admin.decide(rid, "approve", "alice")
    assert own.status_code == 409
    assert own.json()["detail"] == "You cannot approve a call made on your own behalf."
    assert (await admin.request(rid))["status"] == "pending"
    other = await admin.decide(rid, "approve", "bob")
    assert other.status_code == 200, other.text
    assert other.json()["status"] == "approved"
    assert other.json()["decided_by"]["user_id"] == "bob"
    assert await admin.actions(rid) == ["created", "vote_refused", "vote", "approved"]


# --- the audit log --------------------------------------------------------------------------------


async def test_audit_log_pages_with_after(http: httpx.AsyncClient, agent_key: str, admin: Admin) -> None:
    a = await ask(http, agent_key)
    b = await ask(http, agent_key, "wire_money")
    await admin.decide(a, "approve", "alice")
    await admin.decide(b, "approve", "mallory")  # refused, still audited

    everything = await admin.get("/v1/admin/audit")
    seqs = [e["seq"] for e in everything]
    assert seqs == list(range(1, len(everything) + 1))
    assert [e["action"] for e in everything] == [
        "key_created",
        "created",
        "created",
        "vote",
        "approved",
        "vote_refused",
    ]
    # Each event links to an earlier one of its chain (or starts a chain); none is linked twice.
    seen: set[str] = set()
    for event in everything:
        assert event["prev_hash"] == "0" * 64 or event["prev_hash"] in seen
        seen.add(event["hash"])
    links = [e["prev_hash"] for e in everything if e["prev_hash"] != "0" * 64]
    assert len(links) == len(set(links))

    pages: list[list[dict[str, Any]]] = []
    after = 0
    while page := await admin.get("/v1/admin/audit", after=after, limit=2):
        assert len(page) <= 2
        pages.append(page)
        after = page[-1]["seq"]
    assert [e for p in pages for e in p] == everything
    assert len(pages) == 3
    assert await admin.get("/v1/admin/audit", after=len(everything)) == []

    only_b = await admin.get("/v1/admin/audit", request_id=b)
    assert [e["action"] for e in only_b] == ["created", "vote_refused"]
    assert (await http.get("/v1/admin/audit", params={"after": -1}, headers=admin.headers)).status_code == 422


async def test_audit_verify_ok_then_broken_after_tampering(
    http: httpx.AsyncClient, agent_key: str, admin: Admin, runtime: Runtime
) -> None:
    rid = await ask(http, agent_key)
    await admin.decide(rid, "approve", "alice", "fine")
    events = await admin.get("/v1/admin/audit")

    assert await admin.get("/v1/admin/audit/verify") == {
        "ok": True,
        "events": len(events),
        "broken_at": None,
        "problem": None,
    }

    vote = next(e for e in events if e["action"] == "vote")
    async with transaction(runtime.sessions) as s:
        await s.exec(
            sa.update(AuditEvent)
            .where(col(AuditEvent.seq) == vote["seq"])
            .values(detail={**vote["detail"], "reason": "edited later"})
        )
    broken = await admin.get("/v1/admin/audit/verify")
    assert broken["ok"] is False
    assert broken["broken_at"] == vote["seq"]
    assert "edited" in broken["problem"]
    assert broken["events"] < len(events)


# --- the configuration ----------------------------------------------------------------------------


async def test_config_is_shown_with_secrets_masked(http: httpx.AsyncClient, admin: Admin) -> None:
    r = await http.get("/v1/admin/config", headers=admin.headers)
    assert r.status_code == 200
    assert VAULT_SECRET not in r.text
    cfg = r.json()
    assert cfg["source"] == "test.yaml"
    assert cfg["channels"] == {
        "web": {"type": "web"},
        "chat": {"type": "fake"},
        "vault": {"type": "vaulted", "password": "********", "empty_secret": "", "region": "eu"},
    }
    assert cfg["people"]["alice"] == {"name": "Alice", "web": "alice", "fake": "U_ALICE"}
    assert sorted(cfg["agents"]) == ["finance-bot", "ops-bot", "other-bot"]
    payments, two_person, _short = cfg["agents"]["finance-bot"]["hooks"]
    assert payments["name"] == "payments"
    assert payments["tools"] == ["pay_*"]
    assert payments["when"] == "has(args.amount) && args.amount >= 50000"
    assert payments["approvers"] == ["alice", "bob"]
    assert two_person["quorum"] == 2
    assert two_person["require_reject_reason"] is True
    assert cfg["agents"]["other-bot"]["hooks"] == []
    assert "password" in cfg["redact"]


@pytest.mark.postgres
async def test_nul_characters_are_a_422_not_a_database_error(
    http: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    for path in (
        "/v1/admin/audit?request_id=a%00b",
        "/v1/admin/requests?agent=x%00",
        "/v1/admin/requests/a%00b",
    ):
        r = await http.get(path, headers=admin_headers)
        assert r.status_code == 422, (path, r.text)
    r = await http.put(
        "/v1/admin/switches/read_only", json={"on": True, "operator": "al\u0000ice"}, headers=admin_headers
    )
    assert r.status_code == 422
    assert "NUL" in r.text


async def test_a_decision_is_one_unit_of_work_that_reads_its_request_once(
    http: httpx.AsyncClient, runtime: Runtime, agent_key: str, admin: Admin
) -> None:
    """The operator API's decision, the agent waiting on it released, and the trail it answers
    with: one transaction, one read of the request (under lock) and one write of it (its
    status and its signed receipt together); the trail is read once it has
    committed, and the waiting agent is answered from the commit, without a read of its own."""
    rid = await ask(http, agent_key)
    waiter = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=auth(agent_key))
    )
    await eventually(lambda: runtime.hub.waiting)
    with counting(runtime) as tally:
        # In a task of its own, as a server runs each request (the tally is per task).
        r = await asyncio.create_task(admin.decide(rid, "approve", "alice"))
        assert r.status_code == 200, r.text
        assert (await asyncio.wait_for(waiter, 10)).json()["status"] == "approved"
        [task] = tally.tasks_writing("vote")
        await asyncio.wait({task}, timeout=10)
    unit, answer = tally.by_task[task]
    assert unit.reads_of("confirmation_request") == 1
    assert unit.writes_of("confirmation_request") == 1  # the decision and its receipt, together
    assert unit.reads_of("vote") == 1  # for the receipt and the waiting agent's answer alike
    assert answer.reads_of("confirmation_request") == 0
    assert not any(answer.writes_to(t) for t in ("confirmation_request", "vote", "audit_event"))
    assert list(tally.by_task) == [task]  # nobody else asked the database anything
    assert [e["action"] for e in r.json()["audit"]] == ["created", "vote", "approved"]
