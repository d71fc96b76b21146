"""``POST /v1/hooks/pre-tool-use`` answers a body the same whether it arrives with a declared
length or chunked, byte for byte, through real HTTP; and its key
checks answer as every other agent endpoint's do."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.keys import create_key, revoke_keys
from signoff.app.runtime import Runtime

PATH = "/v1/hooks/pre-tool-use"
HEADERS = ("content-type", "content-length", "www-authenticate", "retry-after", "x-request-id")
"""The headers compared, besides the status and the body."""

JSON = "application/json"
BODIES: dict[str, tuple[bytes, str | None, int]] = {
    # name: (body, content type, the status expected with a live key)
    "allow": (b'{"tool_name":"read_file","arguments":{"path":"/etc/hosts"}}', JSON, 200),
    "allow, charset": (b'{"tool_name":"read_file"}', "application/json; charset=utf-8", 200),
    "allow, +json": (b'{"tool_name":"read_file"}', "application/merge-patch+json", 200),
    "allow, unicode": ('{"tool_name":"read_é","arguments":{"f":1e16,"s":"☃"}}'.encode(), JSON, 200),
    "allow, unknown fields": (b'{"tool_name":"read_file","bogus":1,"metadata":{"a":1}}', JSON, 200),
    "invalid JSON": (b'{"tool_name": ', JSON, 422),
    "duplicate keys": (b'{"tool_name":"a","tool_name":"b"}', JSON, 422),
    "duplicate nested keys": (b'{"tool_name":"a","arguments":{"x":1,"x":2}}', JSON, 422),
    "NUL": (b'{"tool_name":"a\\u0000b"}', JSON, 422),
    "lone surrogate": (b'{"tool_name":"a\\ud800"}', JSON, 422),
    "NaN": (b'{"tool_name":"a","arguments":{"x":NaN}}', JSON, 422),
    "not UTF-8": (b'{"tool_name":"\xff"}', JSON, 422),
    "wrong types": (b'{"tool_name":5,"arguments":[]}', JSON, 422),
    "not an object": (b"[1,2]", JSON, 422),
    "empty": (b"", JSON, 422),
    "no tool name": (b"{}", JSON, 422),
    "tool name too long": (json.dumps({"tool_name": "x" * 501}).encode(), JSON, 422),
    "empty idempotency key": (b'{"tool_name":"read_file","idempotency_key":""}', JSON, 422),
    "nested too deep": (
        b'{"tool_name":"a","arguments":{"a":' + b"[" * 40 + b"1" + b"]" * 40 + b"}}",
        JSON,
        422,
    ),
    "arguments too large": (
        json.dumps({"tool_name": "a", "arguments": {"a": "x" * 40000}}).encode(),
        JSON,
        422,
    ),
    "oversized": (json.dumps({"tool_name": "a", "arguments": {"a": "x" * 70000}}).encode(), JSON, 413),
    "no content type": (b'{"tool_name":"read_file"}', None, 422),
    "text": (b'{"tool_name":"read_file"}', "text/plain", 422),
    "text, not UTF-8": (b'{"tool_name":"\xff"}', "text/plain", 422),
}


async def chunked(body: bytes) -> AsyncIterator[bytes]:
    """The body in three chunks, so httpx sends it chunked, with no declared length."""
    size = len(body) // 3 + 1
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def post_both_ways(
    http: httpx.AsyncClient, body: bytes, headers: dict[str, str], *, path: str = PATH
) -> tuple[httpx.Response, httpx.Response]:
    declared = await http.post(path, content=body, headers=headers)
    streamed = await http.post(path, content=chunked(body), headers=headers)
    assert "content-length" in declared.request.headers
    assert streamed.request.headers.get("transfer-encoding") == "chunked"
    return declared, streamed


def answer(r: httpx.Response) -> tuple[int, bytes, dict[str, str | None]]:
    return r.status_code, r.content, {h: r.headers.get(h) for h in HEADERS}


@pytest.fixture
async def keys(runtime: Runtime, agent_key: str) -> dict[str, str | None]:
    """Authorization headers: a live key, an unconfigured agent's, a revoked one, and worse."""
    async with transaction(runtime.sessions) as s:
        _, revoked = await create_key(s, "other-bot", actor=Actor("test"))
        _, ghost = await create_key(s, "ghost", actor=Actor("test"))
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="other-bot", actor=Actor("test"))
    return {
        "live": f"Bearer {agent_key}",
        "live, odd spelling": f"bearer  {agent_key}",
        "unconfigured agent": f"Bearer {ghost}",
        "revoked": f"Bearer {revoked}",
        "unknown": "Bearer sk_signoff_nope_nope",
        "not a key": "Bearer xyz",
        "another scheme": "Basic YWxpY2U6cHc=",
        "no token": "Bearer",
        "missing": None,
    }


