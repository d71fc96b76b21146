"""A session grant given on a call through the MCP proxy covers that proxy's session only.

The proxy names its session to Signoff as its process (and the client's own session over
HTTP). An approver's "this session, 1 hour, while invoice_id stays the same" lets later
payments of the same invoice through that proxy run without asking; another invoice is
asked anew, and so is the same invoice through another proxy process (a new ``claude -p``
session, a restart) - even with the same agent key, tool and arguments.
"""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from tests.conftest import DEFAULT_CONFIG, Server
from tests.hooks.test_mcp_proxy import GATE, forkserver, proxied, text  # noqa: F401  (the fork server, a fixture)
from tests.redteam.support import decide
from tests.redteam.test_mcp_wire_shapes import ran


@pytest.fixture
def config() -> SignoffConfig:
    gate = {**GATE, "grants": [{"scope": "session", "for": "1h", "same": ["invoice_id"]}]}
    raw = copy.deepcopy(DEFAULT_CONFIG)
    return parse_config({**raw, "agents": {"finance-bot": {"hooks": [gate]}}}, source="test.yaml")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_session_grant_covers_one_proxy_session_and_the_same_invoice(
    server: Server, agent_key: str, admin_headers: dict[str, str], tmp_path: Path, mode: str
) -> None:
    first = {"invoice_id": "inv-1", "amount": 90_000}
    async with httpx.AsyncClient(base_url=server.url, headers=admin_headers) as admin:

        async def pending() -> list[str]:
            return [r["id"] for r in (await admin.get("/v1/admin/requests?status=pending")).json()]

        async with proxied(tmp_path, server.url, agent_key, "--hold", "0.3", mode=mode) as client:
            waiting = await client.call_tool("pay_invoice", first)
            assert waiting.is_error
            (rid,) = await pending()
            granted = await decide(admin, rid, grant={"scope": "session", "for": "1h"})
            assert granted.status_code == 200, granted.text
            assert text(await client.call_tool("pay_invoice", first)) == "paid inv-1: 90000"
            covered = await client.call_tool("pay_invoice", {"invoice_id": "inv-1", "amount": 70_000})
            assert text(covered) == "paid inv-1: 70000"
            other = await client.call_tool("pay_invoice", {"invoice_id": "inv-2", "amount": 90_000})
            assert other.is_error
            assert "is waiting for approval" in text(other)
        async with proxied(tmp_path, server.url, agent_key, "--hold", "0.3", mode=mode) as another:
            elsewhere = await another.call_tool("pay_invoice", first)
            assert elsewhere.is_error
            assert "is waiting for approval" in text(elsewhere)
        assert len(await pending()) == 2
    assert [(c["arguments"]["invoice_id"], c["arguments"]["amount"]) for c in ran(tmp_path)] == [
        ("inv-1", 90_000),
        ("inv-1", 70_000),
    ]
