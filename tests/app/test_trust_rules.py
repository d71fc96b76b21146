"""The trust rules over real HTTP: tool-name spellings, bodies
that cannot be stored or read two ways, redaction by key and by value."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG

PRE = "/v1/hooks/pre-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def config() -> SignoffConfig:
    """The default test configuration, with every call of finance-bot audited."""
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"].append({"type": "audit_log", "tools": ["*"], "result_chars": 2000})
    return parse_config(body, source="test.yaml")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- tool names that dodge a glob -------------------------------------------------------------

DODGES = [
    "Pay_invoice",
    "PAY_INVOICE",
    " pay_invoice",
    "\u0440ay_invoice",  # Cyrillic er
    "\uff50\uff41\uff59\uff3f\uff49\uff4e\uff56\uff4f\uff49\uff43\uff45",  # full width
    "pay\u200b_invoice",  # zero-width space
]


async def test_no_spelling_of_a_gated_tool_slips_past_its_gate(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    for name in DODGES:
        r = await http.post(
            PRE, json={"tool_name": name, "arguments": {"amount": 90000}}, headers=auth(agent_key)
        )
        assert r.status_code == 200, r.text
        assert r.json()["decision"] == "pending", (name, r.json())
        assert r.json()["request"]["gate"] == "payments"
        stored = await http.get(f"/v1/requests/{r.json()['request_id']}", headers=auth(agent_key))
        assert stored.json()["tool_name"] == name, "the request keeps the name as sent"
    small = await http.post(
        PRE, json={"tool_name": "PAY_INVOICE", "arguments": {"amount": 5}}, headers=auth(agent_key)
    )
    assert small.json()["decision"] == "allow", "the gate's condition still applies"
    other = await http.post(PRE, json={"tool_name": "read_file", "arguments": {}}, headers=auth(agent_key))
    assert other.json()["decision"] == "allow"


# --- bodies read two ways, text that cannot be stored -----------------------------------------


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def send(
    http: httpx.AsyncClient, key: str, body: bytes, *, chunked: bool, path: str = PRE
) -> httpx.Response:
    """POST ``body`` as is, with a declared length or chunked."""
    headers = {**auth(key), "content-type": "application/json"}
    return await http.post(path, content=_chunked(body) if chunked else body, headers=headers)


async def nothing_written(http: httpx.AsyncClient, audit_before: int) -> None:
    assert (await http.get("/v1/admin/requests", headers=ADMIN)).json() == []
    assert len((await http.get("/v1/admin/audit", headers=ADMIN)).json()) == audit_before


REPEATED_KEYS = [
    b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "amount": 1}}',
    b'{"tool_name": "read_file", "tool_name": "pay_invoice", "arguments": {"amount": 90000}}',
    b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "lines": [{"sku": "a", "sku": "b"}]}}',
    b'{"tool_name":"pay_invoice","arguments":{"to":"http://x","amount" :90000,"amount":1}}',
    b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "metadata": {"m": 1, "m": 2}}',
]


@pytest.mark.parametrize("chunked", [False, True], ids=["declared-length", "chunked"])
async def test_a_body_with_repeated_keys_is_refused(
    http: httpx.AsyncClient, agent_key: str, chunked: bool
) -> None:
    before = len((await http.get("/v1/admin/audit", headers=ADMIN)).json())
    for body in REPEATED_KEYS:
        r = await send(http, agent_key, body, chunked=chunked)
        assert r.status_code == 422, (body, r.text)
        assert "repeats the key" in r.text
    await nothing_written(http, before)
    # The same keys in different objects are fine.
    fine = (
        b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "lines": [{"sku": "a"}, {"sku": "b"}]}}'
    )
    assert (await send(http, agent_key, fine, chunked=chunked)).json()["decision"] == "pending"


UNSTORABLE = [
    (b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "memo": "\\ud800"}}', "arguments.memo"),
    (b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "\\udfff": 1}}', "a key in arguments"),
    (b'{"tool_name": "pay_\\ud800", "arguments": {"amount": 90000}}', "tool_name"),
    (b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "user_id": "\\udc00x"}', "user_id"),
    (
        b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "metadata": {"a": ["\\ud83d"]}}',
        "metadata.a[0]",
    ),
    (b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "memo": "a\\u0000b"}}', "NUL"),
    (
        b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "memo": "\xed\xa0\x80"}}',
        "arguments.memo",
    ),
    (b'{"tool_name": "pay_invoice", "arguments": {"amount": NaN}}', "NaN"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("chunked", [False, True], ids=["declared-length", "chunked"])
async def test_text_that_cannot_be_stored_is_refused_before_anything_is_written(
    http: httpx.AsyncClient, agent_key: str, fake_channel: FakeChannel, chunked: bool
) -> None:
    before = len((await http.get("/v1/admin/audit", headers=ADMIN)).json())
    for body, where in UNSTORABLE:
        r = await send(http, agent_key, body, chunked=chunked)
        assert r.status_code == 422, (body, r.text)
        assert where in r.json()["detail"], r.text
    post = b'{"tool_name": "x", "arguments": {}, "result": {"out": "\\ud800"}}'
    assert (
        await send(http, agent_key, post, chunked=chunked, path="/v1/hooks/post-tool-use")
    ).status_code == 422
    start = b'{"session_id": "s", "metadata": {"m": "\\ud800"}}'
    assert (
        await send(http, agent_key, start, chunked=chunked, path="/v1/hooks/session-start")
    ).status_code == 422
    await nothing_written(http, before)
    assert fake_channel.posts == []
    # Surrogate pairs are ordinary text (an emoji).
    fine = b'{"tool_name": "pay_invoice", "arguments": {"amount": 90000, "memo": "\\ud83d\\ude00"}}'
    r = await send(http, agent_key, fine, chunked=chunked)
    assert r.json()["request"]["arguments"]["memo"] == "\U0001f600"


@pytest.mark.postgres
async def test_an_operator_decision_with_unstorable_text_is_refused(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    r = await http.post(
        PRE, json={"tool_name": "pay_x", "arguments": {"amount": 90000}}, headers=auth(agent_key)
    )
    rid = r.json()["request_id"]
    bad = b'{"verdict": "approve", "operator": "alice", "reason": "\\ud800"}'
    answer = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        content=bad,
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert (await http.get(f"/v1/requests/{rid}", headers=auth(agent_key))).json()["status"] == "pending"


# --- the audit log's record of a call ---------------------------------------------------------


async def test_the_audit_log_records_results_and_errors_redacted(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    secrets = ["r3s1x", "r3s2x", "r3s3x12345", "r3s4x", "r3s5x12345"]
    body = {
        "tool_name": "fetch_account",
        "arguments": {"id": 7, "api_key": "a1s3x"},
        "result": {
            "token": secrets[0],
            "rows": [{"password": secrets[1]}],
            "note": f"Authorization: Bearer {secrets[2]}",
        },
        "error": f"upstream said: api_key={secrets[3]} is invalid; retried with Bearer {secrets[4]}",
    }
    r = await http.post("/v1/hooks/post-tool-use", json=body, headers=auth(agent_key))
    assert r.status_code == 200, r.text
    assert r.json()["result"] == body["result"], "the agent gets its own result back untouched"
    events = (await http.get("/v1/admin/audit", headers=ADMIN)).json()
    call = next(e for e in events if e["action"] == "tool_call")
    recorded = repr(call["detail"])
    assert not [s for s in [*secrets, "a1s3x"] if s in recorded], recorded
    assert '"token": "[redacted]"' in call["detail"]["result"]
    assert (
        call["detail"]["error"]
        == "upstream said: api_key=[redacted] is invalid; retried with Bearer [redacted]"
    )
    assert (await http.get("/v1/admin/audit/verify", headers=ADMIN)).json()["ok"] is True
