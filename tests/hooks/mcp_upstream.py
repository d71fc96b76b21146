"""A real MCP server (the ``mcp`` SDK's own ``MCPServer``) for the proxy tests, over stdio or HTTP.

    python -m tests.hooks.mcp_upstream [--http PORT] [--pid-file FILE] [--log FILE]

Tools: ``echo`` (returns its arguments as structured content), ``pay_invoice`` (a
payment, answered as text), ``slow`` (reports progress and logs while it works),
``notify`` (sends list-changed and resource-updated notifications), ``header`` (an
HTTP header of the request), ``environ`` (an environment variable), ``crash`` (the
process exits at once). A resource, a
resource template, a prompt and completions.
Every tool call (and a client's ``roots/list_changed`` notification) is appended to
``--log`` as a JSON line, so a test can tell what reached the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    NotificationParams,
    PromptReference,
    ResourceTemplateReference,
    ToolAnnotations,
)

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

server = MCPServer("test-upstream", instructions="A server for the proxy tests.")
CALLS: Path | None = None


def _logged(tool: str, arguments: dict[str, Any]) -> None:
    if CALLS is not None:
        with CALLS.open("a") as out:
            out.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, title="Echo"))
def echo(text: str, times: int = 1) -> dict[str, Any]:
    """Return the arguments it was given."""
    _logged("echo", {"text": text, "times": times})
    return {"text": text, "times": times}


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def pay_invoice(invoice_id: str, amount: int, memo: str = "") -> str:
    """Pay an invoice."""
    _logged("pay_invoice", {"invoice_id": invoice_id, "amount": amount, "memo": memo})
    return f"paid {invoice_id}: {amount} ({memo})" if memo else f"paid {invoice_id}: {amount}"


@server.tool()
async def slow(steps: int, ctx: Context) -> str:
    """Work in steps, reporting progress and logging each."""
    _logged("slow", {"steps": steps})
    try:
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
            await ctx.info(f"step {i + 1} of {steps}")
            await anyio.sleep(0.01)
    except anyio.get_cancelled_exc_class():
        _logged("slow cancelled", {"steps": steps})
        raise
    return f"done in {steps} steps"


@server.tool()
async def notify(ctx: Context) -> str:
    """Tell the client that the tool list changed and that the note resource was updated."""
    _logged("notify", {})
    session = ctx.request_context.session
    await session.send_tool_list_changed()
    await session.send_resource_updated("note://today")
    await ctx.notify_tools_changed()
    return "notified"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of one HTTP header of this request ("" over stdio)."""
    _logged("header", {"name": name})
    return (ctx.headers or {}).get(name.lower(), "")


@server.tool()
def environ(name: str) -> str:
    """The value of one of this process's environment variables ("" if unset)."""
    _logged("environ", {"name": name})
    return os.environ.get(name, "")


@server.tool()
def crash() -> str:
    """Exit the process at once, as a crashing server does."""
    _logged("crash", {})
    os._exit(3)


@server.resource("note://today", mime_type="text/plain")
def today() -> str:
    """Today's note."""
    return "buy milk"


@server.resource("note://{day}")
def note(day: str) -> str:
    """A day's note."""
    return f"note for {day}"


@server.prompt()
def review(code: str, style: str = "short") -> str:
    """Ask for a code review."""
    return f"Review this ({style}):\n{code}"


@server.completion()
async def complete(
    ref: PromptReference | ResourceTemplateReference,
    argument: CompletionArgument,
    context: CompletionContext | None,
) -> Completion | None:
    if argument.name == "style":
        return Completion(values=[v for v in ("short", "long") if v.startswith(argument.value)])
    return None


async def roots_changed(ctx: Any, params: NotificationParams) -> None:
    _logged("notifications/roots/list_changed", {})


# MCPServer has no decorator for client notifications; its low-level server takes the handler.
server._lowlevel_server.add_notification_handler(
    "notifications/roots/list_changed", NotificationParams, roots_changed
)


def main() -> None:
    global CALLS
    p = argparse.ArgumentParser()
    p.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT (default: stdio)")
    p.add_argument("--pid-file", type=Path)
    p.add_argument("--log", type=Path)
    args = p.parse_args()
    CALLS = args.log
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")
    sys.exit(0)


if __name__ == "__main__":
    main()
