"""The decision receipt an approved call ran under reaches the client on both protocol eras.

A handshake-era client finds it in the result's ``_meta["signoff/receipt"]``; a 2026-07-28
client's call runs in the proxy over one or more rounds (its result comes in whichever round
the upstream finishes in), and its result carries the same receipt, verifying with the
published keys as the approval of exactly that request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from signoff.hooks.receipts import verify_receipt
from tests.conftest import Server
from tests.hooks.test_client_server import admin_client, pending_ids, vote
from tests.hooks.test_mcp_proxy import BIG, config, forkserver, proxied, text  # noqa: F401  (fixtures)
from tests.redteam.test_mcp_wire_shapes import ran


async def memo(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "rent"})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("tool", ["pay_invoice", "pay_with_memo"])
async def test_an_approved_calls_result_carries_its_receipt_in_both_eras(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    mode: str,
    tool: str,
) -> None:
    async with (
        proxied(
            tmp_path, server.url, agent_key, "--hold", "20", mode=mode, elicitation_callback=memo
        ) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool(tool, BIG))
        (rid,) = await pending_ids(runtime, admin)
        assert ran(tmp_path) == []
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        result = await asyncio.wait_for(call, 15)
        async with httpx.AsyncClient(base_url=server.url) as anyone:
            keys = (await anyone.get("/v1/receipts/keys")).json()
    assert not result.is_error, text(result)
    assert result.meta is not None
    payload: dict[str, Any] = verify_receipt(result.meta["signoff/receipt"], keys)
    assert (payload["request_id"], payload["verdict"], payload["tool"]) == (
        rid,
        "approved",
        f"mcp__up__{tool}",
    )
