"""The gating proxy itself, on the ``mcp`` SDK: an MCP server in front of one upstream MCP server.

The proxy is the SDK's low-level :class:`~mcp.server.lowlevel.server.Server`, whose
handlers relay each request to the upstream through a
:class:`~mcp.client.session.ClientSession` and return the upstream's result as it came
(the SDK shapes it for the protocol version the client speaks). The upstream is
connected first, with the initialize handshake, so the proxy can announce the
upstream's own identity and capabilities; handlers exist only for what the upstream
offers. ``tools/call`` alone is asked of Signoff first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Any, NamedTuple

from signoff.hooks._gate import GateDecision, GateFailure
from signoff.hooks.client import AsyncGateClient
from signoff.hooks.mcp_proxy._calls import (
    CallLedger,
    Claim,
    denied_text,
    gated_tool_name,
    unavailable_text,
    waiting_text,
)
from signoff.hooks.mcp_proxy._config import PROG, ProxyConfig

try:
    import anyio
    import anyio.abc
    import httpx2
    import mcp_types as types
    from mcp.client.session import ClientSession, IncomingMessage, MessageHandlerFnT
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.caching import CacheableMethod, CacheHint
    from mcp.server.connection import allowed_log_levels
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.lowlevel.server import NotificationOptions, Server
    from mcp.server.session import ServerSession
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
    from pydantic import BaseModel, RootModel, ValidationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "signoff.hooks.mcp_proxy needs the MCP Python SDK: pip install 'signoff-hooks[mcp]'"
    ) from exc

__all__ = ["GatingProxy", "StartupError", "Upstream", "connect_upstream"]

log = logging.getLogger("signoff.mcp_proxy")

UPSTREAM_START_TIMEOUT = 60.0
"""Seconds the upstream may take to start and complete the initialize handshake."""
PROGRESS_EVERY = 5.0
"""Seconds between progress notifications while a call waits for a person."""
REPORT_FLUSH = 3.0
"""Seconds reports of executed calls may still take when the proxy stops."""
MAX_LISTENERS = 1000

_Request = types.Request[dict[str, Any] | None, str]


class _Raw(RootModel[dict[str, Any]]):
    """A result as the upstream sent it (after the SDK checked it against the protocol version)."""


_RESERVED_META = "io.modelcontextprotocol/"
_NOT_CACHED: dict[CacheableMethod, CacheHint] = {
    "tools/list": CacheHint(),
    "resources/list": CacheHint(),
    "resources/templates/list": CacheHint(),
    "resources/read": CacheHint(),
    "prompts/list": CacheHint(),
    "server/discover": CacheHint(),
}


class StartupError(Exception):
    """The upstream could not be started or did not complete the handshake (exit 2, one line)."""


class Upstream(NamedTuple):
    """The connection to the upstream MCP server."""

    session: ClientSession
    init: types.InitializeResult
    gone: anyio.Event
    """Set when the upstream closed its side (a stdio server exited)."""
    description: str


# --------------------------------------------------------------------------- upstream


def _upstream_env(config: ProxyConfig) -> dict[str, str]:
    """The proxy's environment for a stdio upstream, without the secrets it must not hold."""
    return {k: v for k, v in os.environ.items() if k not in config.secret_vars}


def _proxy_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("signoff-hooks")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


@asynccontextmanager
async def connect_upstream(config: ProxyConfig, on_message: MessageHandlerFnT) -> AsyncIterator[Upstream]:
    """Start (stdio) or reach (HTTP) the upstream and complete the initialize handshake.

    Leaving the context stops a stdio upstream: its stdin is closed, then its process
    group is terminated if it lingers (the SDK's shutdown sequence).

    Raises:
        StartupError: The upstream could not be started or reached, or did not answer.
    """
    described = config.describe_upstream()
    gone = anyio.Event()
    async with AsyncExitStack() as stack:
        try:
            if config.url is not None:
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=dict(config.headers), timeout=httpx2.Timeout(30.0, read=300.0))
                )
                transport = streamable_http_client(config.url, http_client=http)
            else:
                command, *args = config.command
                params = StdioServerParameters(command=command, args=args, env=_upstream_env(config))
                transport = stdio_client(params, errlog=sys.stderr)
            read, write = await stack.enter_async_context(transport)
        except OSError as exc:
            raise StartupError(f"cannot start {described}: {exc}") from exc

        # The session reads through a relay, which tells when the upstream's side ends.
        relay_send, relay_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        relays = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(relays.cancel_scope.cancel)

        closing = False

        async def relay() -> None:
            try:
                async with relay_send:
                    async for item in read:
                        await relay_send.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            if not closing:
                gone.set()

        relays.start_soon(relay)
        session = await stack.enter_async_context(
            ClientSession(
                relay_receive,
                write,
                message_handler=on_message,
                client_info=types.Implementation(name=PROG, version=_proxy_version()),
            )
        )
        try:
            with anyio.fail_after(UPSTREAM_START_TIMEOUT):
                init = await session.initialize()
        except TimeoutError as exc:
            raise StartupError(
                f"{described} did not complete the MCP handshake within {UPSTREAM_START_TIMEOUT:g}s"
            ) from exc
        except (MCPError, ValidationError, RuntimeError, OSError, httpx2.HTTPError) as exc:
            raise StartupError(f"{described} did not complete the MCP handshake: {exc}") from exc
        try:
            yield Upstream(session, init, gone, described)
        finally:
            closing = True  # the proxy is stopping: the upstream's end is no news


