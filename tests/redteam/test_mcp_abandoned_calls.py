"""A call the proxy forwarded, then its client cancelled: reported to Signoff all the same.

Once the upstream has the call it may run it (a payment made, then the client gives up
waiting for the answer). Signoff records an approved call as executed from the proxy's
report, and its approval allows the call until then; a forwarded call the client cancels is
reported as abandoned - it may have run - on both protocol eras, so the record shows it
and the approval is spent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from mcp.client.session import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.conftest import Server
from tests.hooks.signoff_fakes import KEY
from tests.hooks.test_client_server import admin_client, pending_ids, vote
from tests.hooks.test_mcp_proxy import BIG, config, fake_signoff, forkserver, proxied  # noqa: F401  (fixtures)
from tests.redteam.test_mcp_wire_shapes import ran


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_forwarded_call_the_client_cancels_is_reported(tmp_path: Path, mode: str) -> None:
    started = asyncio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    with fake_signoff(policy=lambda tool, args: "allow") as live:
        async with proxied(tmp_path, live.url, KEY, mode=mode) as client:
            call = asyncio.create_task(
                client.call_tool("slow", {"steps": 3000}, progress_callback=on_progress)
            )
            await asyncio.wait_for(started.wait(), 20)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            (report,) = live.wait_for_reports(1)
    assert ran(tmp_path)[0]["tool"] == "slow"
    assert report["tool_name"] == "mcp__up__slow"
    assert report["arguments"] == {"steps": 3000}
    assert report["idempotency_key"] == live.submissions[0]["idempotency_key"]
    assert "abandoned" in report["error"]
    assert "may have run" in report["error"]


async def test_an_approved_call_abandoned_after_forwarding_spends_its_approval(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
) -> None:
    asked = asyncio.Event()

    async def never_answer(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20", elicitation_callback=never_answer) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_with_memo", BIG))
        (rid,) = await pending_ids(runtime, admin)
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        await asyncio.wait_for(asked.wait(), 15)  # forwarded: the upstream asks for the memo
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(250):
            record = (await admin.get(f"/v1/admin/requests/{rid}")).json()
            if record["executed_at"] is not None:
                break
            await asyncio.sleep(0.02)
    assert record["executed_at"] is not None
    assert ran(tmp_path)[0] == {"tool": "pay_with_memo", "arguments": BIG}
