"""Arguments changed by the approver are what runs, on both protocol eras and across rounds.

A 2026-07-28 client answers the upstream's questions by calling again with the arguments it
first sent and the sealed ``requestState``: those rounds continue the approved call, which
runs with the approved arguments - not the client's originals it repeats, and without a
second question to Signoff. The report of the call names the arguments it ran with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientRequestContext
from mcp.types import ElicitRequestParams, ElicitResult

from tests.hooks.signoff_fakes import KEY
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (the upstream's fork server, a fixture)
    fake_signoff,
    forkserver,
    proxied,
    text,
)
from tests.redteam.test_mcp_wire_shapes import asked, ran


def halve(tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    return {**arguments, "amount": arguments["amount"] // 2} if "amount" in arguments else None


async def memo(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "rent"})


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_call_approved_with_changes_runs_changed_through_every_round(
    tmp_path: Path, mode: str
) -> None:
    asked_for = {"invoice_id": "inv-5", "amount": 100}
    with fake_signoff(policy=lambda tool, args: "allow", rewrite=halve) as live:
        async with proxied(tmp_path, live.url, KEY, mode=mode, elicitation_callback=memo) as client:
            result = await client.call_tool("pay_with_memo", asked_for)
            plain = await client.call_tool("pay_invoice", asked_for)
        reports = live.wait_for_reports(2)
    assert text(result) == "paid inv-5: 50 (rent)"
    assert text(plain) == "paid inv-5: 50"
    assert asked(live) == [("mcp__up__pay_with_memo", asked_for), ("mcp__up__pay_invoice", asked_for)]
    assert ran(tmp_path) == [
        {"tool": "pay_with_memo", "arguments": {"invoice_id": "inv-5", "amount": 50}},
        {"tool": "pay_with_memo paid", "arguments": {"memo": "rent"}},
        {"tool": "pay_invoice", "arguments": {"invoice_id": "inv-5", "amount": 50, "memo": ""}},
    ]
    assert sorted((r["tool_name"], r["arguments"]["amount"]) for r in reports) == [
        ("mcp__up__pay_invoice", 50),
        ("mcp__up__pay_with_memo", 50),
    ]