async def test_every_body_is_answered_alike_with_a_declared_length_and_chunked(
    http: httpx.AsyncClient, keys: dict[str, str | None], admin_headers: dict[str, str]
) -> None:
    for key_name, authorization in keys.items():
        for body_name, (body, content_type, expected) in BODIES.items():
            case = f"{body_name}, {key_name} key"
            headers = {"x-request-id": f"case-{len(case)}"}
            if authorization is not None:
                headers["authorization"] = authorization
            if content_type is not None:
                headers["content-type"] = content_type
            declared, streamed = await post_both_ways(http, body, headers)
            assert answer(declared) == answer(streamed), case
            assert declared.headers["x-request-id"] == headers["x-request-id"], case
            if key_name.startswith("live"):
                assert declared.status_code == expected, (case, declared.text)
            elif body_name == "oversized":
                assert declared.status_code == 413, case
    # Nothing above asked for a human.
    assert (await http.get("/v1/admin/requests", headers=admin_headers)).json() == []


async def test_a_pending_call_is_answered_alike_with_a_declared_length_and_chunked(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    headers = {"authorization": f"Bearer {agent_key}", "content-type": JSON, "x-request-id": "pending"}

    def call(key: str) -> bytes:
        return json.dumps(
            {"tool_name": "pay_x", "arguments": {"amount": 90000}, "idempotency_key": key}
        ).encode()

    declared = await http.post(PATH, content=call("first"), headers=headers)
    streamed = await http.post(PATH, content=chunked(call("second")), headers=headers)
    assert declared.json()["decision"] == streamed.json()["decision"] == "pending"

    def same_but_ids(r: httpx.Response) -> tuple[int, str, dict[str, str | None]]:
        text = r.text.replace(r.json()["request_id"], "ID")
        text = re.sub(r'"\d{4}-\d\d-\d\dT[^"]+"', '"T"', text)
        return r.status_code, text, {h: r.headers.get(h) for h in HEADERS if h != "content-length"}

    assert same_but_ids(declared) == same_but_ids(streamed)
    # Replays of one call: byte for byte.
    again, again_streamed = await post_both_ways(http, call("first"), headers)
    assert answer(again) == answer(again_streamed)
    assert again.json()["request_id"] == declared.json()["request_id"]


async def test_keys_are_refused_as_on_every_agent_endpoint(
    http: httpx.AsyncClient, keys: dict[str, str | None]
) -> None:
    body = b'{"tool_name":"read_file","result":"ok"}'
    for key_name, authorization in keys.items():
        headers = {"content-type": JSON, "x-request-id": "keys"}
        if authorization is not None:
            headers["authorization"] = authorization
        gate = await http.post(PATH, content=body, headers=headers)
        post = await http.post("/v1/hooks/post-tool-use", content=body, headers=headers)
        if key_name.startswith(("live", "unconfigured")):
            assert gate.status_code == post.status_code == 200, key_name
        else:
            assert gate.status_code == 401, key_name
            assert answer(gate) == answer(post), key_name
            assert gate.headers["www-authenticate"] == "Bearer"


async def test_the_schema_documents_the_gate(http: httpx.AsyncClient) -> None:
    schema = (await http.get("/openapi.json")).json()
    operation = schema["paths"][PATH]["post"]
    assert operation["requestBody"]["content"][JSON]["schema"] == {
        "$ref": "#/components/schemas/PreToolUseIn"
    }
    assert operation["responses"]["200"]["content"][JSON]["schema"] == {
        "$ref": "#/components/schemas/DecisionOut"
    }
    assert {"401", "404", "413", "422"} <= set(operation["responses"])
    assert operation["security"] == [{"HTTPBearer": []}]
    assert (await http.get(PATH)).status_code == 405


async def test_a_replay_keeps_the_arguments_an_earlier_hook_rewrote(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    """A hook ahead of the gate rewrites the call; once approved, the replay that finds the
    request by its key runs the rewritten call, not the one the agent proposed."""
    from signoff.hooks import HookContext, HookRegistry, HookResult

    class Rewrite:
        name = "rewrite"
        priority = 50

        def matches(self, ctx: HookContext) -> bool:
            return True

        async def before_tool_use(self, ctx: HookContext) -> HookResult:
            return HookResult.allow(modified_arguments={**ctx.arguments, "to": "checked"})

    configured = runtime.registries["finance-bot"]
    runtime.registries["finance-bot"] = HookRegistry(pre_tool_use=[Rewrite(), *configured.pre_tool_use])
    call = {"tool_name": "pay_invoice", "arguments": {"amount": 90000, "to": "x"}, "idempotency_key": "k"}
    headers = {"Authorization": f"Bearer {agent_key}"}
    first = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=headers)).json()
    assert first["decision"] == "pending", first
    assert first["modified_arguments"] == {"amount": 90000, "to": "checked"}
    decided = await http.post(
        f"/v1/admin/requests/{first['request_id']}/decision",
        json={"verdict": "approve", "operator": "alice"},
        headers={"Authorization": "Bearer test-admin-token-0123456789"},
    )
    assert decided.status_code == 200, decided.text
    replay = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=headers)).json()
    assert replay["decision"] == "allow", replay
    assert replay["modified_arguments"] == {"amount": 90000, "to": "checked"}, replay
