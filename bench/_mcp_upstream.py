"""The upstream MCP server of ``bench.mcp_proxy``: the ``mcp`` SDK's own ``MCPServer`` over stdio.

Run by the benchmark as ``python -m bench._mcp_upstream``.
"""

from __future__ import annotations

from mcp.server import MCPServer

server = MCPServer("bench-upstream")


@server.tool()
def lookup(key: str) -> str:
    """An ungated, read-only tool: answers at once."""
    return f"value of {key}"


@server.tool()
def pay_invoice(invoice_id: str, amount: int) -> str:
    """A tool the bench gate covers (``mcp__bench__pay_*``), never called by the benchmark."""
    return f"paid {invoice_id}: {amount}"


if __name__ == "__main__":
    server.run("stdio")
