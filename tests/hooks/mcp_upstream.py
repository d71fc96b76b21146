"""A real MCP server (the ``mcp`` SDK's own ``MCPServer``) for the proxy tests, over stdio or HTTP.

    python -m tests.hooks.mcp_upstream [--http PORT] [--pid-file FILE] [--log FILE]

Tools: ``echo`` (returns its arguments as structured content), ``pay_invoice`` (a
payment, answered as text), ``slow`` (reports progress and logs while it works),
``notify`` (sends list-changed and resource-updated notifications), ``stamped`` (answers
with the result ``_meta`` it is given), ``header`` (an
HTTP header of the request), ``environ`` (an environment variable), ``crash`` (the
process exits at once); and tools that ask their client: ``ask_model`` (sampling),
``ask_user`` (form elicitation), ``visit`` (URL elicitation), ``roots`` (the client's
roots), ``pay_with_memo`` (elicits a memo, then pays). A resource (subscribable), a
resource template, a prompt and completions; list changes are announced.
Every tool call, each (un)subscription, a client's ``roots/list_changed`` notification
(and, with ``--roots-on-start``, the roots it asks for once the handshake is done) is
appended to ``--log`` as a JSON line, so a test can tell what reached the server.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import (
    CallToolResult,
    Completion,
    CompletionArgument,
    CompletionContext,
    EmptyResult,
    NotificationParams,
    PromptReference,
    ResourceTemplateReference,
    SamplingMessage,
    SubscribeRequestParams,
    TextContent,
    ToolAnnotations,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

server = MCPServer("test-upstream", instructions="A server for the proxy tests.")
CALLS: Path | None = None
# Announced in the handshake too (MCPServer announces list changes only at 2026-07-28).
ANNOUNCED = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
server._lowlevel_server.create_initialization_options = functools.partial(
    server._lowlevel_server.create_initialization_options, ANNOUNCED
)


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
def pay_invoice(invoice_id: str, amount: int, ctx: Context, memo: str = "") -> str:
    """Pay an invoice."""
    _logged("pay_invoice", {"invoice_id": invoice_id, "amount": amount, "memo": memo})
    if "task" in (ctx.request_context.params or {}):
        _logged("pay_invoice as a task", {})
    return f"paid {invoice_id}: {amount} ({memo})" if memo else f"paid {invoice_id}: {amount}"


class Answer(BaseModel):
    answer: str


@server.tool()
async def ask_model(prompt: str, ctx: Context) -> str:
    """Sample the client's model."""
    _logged("ask_model", {"prompt": prompt})
    try:
        sampled = await ctx.request_context.session.create_message(
            [SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=50,
            related_request_id=ctx.request_id,
        )
    except MCPError as exc:
        return f"refused ({exc.error.code}): {exc.error.message}"
    content = sampled.content
    return f"{sampled.model}: {content.text if isinstance(content, TextContent) else content}"


@server.tool()
async def ask_user(question: str, ctx: Context, wait: float = 0) -> str:
    """Ask the user (form elicitation), after ``wait`` seconds."""
    _logged("ask_user", {"question": question})
    await anyio.sleep(wait)
    try:
        answered = await ctx.elicit(question, Answer)
    except MCPError as exc:
        return f"refused ({exc.error.code}): {exc.error.message}"
    return f"{answered.action}: {answered.data.answer}" if answered.action == "accept" else answered.action


@server.tool()
async def visit(url: str, ctx: Context) -> str:
    """Send the user to a URL (URL elicitation)."""
    _logged("visit", {"url": url})
    try:
        answered = await ctx.elicit_url(f"Please visit {url}", url, "e-1")
    except MCPError as exc:
        return f"refused ({exc.error.code}): {exc.error.message}"
    return answered.action


@server.tool()
async def roots(ctx: Context) -> list[str]:
    """The client's roots."""
    _logged("roots", {})
    try:
        listed = await ctx.request_context.session.list_roots()
    except MCPError as exc:
        return [f"refused ({exc.error.code}): {exc.error.message}"]
    return [str(root.uri) for root in listed.roots]


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
async def pay_with_memo(invoice_id: str, amount: int, ctx: Context) -> str:
    """Ask the user for the payment's memo, then pay."""
    _logged("pay_with_memo", {"invoice_id": invoice_id, "amount": amount})
    answered = await ctx.elicit(f"Memo for {invoice_id}?", Answer)
    if answered.action != "accept":
        return f"not paid: {answered.action}"
    _logged("pay_with_memo paid", {"memo": answered.data.answer})
    return f"paid {invoice_id}: {amount} ({answered.data.answer})"


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
def stamped(text: str, meta: dict[str, Any]) -> CallToolResult:
    """Answer ``text`` with ``meta`` as the result's own ``_meta``."""
    _logged("stamped", {"text": text})
    return CallToolResult(content=[TextContent(type="text", text=text)], _meta=meta)


@server.tool()
async def notify(ctx: Context) -> str:
    """Tell the client that the tool list changed and that the note resource was updated."""
    _logged("notify", {})
    session = ctx.request_context.session
    await session.send_tool_list_changed()
    await session.send_prompt_list_changed()
    await session.send_resource_list_changed()
    await session.send_resource_updated("note://today")
    await session.send_resource_updated("note://monday")
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


async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
    _logged("resources/subscribe", {"uri": params.uri})
    return EmptyResult()


async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
    _logged("resources/unsubscribe", {"uri": params.uri})
    return EmptyResult()


async def roots_on_start(ctx: Any, params: NotificationParams) -> None:
    try:
        listed = await ctx.session.list_roots()
    except MCPError as exc:
        _logged("roots at start", {"refused": exc.error.message})
        return
    _logged("roots at start", {"roots": [str(root.uri) for root in listed.roots]})


# MCPServer has no decorator for these; its low-level server takes the handlers.
server._lowlevel_server.add_notification_handler(
    "notifications/roots/list_changed", NotificationParams, roots_changed
)
server._lowlevel_server.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
server._lowlevel_server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)


def main() -> None:
    global CALLS
    p = argparse.ArgumentParser()
    p.add_argument("--http", type=int, help="serve streamable HTTP on 127.0.0.1:PORT (default: stdio)")
    p.add_argument("--pid-file", type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument(
        "--roots-on-start", action="store_true", help="ask the client for its roots once it connects"
    )
    args = p.parse_args()
    CALLS = args.log
    if args.roots_on_start:
        server._lowlevel_server.add_notification_handler(
            "notifications/initialized", NotificationParams, roots_on_start
        )
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")
    sys.exit(0)


if __name__ == "__main__":
    main()
