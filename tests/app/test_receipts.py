"""Signed receipts through the real HTTP API: the decision receipt in the pre-tool-use replay,
``wait`` and the request record; the execution receipt from post-tool-use, chained to it; every
terminal status signed; keys published, rotated, given by the operator; each receipt checked
offline with only the published keys (signoff.hooks.receipts) and its digest recomputed with an
independent RFC 8785 implementation."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
from datetime import timedelta
from typing import Any

import httpx
import jcs
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from signoff.app import receipt_keys
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import utcnow
from signoff.app.requests.states import expire_overdue
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from signoff.hooks.receipts import ReceiptInvalid, receipt_digest, verify_receipt
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server
from tests.waiting import eventually

pytestmark = pytest.mark.postgres

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"].append(
    {
        "type": "confirmation_gate",
        "name": "sends",
        "tools": ["send_*"],
        "channel": "chat",
        "approvers": ["alice", "bob"],
        "timeout": "30m",
        "editable": ["amount", "memo"],
    }
)
CALL: dict[str, Any] = {
    "tool_name": "pay_invoice",
    "arguments": {"amount": 90000, "to": "ACME GmbH", "memo": "Rechnung Nº 7 — €"},
    "session_id": "s-1",
    "idempotency_key": "pay:acme:90000",
}


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def independent_digest(config: SignoffConfig, call: dict[str, Any], arguments: Any = None) -> str:
    """The action digest as another system computes it: SHA-256 over JCS (the jcs package)."""
    value = {
        "agent": "finance-bot",
        "tool": call["tool_name"],
        "arguments": call["arguments"] if arguments is None else arguments,
        "session": call.get("session_id"),
        "policy_version": config.version,
    }
    return hashlib.sha256(jcs.canonicalize(value)).hexdigest()


async def keys(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/v1/receipts/keys")
    assert r.status_code == 200
    published: dict[str, Any] = r.json()
    return published


async def decide(http: httpx.AsyncClient, rid: str, **body: Any) -> dict[str, Any]:
    r = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": "alice", **body},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def test_an_approval_is_signed_and_travels_with_the_answers(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig, runtime: Runtime
) -> None:
    first = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()
    assert first["decision"] == "pending"
    assert first["receipt"] is None
    rid = first["request_id"]
    waiter = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait", params={"timeout": 20}, headers=auth(agent_key))
    )
    await eventually(lambda: runtime.hub.waiting == 1)  # parked in its long-poll
    decided = await decide(http, rid, reason="invoice checked")
    waited = (await asyncio.wait_for(waiter, 20)).json()
    receipt = waited["receipt"]
    assert receipt is not None
    assert decided["receipt"] == receipt

    published = await keys(http)
    payload = verify_receipt(receipt, published)
    assert receipt["key_id"] in {k["kid"] for k in published["keys"]}
    digest = independent_digest(config, CALL)
    assert payload["kind"] == "decision"
    assert payload["request_id"] == rid
    assert payload["verdict"] == "approved"
    assert payload["action_digest"] == digest
    assert payload["approved_digest"] == digest
    assert payload["policy_version"] == config.version
    assert payload["reason"] == "invoice checked"
    assert payload["gates"] == [
        {"name": "payments", "channel": "chat", "approvers": ["alice", "bob"], "quorum": 1}
    ]
    (vote,) = payload["votes"]
    assert {k: vote[k] for k in ("gate", "person", "verdict", "channel", "assurance")} == {
        "gate": "payments",
        "person": "alice",
        "verdict": "approve",
        "channel": "web",
        "assurance": "admin_token",  # as the vote recorded it
    }
    assert vote["at"] == payload["decided_at"]
    call = {
        "agent": "finance-bot",
        "tool": CALL["tool_name"],
        "arguments": CALL["arguments"],
        "session": CALL["session_id"],
        "policy_version": config.version,
    }
    verify_receipt(receipt, published, call=call)
    with pytest.raises(ReceiptInvalid, match="does not approve this call"):
        verify_receipt(receipt, published, call={**call, "arguments": {**CALL["arguments"], "amount": 1}})

    # The replay of the call answers allow with the same receipt; so does the request record.
    replay = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()
    assert replay["decision"] == "allow"
    assert replay["receipt"] == receipt
    record = (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()
    assert record["receipt"] == receipt
    assert record["execution_receipt"] is None

    # The call ran: the execution receipt, chained to the decision's.
    result = {"paid": True, "reference": "TX-1"}
    report = {**CALL, "result": result}
    ran = (await http.post(POST, json=report, headers=auth(agent_key))).json()
    execution = ran["receipt"]
    done = verify_receipt(execution, published)
    assert done["kind"] == "execution"
    assert done["request_id"] == rid
    assert done["decision_receipt"] == receipt_digest(receipt)
    assert done["action_digest"] == digest
    assert done["approved_digest"] == digest
    assert done["executed_mismatch"] is False
    assert done["result_digest"] == hashlib.sha256(jcs.canonicalize(result)).hexdigest()
    assert done["error"] is False
    record = (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()
    assert record["execution_receipt"] == execution
    # A second report closes nothing: no second receipt.
    again = (await http.post(POST, json=report, headers=auth(agent_key))).json()
    assert again["receipt"] is None


async def test_a_call_run_otherwise_than_approved_is_signed_as_a_mismatch(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    rid = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()["request_id"]
    await decide(http, rid)
    other = {**CALL["arguments"], "amount": 9_000_000}
    ran = (await http.post(POST, json={**CALL, "arguments": other}, headers=auth(agent_key))).json()
    done = verify_receipt(ran["receipt"], await keys(http))
    assert done["executed_mismatch"] is True
    assert done["action_digest"] == independent_digest(config, CALL, other)
    assert done["approved_digest"] == independent_digest(config, CALL)


async def test_secrets_are_digested_as_sent_though_stored_redacted(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    call = {**CALL, "arguments": {**CALL["arguments"], "api_token": "tok-live-123"}}
    rid = (await http.post(PRE, json=call, headers=auth(agent_key))).json()["request_id"]
    decided = await decide(http, rid)
    assert decided["arguments"]["api_token"] != "tok-live-123"  # stored redacted
    payload = verify_receipt(decided["receipt"], await keys(http))
    assert payload["action_digest"] == independent_digest(config, call)


async def test_an_approval_with_changes_names_the_call_as_approved(
    http: httpx.AsyncClient, agent_key: str, config: SignoffConfig
) -> None:
    call = {**CALL, "tool_name": "send_payment", "idempotency_key": "send:1"}
    rid = (await http.post(PRE, json=call, headers=auth(agent_key))).json()["request_id"]
    decided = await decide(http, rid, arguments={"amount": 500})
    payload = verify_receipt(decided["receipt"], await keys(http))
    approved = {**call["arguments"], "amount": 500}
    assert payload["action_digest"] == independent_digest(config, call)
    assert payload["approved_digest"] == independent_digest(config, call, approved)
    assert payload["changes"] == {"amount": 500}
    replay = (await http.post(PRE, json=call, headers=auth(agent_key))).json()
    assert replay["modified_arguments"] == approved
    ran = (await http.post(POST, json={**call, "arguments": approved}, headers=auth(agent_key))).json()
    assert verify_receipt(ran["receipt"], await keys(http))["executed_mismatch"] is False
    # Run as first proposed instead: a mismatch, on the record.
    call2 = {**call, "idempotency_key": "send:2"}
    rid2 = (await http.post(PRE, json=call2, headers=auth(agent_key))).json()["request_id"]
    await decide(http, rid2, arguments={"amount": 500})
    ran2 = (await http.post(POST, json=call2, headers=auth(agent_key))).json()
    assert verify_receipt(ran2["receipt"], await keys(http))["executed_mismatch"] is True


async def test_every_terminal_status_is_signed(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    published_before = await keys(http)
    rejected = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()["request_id"]
    await decide(http, rejected, verdict="reject", reason="not this month")
    cancelled = (await http.post(PRE, json={**CALL, "idempotency_key": "c"}, headers=auth(agent_key))).json()[
        "request_id"
    ]
    await http.post(f"/v1/requests/{cancelled}/cancel", headers=auth(agent_key))
    expired = (
        await http.post(PRE, json={"tool_name": "quick_thing", "arguments": {}}, headers=auth(agent_key))
    ).json()["request_id"]
    async with transaction(runtime.sessions) as s:
        assert await expire_overdue(s, now=utcnow() + timedelta(seconds=5)) == [expired]
    published = await keys(http)
    assert published == published_before
    verdicts = {}
    for rid in (rejected, cancelled, expired):
        record = (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()
        payload = verify_receipt(record["receipt"], published)
        assert payload["request_id"] == rid
        assert payload["approved_digest"] is None
        assert payload["reason"] == record["reason"]
        verdicts[rid] = (payload["verdict"], payload["decided_by"]["channel"])
    assert verdicts == {
        rejected: ("rejected", "web"),
        cancelled: ("cancelled", "agent"),
        expired: ("expired", "system"),
    }


async def test_rotation_keeps_old_receipts_verifiable_and_refuses_the_old_key_after(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()["request_id"]
    old_receipt = (await decide(http, rid))["receipt"]
    async with transaction(runtime.sessions) as s:
        old_key = await receipt_keys.signing_key(s)
        new_key = await receipt_keys.rotate(s)
    assert new_key.kid != old_key.kid
    rid2 = (await http.post(PRE, json={**CALL, "idempotency_key": "k2"}, headers=auth(agent_key))).json()[
        "request_id"
    ]
    new_receipt = (await decide(http, rid2))["receipt"]
    published = await keys(http)
    assert [k["kid"] for k in published["keys"]][-2:] == [old_key.kid, new_key.kid]
    assert published["keys"][-2]["not_after"] is not None
    assert published["keys"][-1]["not_after"] is None
    assert new_receipt["key_id"] == new_key.kid
    assert verify_receipt(old_receipt, published)["request_id"] == rid
    assert verify_receipt(new_receipt, published)["request_id"] == rid2
    # The old key, stolen, signs a receipt dated after its rotation: refused.
    forged = receipt_keys.sign({**new_receipt["payload"], "verdict": "approved"}, old_key)
    with pytest.raises(ReceiptInvalid, match="rotated out"):
        verify_receipt(forged, published)


async def test_an_operator_key_signs_and_its_predecessors_stay_published(
    db_url: str, config: SignoffConfig, fake_channel: FakeChannel, agent_key: str
) -> None:
    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    given = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    settings = Settings(database_url=db_url, admin_token=ADMIN_TOKEN, receipt_key=given)  # type: ignore[arg-type]
    expected = receipt_keys.parse_key(given).kid
    rt = Runtime.create(settings, config, channels={"chat": fake_channel})
    try:
        async with Server(rt) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            rid = (await http.post(PRE, json=CALL, headers=auth(agent_key))).json()["request_id"]
            receipt = (await decide(http, rid))["receipt"]
            published = await keys(http)
    finally:
        await rt.aclose()
    assert receipt["key_id"] == expected
    listed = {k["kid"]: k for k in published["keys"]}
    assert listed[expected]["not_after"] is None
    assert all(k["not_after"] is not None for kid, k in listed.items() if kid != expected)
    assert verify_receipt(receipt, published)["request_id"] == rid
    async with rt.reads() as s:
        row = await s.get(receipt_keys.ReceiptKey, expected)
    assert row is not None
    assert row.private_key is None  # the operator keeps it


async def test_the_keys_are_public_and_jwks_shaped(http: httpx.AsyncClient) -> None:
    published = await keys(http)
    assert published["keys"]
    for k in published["keys"]:
        assert {"kid", "kty", "crv", "x", "alg", "use", "not_before", "not_after"} <= set(k)
        assert (k["kty"], k["crv"], k["alg"]) == ("OKP", "Ed25519", "EdDSA")
        assert "d" not in k


async def test_a_request_made_before_receipts_is_signed_from_its_stored_call(
    runtime: Runtime, config: SignoffConfig, http: httpx.AsyncClient
) -> None:
    """A request written before revision 0013 has no action digest: its decision receipt takes
    it from the stored arguments when they are the call as sent, and says null when they were
    redacted (the secret values are gone)."""
    import sqlalchemy as sa

    from signoff.app.models import ConfirmationRequest
    from signoff.app.operators import decide as operator_decides
    from signoff.channels import Verdict
    from tests.app.factories import make_request

    plain = {"amount": 120000, "to": "ACME"}
    secret = {"amount": 120000, "api_token": "tok-live-123"}
    async with transaction(runtime.sessions) as s:
        ids = [(await make_request(s, config, arguments=a)).id for a in (plain, secret)]
        table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
        await s.exec(sa.update(table).values(action_digest=None))
    async with transaction(runtime.sessions) as s:
        for rid in ids:
            await operator_decides(s, rid, verdict=Verdict.APPROVE, operator="alice", config=config)
    published = await keys(http)
    async with runtime.reads() as s:
        rows = {rid: await s.get(ConfirmationRequest, rid) for rid in ids}
    digests = []
    for rid in ids:
        row = rows[rid]
        assert row is not None
        assert row.receipt is not None
        digests.append(verify_receipt(row.receipt, published)["action_digest"])
    call = {"tool_name": "pay_invoice", "arguments": plain, "session_id": None}
    assert digests == [independent_digest(config, call), None]


async def test_racing_deciders_leave_one_receipt_naming_the_winner(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    for i in range(5):
        call = {**CALL, "idempotency_key": f"race-{i}"}
        rid = (await http.post(PRE, json=call, headers=auth(agent_key))).json()["request_id"]
        await asyncio.gather(
            http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=ADMIN,
            ),
            http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "reject", "operator": "bob", "reason": "no"},
                headers=ADMIN,
            ),
            http.post(f"/v1/requests/{rid}/cancel", headers=auth(agent_key)),
        )
        record = (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()
        payload = verify_receipt(record["receipt"], await keys(http))
        assert payload["verdict"] == record["status"]
        assert payload["decided_by"]["user_id"] == record["decided_by"]["user_id"]


async def test_the_client_librarys_decision_carries_the_receipt(
    server: Server, agent_key: str, runtime: Runtime, config: SignoffConfig
) -> None:
    from signoff.hooks.client import AsyncGateClient

    async with (
        AsyncGateClient(server.url, agent_key) as client,
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
    ):
        asking = asyncio.create_task(
            client.pre_tool_use(
                CALL["tool_name"],
                CALL["arguments"],
                session_id=CALL["session_id"],
                idempotency_key="client-1",
                deadline=20,
            )
        )
        for _ in range(200):
            listed = (await http.get("/v1/admin/requests?status=pending", headers=ADMIN)).json()
            if listed:
                break
            await asyncio.sleep(0.05)
        await decide(http, listed[0]["id"])
        decision = await asyncio.wait_for(asking, 20)
        published = await keys(http)
    assert decision.allowed
    assert decision.receipt is not None
    payload = verify_receipt(decision.receipt, published)
    assert payload["request_id"] == decision.request_id
    assert payload["approved_digest"] == independent_digest(config, CALL)