def _outbound(params: Mapping[str, Any] | None, **changes: Any) -> dict[str, Any] | None:
    """A client's request params as sent upstream: the transport's own ``_meta`` keys dropped.

    The progress token and the 2026-07-28 envelope keys belong to the client's connection
    to the proxy; the upstream session adds its own. Every other field passes unchanged.
    """
    if params is None and not changes:
        return None
    out = {**(params or {}), **changes}
    meta = out.get("_meta")
    if isinstance(meta, Mapping):
        kept = {k: v for k, v in meta.items() if k != "progressToken" and not k.startswith(_RESERVED_META)}
        if kept:
            out["_meta"] = kept
        else:
            del out["_meta"]
    return out


class _MirrorServer(Server[Any]):
    """A low-level server announcing the upstream's identity and capabilities as its own."""

    def __init__(self, init: types.InitializeResult) -> None:
        info = init.server_info
        super().__init__(
            info.name,
            version=info.version,
            title=info.title,
            description=info.description,
            website_url=info.website_url,
            icons=info.icons,
            instructions=init.instructions,
            # The upstream's results are fresh for as long as the upstream says, which a
            # handshake-era upstream never does: 2026-07-28 clients are told not to cache.
            cache_hints=_NOT_CACHED,
        )
        caps = init.capabilities
        # What the proxy relays; tasks, extensions and experimental methods are not relayed.
        self.mirrored = types.ServerCapabilities(
            prompts=caps.prompts,
            resources=caps.resources,
            tools=caps.tools,
            logging=caps.logging,
            completions=caps.completions,
        )

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28 change notifications ride subscriptions/listen, which is not relayed:
            # the SDK derives that era's capabilities from the handlers registered.
            return super().get_capabilities(
                notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
            )
        return self.mirrored.model_copy(deep=True)


# --------------------------------------------------------------------------- the proxy


def _error_result(text: str, decision: str, request_id: str | None) -> types.CallToolResult:
    meta: dict[str, Any] = {"signoff/decision": decision}
    if request_id:
        meta["signoff/request_id"] = request_id
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True, _meta=meta
    )


def _proxy_error(tool: str, exc: Exception) -> types.CallToolResult:
    return _error_result(unavailable_text(tool, f"proxy error {type(exc).__name__}: {exc}"), "error", None)


def _has_progress_token(ctx: ServerRequestContext[Any, Any]) -> bool:
    return bool(ctx.meta) and ("progress_token" in ctx.meta or "progressToken" in ctx.meta)  # type: ignore[operator]


