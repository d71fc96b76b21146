"""The gate client and the Claude Code hook against the real Signoff server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from signoff.app.db import transaction
from signoff.app.main import create_app
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from signoff.hooks.client import AsyncGateClient, GateClient, GateFailure
from tests.conftest import Server, free_port
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
BIG = {"invoice_id": "inv-1", "amount": 90_000}


async def pending_ids(runtime: Runtime, admin: httpx.AsyncClient, *, count: int = 1) -> list[str]:
    """Wait until the server holds ``count`` pending requests; return their ids."""
    for _ in range(200):
        listed = (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
        if len(listed) >= count:
            return [r["id"] for r in listed]
        await asyncio.sleep(0.05)
    raise AssertionError("no pending request appeared")


async def vote(
    runtime: Runtime, request_id: str, verdict: Verdict, who: str, reason: str | None = None
) -> None:
    async with transaction(runtime.sessions) as session:
        await decide(session, request_id, verdict=verdict, operator=who, config=runtime.config, reason=reason)


@asynccontextmanager
async def admin_client(url: str, admin_headers: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, headers=admin_headers, timeout=10) as client:
        yield client


async def test_no_gate_matches_allows(server: Server, agent_key: str) -> None:
    async with AsyncGateClient(server.url, agent_key) as client:
        decision = await client.pre_tool_use("pay_invoice", {"amount": 10})
    assert decision.allowed
    assert decision.request_id is None


async def test_approved_while_waiting(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str]
) -> None:
    async with (
        AsyncGateClient(server.url, agent_key, poll_timeout=5) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        task = asyncio.create_task(
            client.pre_tool_use("pay_invoice", BIG, session_id="s1", tool_call_id="t1", user_id="carol")
        )
        (rid,) = await pending_ids(runtime, admin)
        started = time.monotonic()
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        decision = await asyncio.wait_for(task, 10)
    assert time.monotonic() - started < 3, "woken by the decision, not by the poll timeout"
    assert decision.allowed
    assert decision.request_id == rid
    assert decision.reason == "Approved by Bob (web)"


async def test_rejected_with_a_reason(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str]
) -> None:
    async with (
        AsyncGateClient(server.url, agent_key) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        task = asyncio.create_task(client.pre_tool_use("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        await vote(runtime, rid, Verdict.REJECT, "alice", reason="not this quarter")
        decision = await asyncio.wait_for(task, 10)
    assert not decision.allowed
    assert decision.failure is None
    assert decision.reason == "Rejected by Alice (web): not this quarter"


async def test_idempotent_retry_returns_the_same_request(
    server: Server, agent_key: str, runtime: Runtime
) -> None:
    async with AsyncGateClient(server.url, agent_key) as client:
        first = await client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c", wait=False)
        again = await client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c", wait=False)
        assert first.pending
        assert again.request_id == first.request_id
        assert first.request_id is not None
        await vote(runtime, first.request_id, Verdict.APPROVE, "alice")
        replay = await client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c", deadline=2)
    assert replay.allowed


async def test_replay_of_an_approved_request_names_it(
    server: Server, agent_key: str, runtime: Runtime
) -> None:
    async with AsyncGateClient(server.url, agent_key) as client:
        first = await client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c", wait=False)
        assert first.request_id is not None
        await vote(runtime, first.request_id, Verdict.APPROVE, "alice")
        replay = await client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c", deadline=2)
    assert replay.allowed
    assert replay.request_id == first.request_id


async def test_deadline_with_cancel_withdraws_the_request(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    async with (
        AsyncGateClient(server.url, agent_key, deadline=1, cancel_on_deadline=True) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        decision = await client.pre_tool_use("pay_invoice", BIG)
        assert decision.request_id is not None
        stored = (await admin.get(f"/v1/admin/requests/{decision.request_id}")).json()
    assert decision.failure is GateFailure.TIMEOUT
    assert "was cancelled" in (decision.reason or "")
    assert stored["status"] == "cancelled"


async def test_deadline_without_cancel_leaves_the_request_pending(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    async with (
        AsyncGateClient(server.url, agent_key, deadline=1) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        decision = await client.pre_tool_use("pay_invoice", BIG)
        stored = (await admin.get(f"/v1/admin/requests/{decision.request_id}")).json()
    assert decision.failure is GateFailure.TIMEOUT
    assert stored["status"] == "pending"


async def test_cancel_of_an_approved_request_reports_the_approval(
    server: Server, agent_key: str, runtime: Runtime
) -> None:
    async with AsyncGateClient(server.url, agent_key) as client:
        submitted = await client.pre_tool_use("pay_invoice", BIG, wait=False)
        assert submitted.request_id is not None
        await vote(runtime, submitted.request_id, Verdict.APPROVE, "bob")
        cancelled = await client.cancel(submitted.request_id)
    assert cancelled.allowed, "the server refuses (409) and the client reads the approval"


async def test_bad_key_denies(server: Server) -> None:
    async with AsyncGateClient(server.url, "not-a-key") as client:
        decision = await client.pre_tool_use("pay_invoice", BIG)
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "401" in (decision.reason or "")


async def test_oversized_arguments_deny_with_the_servers_reason(server: Server, agent_key: str) -> None:
    async with AsyncGateClient(server.url, agent_key) as client:
        decision = await client.pre_tool_use("pay_invoice", {"blob": "x" * 2_000_000})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "HTTP 413" in (decision.reason or "") or "HTTP 422" in (decision.reason or "")


@asynccontextmanager
async def serving(runtime: Runtime, port: int) -> AsyncIterator[None]:
    """The app on a fixed port; on exit in-flight requests are cut off, like a crash."""
    config = uvicorn.Config(
        create_app(runtime, background=False),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    try:
        yield
    finally:
        server.should_exit = True
        await task


async def test_server_restart_during_the_wait(
    runtime: Runtime, agent_key: str, admin_headers: dict[str, str]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with AsyncGateClient(
        url, agent_key, poll_timeout=2, backoff_initial=0.1, backoff_max=0.5
    ) as client:
        async with serving(runtime, port), admin_client(url, admin_headers) as admin:
            task = asyncio.create_task(
                client.pre_tool_use("pay_invoice", BIG, session_id="s", tool_call_id="c")
            )
            (rid,) = await pending_ids(runtime, admin)
            await eventually(lambda: runtime.hub.waiting == 1)  # the client is inside a long-poll
        await asyncio.sleep(1.0)  # down: the client meets refused connections
        assert not task.done()
        async with serving(runtime, port):
            await vote(runtime, rid, Verdict.APPROVE, "alice")
            decision = await asyncio.wait_for(task, 15)
    assert decision.allowed
    assert decision.request_id == rid


async def test_sync_client_against_the_real_server(server: Server, agent_key: str) -> None:
    def ask() -> bool:
        # In a thread: the server runs in this test's event loop.
        with GateClient(server.url, agent_key, deadline=10) as client:
            return client.pre_tool_use("read_file", {"path": "/etc/hosts"}).allowed

    assert await asyncio.to_thread(ask)


async def run_hook(url: str, key: str, hook_input: dict[str, Any], *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "SIGNOFF_URL": url, "SIGNOFF_API_KEY": key, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "signoff.hooks.adapters.claude_code",
        "--timeout",
        "60",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(hook_input).encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_claude_code_hook_piped_against_the_real_server(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str]
) -> None:
    hook_input = {
        "session_id": "sess-1",
        "hook_event_name": "PreToolUse",
        "tool_name": "pay_invoice",
        "tool_input": BIG,
        "tool_use_id": "toolu_01",
        "cwd": "/tmp",
        "permission_mode": "default",
    }
    async with admin_client(server.url, admin_headers) as admin:
        hook = asyncio.create_task(run_hook(server.url, agent_key, hook_input))
        (rid,) = await pending_ids(runtime, admin)
        await vote(runtime, rid, Verdict.REJECT, "bob", reason="use the batch run")
        code, out, err = await hook
    assert code == 0, err
    output = json.loads(out)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny"
    assert output["permissionDecisionReason"] == "Signoff: Rejected by Bob (web): use the batch run"

    # The same tool call fired again (``--resume``) gets the same, decided request.
    code, out, _ = await run_hook(server.url, agent_key, hook_input)
    assert code == 0
    assert json.loads(out)["hookSpecificOutput"]["permissionDecision"] == "deny"

    code, out, err = await run_hook(server.url, "wrong-key", hook_input)
    assert code == 2
    assert out == ""
    assert "401" in err


async def expire_all(runtime: Runtime) -> None:
    from datetime import timedelta

    from signoff.app.models import utcnow
    from signoff.app.requests.states import expire_overdue

    async with transaction(runtime.sessions) as session:
        assert await expire_overdue(session, now=utcnow() + timedelta(hours=1))


async def test_an_expired_request_reads_as_nobody_deciding_not_as_a_refusal(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str]
) -> None:
    from signoff.hooks.client import GateTimeout

    hook_input = {
        "session_id": "sess-x",
        "hook_event_name": "PreToolUse",
        "tool_name": "pay_invoice",
        "tool_input": BIG,
        "tool_use_id": "toolu_x",
        "cwd": "/tmp",
        "permission_mode": "default",
    }
    async with (
        AsyncGateClient(server.url, agent_key) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        task = asyncio.create_task(
            client.pre_tool_use("pay_invoice", BIG, session_id="s9", tool_call_id="c9")
        )
        (rid,) = await pending_ids(runtime, admin)
        await expire_all(runtime)
        decision = await asyncio.wait_for(task, 10)
        replay = await client.pre_tool_use("pay_invoice", BIG, session_id="s9", tool_call_id="c9", deadline=2)
    said = (
        f"Not decided in time: approval request {rid} expired (nobody decided within 30m; asked Alice, Bob)"
    )
    for answer in (decision, replay):
        assert not answer.allowed
        assert answer.failure is None  # the server's answer, not the client failing
        assert answer.expired
        assert answer.reason is not None
        assert answer.reason.startswith(said)
        assert "Nobody refused this call" in answer.reason
        assert "Rejected" not in answer.reason
    with pytest.raises(GateTimeout, match="Not decided in time"):
        decision.raise_for_denial()

    # The Claude Code hook shows the model the same words, for a fresh call that expires too.
    async with admin_client(server.url, admin_headers) as admin:
        hook = asyncio.create_task(run_hook(server.url, agent_key, hook_input))
        ids = await pending_ids(runtime, admin)
        await expire_all(runtime)
        code, out, err = await hook
    assert code == 0, err
    output = json.loads(out)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny"
    assert output["permissionDecisionReason"].startswith(
        f"Signoff: Not decided in time: approval request {ids[0]}"
    )
    assert "Nobody refused" in output["permissionDecisionReason"]
