"""A gated MCP tool called through the proxy under another spelling of its name.

The proxy asks Signoff about ``mcp__<NAME>__<tool>`` with the tool named as the client sent
it. An upstream server may look its tools up leniently (case, surrounding whitespace,
compatibility forms); whatever it does, every spelling a gate's keys take for the gated
tool - case, whitespace, invisible characters, full-width and look-alike letters - is held
for a person by the real server, and none runs before one says yes.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import Server
from tests.hooks.test_mcp_proxy import BIG, config, forkserver, proxied, text  # noqa: F401  (fixtures)
from tests.redteam.test_mcp_wire_shapes import ran

SPELLINGS = [
    "PAY_INVOICE",
    "Pay_Invoice",
    "pay_invoice ",
    " pay_invoice",
    "pay_invoice\n",
    "pay\u200b_invoice",
    "pay\u2060_invoice\u00ad",
    "\ufeffpay_invoice",
    "\uff50\uff41\uff59_invoice",
    "p\u0430y_invoice",
    "pay_inv\u043eice",
    "pay_\u0131nvoice",
    "pay\uff3finvoice",
]


async def test_every_spelling_of_a_gated_tool_waits_for_a_person(
    server: Server, agent_key: str, admin_headers: dict[str, str], tmp_path: Path
) -> None:
    async with proxied(tmp_path, server.url, agent_key, "--hold", "0") as client:
        answers = {name: await client.call_tool(name, BIG) for name in SPELLINGS}
    async with httpx.AsyncClient(base_url=server.url, headers=admin_headers) as admin:
        pending = (await admin.get("/v1/admin/requests?status=pending")).json()
    held = {r["tool_name"]: r["id"] for r in pending}
    for name, result in answers.items():
        assert result.is_error, name
        assert result.meta is not None, name
        assert result.meta["signoff/decision"] == "pending", (name, text(result))
        assert held.get(f"mcp__up__{name}") == result.meta["signoff/request_id"], name
    assert ran(tmp_path) == []