class GatingProxy:
    """An MCP server that relays everything to one upstream and asks Signoff before each ``tools/call``.

    Args:
        config: The proxy's name and hold time.
        upstream: The connected upstream (:func:`connect_upstream`).
        gate: The Signoff client (``SIGNOFF_URL`` / ``SIGNOFF_API_KEY``).

    ``server`` is the SDK server to run over stdio or streamable HTTP, inside
    :meth:`running` (which owns the reports of executed calls).
    """

    def __init__(self, config: ProxyConfig, upstream: Upstream, gate: AsyncGateClient) -> None:
        self.config = config
        self.upstream = upstream
        self.gate = gate
        self.run_id = uuid.uuid4().hex[:16]
        self.ledger = CallLedger(config.name, self.run_id)
        self.server = _MirrorServer(upstream.init)
        # No per-message tracing span: the proxy adds as little as it can to each call.
        self.server.middleware = [self._track]
        self._listeners: deque[ServerSession] = deque(maxlen=MAX_LISTENERS)
        self._live: dict[int, ServerRequestContext[Any, Any]] = {}
        self._reports: anyio.abc.TaskGroup | None = None
        self._reporting = 0
        self._reports_done = anyio.Event()
        self._register()

    def _register(self) -> None:
        caps = self.upstream.init.capabilities
        methods: list[tuple[str, type[BaseModel]]] = []
        if caps.tools is not None:
            methods.append(("tools/list", types.PaginatedRequestParams))
            self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        if caps.resources is not None:
            methods += [
                ("resources/list", types.PaginatedRequestParams),
                ("resources/templates/list", types.PaginatedRequestParams),
                ("resources/read", types.ReadResourceRequestParams),
            ]
            if caps.resources.subscribe:
                methods += [
                    ("resources/subscribe", types.SubscribeRequestParams),
                    ("resources/unsubscribe", types.UnsubscribeRequestParams),
                ]
        if caps.prompts is not None:
            methods += [
                ("prompts/list", types.PaginatedRequestParams),
                ("prompts/get", types.GetPromptRequestParams),
            ]
        if caps.completions is not None:
            methods.append(("completion/complete", types.CompleteRequestParams))
        if caps.logging is not None:
            methods.append(("logging/setLevel", types.SetLevelRequestParams))
        for method, params_type in methods:
            self.server.add_request_handler(method, params_type, self._relay_handler(method))
        self.server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[GatingProxy]:
        """Serve inside this: reports of executed calls run here, flushed (bounded) on the way out."""
        async with anyio.create_task_group() as reports:
            self._reports = reports
            try:
                yield self
            finally:
                with anyio.move_on_after(REPORT_FLUSH, shield=True):
                    while self._reporting:
                        await self._reports_done.wait()
                reports.cancel_scope.cancel()
                self._reports = None

    # -- relaying

    async def _track(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """Middleware: remember each handshake-era connection, for the upstream's notifications."""
        if ctx.method == "initialize":
            self._listeners.append(ctx.session)
        return await call_next(ctx)

    def _relay_handler(
        self, method: str
    ) -> Callable[[ServerRequestContext[Any, Any], BaseModel], Awaitable[dict[str, Any]]]:
        async def handler(ctx: ServerRequestContext[Any, Any], params: BaseModel) -> dict[str, Any]:
            return await self._relay(ctx, method, _outbound(ctx.params))

        return handler

    @contextmanager
    def _live_request(self, ctx: ServerRequestContext[Any, Any]) -> Any:
        """A 2026-07-28 request in flight can carry the upstream's log messages (its own opt-in)."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern:
            self._live[id(ctx)] = ctx
        try:
            yield
        finally:
            if modern:
                self._live.pop(id(ctx), None)

    async def _relay(
        self, ctx: ServerRequestContext[Any, Any], method: str, params: dict[str, Any] | None
    ) -> dict[str, Any]:
        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        relay_progress: ProgressFnT | None = relay if _has_progress_token(ctx) else None
        with self._live_request(ctx):
            try:
                result = (
                    await self.upstream.session.send_request(
                        _Request(method=method, params=params), _Raw, progress_callback=relay_progress
                    )
                ).root
            except MCPError as exc:
                if self.upstream.gone.is_set():
                    raise MCPError(exc.code, f"{self.upstream.description} has exited", exc.data) from exc
                raise
            except ValidationError as exc:
                what = f"{self.upstream.description} answered {method} with a malformed result"
                raise MCPError(types.INTERNAL_ERROR, what) from exc
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28 results name their type; a handshake-era upstream's never do.
            result.setdefault("resultType", "complete")
        return result

    async def relay_notification(self, message: IncomingMessage) -> None:
        """The upstream's notifications, to the clients that can take them."""
        if isinstance(message, Exception):
            log.debug("upstream transport: %r", message)
            return
        if isinstance(message, types.ProgressNotification):
            return  # delivered per request, by the progress callbacks
        if isinstance(message, types.LoggingMessageNotification):
            for ctx in list(self._live.values()):
                if message.params.level in allowed_log_levels(ctx.protocol_version, ctx.meta):
                    await self._notify(ctx.session, message, ctx.request_id)
        for session in list(self._listeners):
            if not await self._notify(session, message, None):
                self._drop_listener(session)

    def _drop_listener(self, session: ServerSession) -> None:
        try:
            self._listeners.remove(session)
        except ValueError:
            pass

    @staticmethod
    async def _notify(
        session: ServerSession, message: types.ServerNotification, request_id: types.RequestId | None
    ) -> bool:
        try:
            await session.send_notification(message, related_request_id=request_id)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        except Exception:
            log.debug("could not pass on %s", message.method, exc_info=True)
        return True

    async def _roots_changed(self, ctx: ServerRequestContext[Any, Any], params: BaseModel) -> None:
        await self.upstream.session.send_notification(types.RootsListChangedNotification())

    # -- gating

    def _session(self, ctx: ServerRequestContext[Any, Any]) -> tuple[str | None, str]:
        """The client's session (hashed ``Mcp-Session-Id``), and the session id Signoff is given."""
        headers = getattr(ctx.request, "headers", None)
        raw = headers.get("mcp-session-id") if isinstance(headers, Mapping) else None
        client = hashlib.sha256(raw.encode()).hexdigest()[:16] if isinstance(raw, str) and raw else None
        return client, f"mcp:{self.config.name}:{self.run_id}" + (f":{client}" if client else "")

    def _metadata(self, ctx: ServerRequestContext[Any, Any], tool: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"runtime": "mcp", "mcp_server": self.config.name, "mcp_tool": tool}
        client = ctx.session.client_params
        if client is not None:
            meta["mcp_client"] = f"{client.client_info.name} {client.client_info.version}".strip()
        tool_use = (ctx.meta or {}).get("claudecode/toolUseId")
        if isinstance(tool_use, str):
            meta["tool_use_id"] = tool_use
        return meta

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> dict[str, Any] | types.CallToolResult:
        tool = gated_tool_name(self.config.name, params.name)
        arguments = dict(params.arguments or {})
        started = anyio.current_time()
        try:
            client_session, session_id = self._session(ctx)
            claim = self.ledger.claim(params.name, arguments, client_session)
            metadata = self._metadata(ctx, params.name)
        except Exception as exc:
            log.exception("the proxy failed before asking Signoff; the call is refused")
            return _error_result(
                unavailable_text(tool, f"proxy error {type(exc).__name__}: {exc}"), "error", None
            )
        ask = {"session_id": session_id, "idempotency_key": claim.key, "metadata": metadata}
        try:
            decision = await self._decide(ctx, tool, arguments, ask, started)
        except Exception as exc:
            self.ledger.park(claim)
            log.exception("the proxy failed while asking Signoff; the call is refused")
            return _error_result(
                unavailable_text(tool, f"proxy error {type(exc).__name__}: {exc}"), "error", None
            )
        except BaseException:
            self.ledger.park(claim)  # the client went away or cancelled: a retry re-attaches
            raise
        if not decision.allowed:
            return self._refusal(tool, decision, claim)
        run_with = decision.arguments(arguments)
        report = {**ask, "tool_name": tool, "arguments": run_with}
        try:
            result = await self._relay(ctx, "tools/call", _outbound(ctx.params, arguments=run_with))
        except MCPError as exc:
            self._report(report, None, exc.message)
            raise
        is_error = result.get("isError") is True
        self._report(report, result, "the tool answered isError" if is_error else None)
        return result

    async def _decide(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: str,
        arguments: dict[str, Any],
        ask: dict[str, Any],
        started: float,
    ) -> GateDecision:
        """Signoff's answer, held up to ``--hold`` seconds while a person decides."""
        first = await self.gate.pre_tool_use(tool, arguments, wait=False, **ask)
        left = self.config.hold - (anyio.current_time() - started)
        if not first.pending or left <= 0:
            return first
        async with anyio.create_task_group() as tg:
            if _has_progress_token(ctx):
                tg.start_soon(self._keep_informed, ctx, first.request_id, started)
            decision = await self.gate.pre_tool_use(tool, arguments, deadline=left, **ask)
            tg.cancel_scope.cancel()
        return decision

    async def _keep_informed(
        self, ctx: ServerRequestContext[Any, Any], request_id: str | None, started: float
    ) -> None:
        message = f"Waiting for approval in Signoff (request {request_id})"
        try:
            while True:
                waited = anyio.current_time() - started
                await ctx.session.report_progress(round(waited, 3), self.config.hold, message)
                await anyio.sleep(PROGRESS_EVERY)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return

    def _refusal(self, tool: str, decision: GateDecision, claim: Claim) -> types.CallToolResult:
        if decision.pending or decision.failure is GateFailure.TIMEOUT:
            self.ledger.park(claim)
            text = waiting_text(tool, decision.request_id, self.config.hold)
            return _error_result(text, "pending", decision.request_id)
        if decision.failure is not None:
            self.ledger.park(claim)
            return _error_result(unavailable_text(tool, decision.reason), "unavailable", decision.request_id)
        return _error_result(denied_text(tool, decision.reason), "deny", decision.request_id)

    # -- reports

    def _report(self, call: dict[str, Any], result: Any, error: str | None) -> None:
        """Report the executed call in the background: the client has its answer meanwhile."""
        if self._reports is None:
            log.warning("report of %s dropped: the proxy is stopping", call["tool_name"])
            return
        self._reporting += 1
        self._reports.start_soon(self._send_report, call, result, error)

    async def _send_report(self, call: dict[str, Any], result: Any, error: str | None) -> None:
        try:
            answer = await self.gate.post_tool_use(
                call["tool_name"],
                call["arguments"],
                result,
                error=error,
                session_id=call["session_id"],
                metadata=call["metadata"],
                idempotency_key=call["idempotency_key"],
            )
            if not answer.delivered:
                log.warning("Signoff did not take the report of %s: %s", call["tool_name"], answer.reason)
        finally:
            self._reporting -= 1
            if not self._reporting:
                self._reports_done.set()
                self._reports_done = anyio.Event()
