"""A web page rebound to the proxy's loopback address, speaking the 2026-07-28 protocol.

A 2026-07-28 request is one self-contained POST (no ``initialize``, no session), served by
another path of the SDK's HTTP app than the handshake era's. The Host and Origin checks that
keep a rebound web page off a loopback proxy hold on that path too: the page's call is
refused and never reaches the upstream, while a 2026-07-28 client of this machine is served.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.hooks.test_mcp_proxy import forkserver  # noqa: F401  (the upstream's fork server, a fixture)
from tests.redteam.test_mcp_proxy_listen import ACCEPT, _bindable, _listening
from tests.redteam.test_mcp_wire_shapes import ran

MODERN = "2026-07-28"
CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "name": "echo",
        "arguments": {"text": "from a page"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientInfo": {"name": "page", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    },
}


@pytest.mark.parametrize("host", ["127.0.0.2", "0:0:0:0:0:0:0:1"])
async def test_a_rebound_page_speaking_2026_07_28_is_refused(tmp_path: Path, host: str) -> None:
    if not _bindable(host):
        pytest.skip(f"{host} cannot be bound here")
    with _listening(tmp_path, host) as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        modern = {**ACCEPT, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
        page = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
        for headers in (page, {"Host": page["Host"]}):
            rebound = httpx.post(url, json=CALL, headers={**modern, **headers})
            assert rebound.status_code in (403, 421), rebound.text
        assert ran(tmp_path) == []
        served = httpx.post(url, json=CALL, headers=modern)  # the same request, naming the proxy's address
        assert served.status_code == 200, served.text
        assert "from a page" in served.text
        async with (
            httpx2.AsyncClient() as http,
            Client(streamable_http_client(url, http_client=http), mode="auto", cache=None) as client,
        ):
            assert client.protocol_version == MODERN
            result = await client.call_tool("echo", {"text": "here"})
        assert not result.is_error
    assert [c["arguments"]["text"] for c in ran(tmp_path)] == ["from a page", "here"]
