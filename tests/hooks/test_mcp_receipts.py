"""Receipts through the MCP gating proxy, against the real server: an approved call's result
carries the signed decision receipt (``_meta["signoff/receipt"]``); the proxy's report of the
result gives the execution receipt, chained to it. Both verify with only the published keys."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jcs

from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from signoff.hooks.receipts import receipt_digest, verify_receipt
from tests.conftest import Server
from tests.hooks.test_client_server import admin_client, pending_ids, vote
from tests.hooks.test_mcp_proxy import BIG, calls, config, forkserver, proxied, text  # noqa: F401  (fixtures)


async def test_an_approved_calls_result_carries_its_receipt_and_its_report_the_execution_receipt(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],  # noqa: F811
) -> None:
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        result = await asyncio.wait_for(call, 15)
        assert not result.is_error
        assert text(result) == "paid inv-1: 90000"
        assert result.meta is not None
        receipt = result.meta["signoff/receipt"]

        async with httpx.AsyncClient(base_url=server.url) as anyone:
            keys = (await anyone.get("/v1/receipts/keys")).json()
        payload = verify_receipt(receipt, keys)
        assert (payload["request_id"], payload["verdict"]) == (rid, "approved")
        assert payload["tool"] == "mcp__up__pay_invoice"
        sent = {
            "agent": "finance-bot",
            "tool": "mcp__up__pay_invoice",
            "arguments": BIG,
            "session": payload["session"],
            "policy_version": runtime.config.version,
        }
        assert payload["action_digest"] == hashlib.sha256(jcs.canonicalize(sent)).hexdigest()

        executed = None
        for _ in range(200):  # the proxy reports in the background
            executed = (await admin.get(f"/v1/admin/requests/{rid}")).json()["execution_receipt"]
            if executed is not None:
                break
            await asyncio.sleep(0.05)
    assert executed is not None, "the proxy's report gave no execution receipt"
    done = verify_receipt(executed, keys)
    assert done["decision_receipt"] == receipt_digest(receipt)
    assert done["executed_mismatch"] is False
    assert done["result_digest"] is not None
