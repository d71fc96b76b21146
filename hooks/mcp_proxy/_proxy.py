"""The gating proxy itself, on the ``mcp`` SDK: an MCP server in front of one upstream MCP server.

The proxy is the SDK's low-level :class:`~mcp.server.lowlevel.server.Server`, whose
handlers relay each request to the upstream through a
:class:`~mcp.client.session.ClientSession` and return the upstream's result as it came
(the SDK shapes it for the protocol version the client speaks). The upstream is
connected first, with the initialize handshake, so the proxy can announce the
upstream's own identity and capabilities; handlers exist only for what the upstream
offers. ``tools/call`` alone is asked of Signoff first. What the upstream sends its
client (requests and notifications) is passed on by :mod:`._clients`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, NamedTuple

from signoff.hooks._gate import GateDecision, GateFailure, canonical_json, seconds_text
from signoff.hooks.client import AsyncGateClient
from signoff.hooks.mcp_proxy._calls import (
    CallLedger,
    Claim,
    denied_text,
    expired_text,
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
    from mcp.client.session import ClientRequestContext, ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.caching import CacheableMethod, CacheHint
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel.server import NotificationOptions, Server
    from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
    from mcp.server.subscriptions import ListenHandler
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
    from mcp_types.methods import INPUT_REQUIRED_METHODS
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
    from pydantic import BaseModel, RootModel, ValidationError

    from signoff.hooks.mcp_proxy._clients import INPUT_WAIT, Clients, Exchange, connection_key
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from signoff.hooks._install import install_hint

    raise ImportError(f"signoff.hooks.mcp_proxy needs the MCP Python SDK: {install_hint('mcp')}") from exc

__all__ = ["GatingProxy", "StartupError", "Upstream", "connect_upstream"]

log = logging.getLogger("signoff.mcp_proxy")

UPSTREAM_START_TIMEOUT = 60.0
"""Seconds the upstream may take to start and complete the initialize handshake."""
PROGRESS_EVERY = 5.0
"""Seconds between progress notifications while a call waits for a person."""
REPORT_FLUSH = 3.0
"""Seconds reports of executed calls may still take when the proxy stops."""
ABANDONED = "the call was forwarded, then abandoned before its result (the upstream may have run it)"
"""The error a forwarded call is reported with when its client cancelled it, or the proxy could not
wait for its result: whether it ran is unknown, so its approval is spent all the same."""

_Request = types.Request[dict[str, Any] | None, str]


class _Raw(RootModel[dict[str, Any]]):
    """A result as the upstream sent it (after the SDK checked it against the protocol version)."""


_RESERVED_META = "io.modelcontextprotocol/"
_SIGNOFF_META = "signoff/"
"""The ``_meta`` entries of a ``tools/call`` result that say what Signoff decided: the proxy's own."""
_CLIENT_SIDE = ("inputResponses", "requestState", "task")
"""Request params that belong to the client's exchange with the proxy, never sent upstream:
the 2026-07-28 multi round-trip fields, and task augmentation, which the proxy does not offer
(a receiver that does not offer it processes the request normally)."""
_TASK_METHODS = ("tasks/get", "tasks/result", "tasks/list", "tasks/cancel", "tasks/update")
_SAMPLING = types.SamplingCapability(
    context=types.SamplingContextCapability(), tools=types.SamplingToolsCapability()
)
"""What the proxy offers the upstream: whatever a client of its may offer (each question is
then answered as that client would)."""
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


class _Watched:
    """The upstream's read stream, which notes when the upstream's side ends (a stdio server exited).

    Each message keeps the context it was received in (``last_context``): a streamable-HTTP
    upstream's request arrives in the context of the call whose stream carried it.
    """

    def __init__(self, inner: Any, gone: anyio.Event) -> None:
        self.inner = inner
        self.gone = gone
        self.closing = False

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self.inner.receive()
        except anyio.EndOfStream:
            if not self.closing:
                self.gone.set()
            raise
        return item

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@asynccontextmanager
async def connect_upstream(config: ProxyConfig, clients: Clients) -> AsyncIterator[Upstream]:
    """Start (stdio) or reach (HTTP) the upstream and complete the initialize handshake.

    The proxy offers the upstream sampling, elicitation and roots, and passes what the
    upstream sends its client to ``clients``. Leaving the context stops a stdio upstream:
    its stdin is closed, then its process group is terminated if it lingers (the SDK's
    shutdown sequence).

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

        async def sampling(
            context: ClientRequestContext, params: types.CreateMessageRequestParams
        ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
            return await clients.ask(types.CreateMessageRequest(params=params))  # type: ignore[return-value]

        async def elicitation(
            context: ClientRequestContext, params: types.ElicitRequestParams
        ) -> types.ElicitResult | types.ErrorData:
            return await clients.ask(types.ElicitRequest(params=params))  # type: ignore[return-value]

        async def roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
            params = types.RequestParams(_meta=context.meta) if context.meta else None
            return await clients.ask(types.ListRootsRequest(params=params))  # type: ignore[return-value]

        watched = _Watched(read, gone)
        session = await stack.enter_async_context(
            ClientSession(
                watched,
                write,
                sampling_callback=sampling,
                elicitation_callback=elicitation,
                list_roots_callback=roots,
                sampling_capabilities=_SAMPLING,
                message_handler=clients.notify,
                client_info=types.Implementation(name=PROG, version=_proxy_version()),
            )
        )
        try:
            with anyio.fail_after(UPSTREAM_START_TIMEOUT):
                init = await session.initialize()
        except TimeoutError as exc:
            raise StartupError(
                f"{described} did not complete the MCP handshake "
                f"within {seconds_text(UPSTREAM_START_TIMEOUT)}"
            ) from exc
        except (MCPError, ValidationError, RuntimeError, OSError, httpx2.HTTPError) as exc:
            raise StartupError(f"{described} did not complete the MCP handshake: {exc}") from exc
        try:
            yield Upstream(session, init, gone, described)
        finally:
            watched.closing = True  # the proxy is stopping: the upstream's end is no news


def _outbound(params: Mapping[str, Any] | None, **changes: Any) -> dict[str, Any] | None:
    """A client's request params as sent upstream: what belongs to the client's side dropped.

    The progress token and the 2026-07-28 envelope keys belong to the client's connection
    to the proxy (the upstream session adds its own), and so do :data:`_CLIENT_SIDE`.
    Every other field passes unchanged.
    """
    if params is None and not changes:
        return None
    out = {k: v for k, v in (params or {}).items() if k not in _CLIENT_SIDE} | changes
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
        # What the proxy relays, in both eras (at 2026-07-28 the change notifications and
        # resource subscriptions ride subscriptions/listen); tasks, extensions and
        # experimental methods are not relayed.
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
        return self.mirrored.model_copy(deep=True)


# --------------------------------------------------------------------------- the proxy


def _error_result(text: str, decision: str, request_id: str | None) -> types.CallToolResult:
    meta: dict[str, Any] = {"signoff/decision": decision}
    if request_id:
        meta["signoff/request_id"] = request_id
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True, _meta=meta
    )


def _with_receipt(result: dict[str, Any], decision: GateDecision) -> dict[str, Any]:
    """The upstream's result of a call Signoff allowed, as its client gets it: with the signed
    decision receipt the call ran under (a person approved it) in ``_meta["signoff/receipt"]``;
    the execution receipt follows from the report (the request record's ``execution_receipt``).

    ``_meta`` entries under ``signoff/`` speak for Signoff, so they are the proxy's alone: any
    the upstream wrote are dropped (a ``signoff/decision`` on a call that ran, a receipt of
    another call). The upstream's other ``_meta`` passes unchanged."""
    meta = result.get("_meta")
    own = (
        {k: v for k, v in meta.items() if not str(k).startswith(_SIGNOFF_META)}
        if isinstance(meta, Mapping)
        else {}
    )
    if decision.receipt is not None:
        own["signoff/receipt"] = decision.receipt
    if own == meta or (meta is None and not own):
        return result
    out = {k: v for k, v in result.items() if k != "_meta"}
    if own:
        out["_meta"] = own
    return out


def _proxy_error(tool: str, exc: Exception) -> types.CallToolResult:
    return _error_result(unavailable_text(tool, f"proxy error {type(exc).__name__}: {exc}"), "error", None)


def _has_progress_token(ctx: ServerRequestContext[Any, Any]) -> bool:
    return bool(ctx.meta) and ("progress_token" in ctx.meta or "progressToken" in ctx.meta)  # type: ignore[operator]


def _spent(decision: GateDecision) -> bool:
    """Whether Signoff refused the key because its approval allows nothing more (it lapsed, or
    was used): the request is approved, the answer deny. A new key asks anew."""
    request = decision.request or {}
    return not decision.allowed and decision.failure is None and request.get("status") == "approved"


def _identity(method: str, params: Mapping[str, Any] | None) -> tuple[str, str]:
    """What a request is about, which each of its rounds must repeat: a name (or URI) and the arguments."""
    p = params or {}
    if method == "resources/read":
        return str(p.get("uri", "")), ""
    arguments = p.get("arguments")
    return str(p.get("name", "")), canonical_json(arguments if isinstance(arguments, Mapping) else {})


class GatingProxy:
    """An MCP server that relays everything to one upstream and asks Signoff before each ``tools/call``.

    Args:
        config: The proxy's name and hold time.
        upstream: The connected upstream (:func:`connect_upstream`).
        gate: The Signoff client (``SIGNOFF_URL`` / ``SIGNOFF_API_KEY``).
        clients: What the upstream sends its client goes to these (the one given to
            :func:`connect_upstream`).

    ``server`` is the SDK server to run over stdio or streamable HTTP, inside
    :meth:`running` (which owns the reports of executed calls and the upstream calls of
    2026-07-28 requests relayed over several rounds).
    """

    def __init__(
        self, config: ProxyConfig, upstream: Upstream, gate: AsyncGateClient, clients: Clients
    ) -> None:
        self.config = config
        self.upstream = upstream
        self.gate = gate
        self.clients = clients
        self.ledger = CallLedger(config.name)
        self.server = _MirrorServer(upstream.init)
        # No per-message tracing span: the proxy adds as little as it can to each call. The
        # one middleware seals the requestState of 2026-07-28 rounds, and checks it back.
        security = RequestStateSecurity.ephemeral(ttl=INPUT_WAIT)
        self.server.middleware = [RequestStateBoundary(security, default_audience=f"{PROG}:{config.name}")]
        self._listen = ListenHandler(clients.bus)
        self._holders: dict[str, set[object]] = {}
        """Who holds each resource subscription the proxy holds upstream."""
        self._exchanges: dict[str, Exchange] = {}
        self._background: anyio.abc.TaskGroup | None = None
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
                self.server.add_request_handler(
                    "resources/subscribe", types.SubscribeRequestParams, self._subscribe
                )
                self.server.add_request_handler(
                    "resources/unsubscribe", types.UnsubscribeRequestParams, self._unsubscribe
                )
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
        if caps.tools is not None or caps.resources is not None or caps.prompts is not None:
            self.server.add_request_handler(
                "subscriptions/listen", types.SubscriptionsListenRequestParams, self._listen_for_changes
            )
        for method in _TASK_METHODS:
            self.server.add_request_handler(method, types.RequestParams, self._no_tasks)
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        self.server.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
        )

    @asynccontextmanager
    async def running(self) -> AsyncIterator[GatingProxy]:
        """Serve inside this: reports of executed calls run here, flushed (bounded) on the way out."""
        async with anyio.create_task_group() as background:
            self._background = background
            try:
                yield self
            finally:
                with anyio.move_on_after(REPORT_FLUSH, shield=True):
                    while self._reporting:
                        await self._reports_done.wait()
                background.cancel_scope.cancel()
                self._background = None

    def _start(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        if self._background is None:
            raise MCPError(types.INTERNAL_ERROR, "the proxy is stopping")
        self._background.start_soon(fn, *args)

    # -- relaying

    async def _initialized(self, ctx: ServerRequestContext[Any, Any], params: BaseModel) -> None:
        self.clients.connected(ctx)

    def _relay_handler(
        self, method: str
    ) -> Callable[[ServerRequestContext[Any, Any], BaseModel], Awaitable[dict[str, Any]]]:
        rounds = method in INPUT_REQUIRED_METHODS

        async def handler(ctx: ServerRequestContext[Any, Any], params: BaseModel) -> dict[str, Any]:
            if rounds and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return await self._rounds(ctx, method, _outbound(ctx.params))
            return await self._relay(ctx, method, _outbound(ctx.params))

        return handler

    async def _send(
        self, method: str, params: dict[str, Any] | None, progress: ProgressFnT | None
    ) -> dict[str, Any]:
        """The upstream's result for one request, as it sent it.

        Raises:
            MCPError: The upstream's error (naming the upstream when it has exited), or a malformed result.
        """
        try:
            return (
                await self.upstream.session.send_request(
                    _Request(method=method, params=params), _Raw, progress_callback=progress
                )
            ).root
        except MCPError as exc:
            if self.upstream.gone.is_set():
                raise MCPError(exc.code, f"{self.upstream.description} has exited", exc.data) from exc
            raise
        except ValidationError as exc:
            what = f"{self.upstream.description} answered {method} with a malformed result"
            raise MCPError(types.INTERNAL_ERROR, what) from exc

    async def _relay(
        self, ctx: ServerRequestContext[Any, Any], method: str, params: dict[str, Any] | None
    ) -> dict[str, Any]:
        async def relay(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        relay_progress: ProgressFnT | None = relay if _has_progress_token(ctx) else None
        with self.clients.relaying(ctx), self.clients.live(ctx):
            result = await self._send(method, params, relay_progress)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28 results name their type; a handshake-era upstream's never do.
            result.setdefault("resultType", "complete")
        return result

    async def _rounds(
        self,
        ctx: ServerRequestContext[Any, Any],
        method: str,
        params: dict[str, Any] | None,
        report: dict[str, Any] | None = None,
        decision: GateDecision | None = None,
    ) -> dict[str, Any]:
        """A 2026-07-28 request the upstream may ask its client about: one round of it.

        The first round starts the upstream call in the background (the questions it asks
        end the round as an ``input_required`` result); a retry carrying ``requestState``
        answers them and waits on the same call, which is neither started nor asked of
        Signoff again. A ``tools/call`` Signoff allowed (``decision``) ends, in whichever
        round, with the result carrying the decision's receipt, as in the handshake era.
        """
        state = (ctx.params or {}).get("requestState")
        if state is not None:
            exchange = self._resume(ctx, state)
        else:
            exchange = Exchange(ctx, _identity(method, ctx.params))
            self._exchanges[exchange.id] = exchange
            self._start(
                self._run_exchange, exchange, method, params, report, decision, _has_progress_token(ctx)
            )
        exchange.busy = True
        try:
            with self.clients.live(ctx):
                return await exchange.next_round(ctx)
        except BaseException:
            exchange.cancel()  # the client gave up on its request (or the upstream failed it)
            raise
        finally:
            exchange.busy = False

    def _resume(self, ctx: ServerRequestContext[Any, Any], state: Any) -> Exchange:
        exchange = self._exchanges.get(state) if isinstance(state, str) else None
        if exchange is None or (exchange.method, exchange.identity) != (
            ctx.method,
            _identity(ctx.method, ctx.params),
        ):
            raise MCPError(
                types.INVALID_PARAMS, "Invalid or expired requestState", {"reason": "invalid_request_state"}
            )
        if exchange.busy:
            raise MCPError(types.INVALID_REQUEST, "the previous round of this request is still in progress")
        responses = (ctx.params or {}).get("inputResponses") or {}
        if not isinstance(responses, Mapping):
            raise MCPError(types.INVALID_PARAMS, "inputResponses must be an object")
        exchange.answer(responses)
        return exchange

    async def _run_exchange(
        self,
        exchange: Exchange,
        method: str,
        params: dict[str, Any] | None,
        report: dict[str, Any] | None,
        decision: GateDecision | None,
        with_progress: bool,
    ) -> None:
        async def relay(progress: float, total: float | None, message: str | None) -> None:
            ctx = exchange.ctx  # the round in progress, if it is still there to hear it
            if _has_progress_token(ctx):
                try:
                    await ctx.session.report_progress(progress, total, message)
                except Exception:
                    log.debug("progress of a finished round dropped", exc_info=True)

        result: dict[str, Any] | None = None
        error: MCPError | None = None
        try:
            with exchange.scope, self.clients.relaying(exchange):
                try:
                    result = await self._send(method, params, relay if with_progress else None)
                    result.setdefault("resultType", "complete")
                except MCPError as exc:
                    error = exc
                except Exception as exc:
                    log.exception("the proxy failed relaying %s", method)
                    error = MCPError(types.INTERNAL_ERROR, f"proxy error {type(exc).__name__}: {exc}")
            if exchange.scope.cancelled_caught:  # the client abandoned its request
                if report is not None:
                    self._report(report, None, ABANDONED)
                return
            if report is not None:
                self._report_outcome(report, result, error)
            if result is not None and decision is not None:
                result = _with_receipt(result, decision)
            exchange.finish(result, error)
            with anyio.move_on_after(INPUT_WAIT):
                await exchange.collected.wait()
        finally:
            self._exchanges.pop(exchange.id, None)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> Any:
        return await self._hold(params.uri, ("connection", connection_key(ctx)), _outbound(ctx.params))

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> Any:
        return await self._release(params.uri, ("connection", connection_key(ctx)), _outbound(ctx.params))

    async def _hold(self, uri: str, holder: object, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Hold a subscription to ``uri``: the first holder subscribes upstream."""
        holders = self._holders.setdefault(uri, set())
        if holders:
            holders.add(holder)
            return {}
        holders.add(holder)
        try:
            return await self._send("resources/subscribe", params or {"uri": uri}, None)
        except BaseException:
            holders.discard(holder)
            if not holders:
                self._holders.pop(uri, None)
            raise

    async def _release(
        self, uri: str, holder: object, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Let go of ``uri``: the last holder unsubscribes upstream."""
        holders = self._holders.get(uri, set())
        holders.discard(holder)
        if holders:
            return {}
        self._holders.pop(uri, None)
        return await self._send("resources/unsubscribe", params or {"uri": uri}, None)

    async def _listen_for_changes(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A 2026-07-28 change stream: what the upstream can tell of, from its notifications."""
        caps = self.upstream.init.capabilities
        wanted = params.notifications

        def offered(asked: bool | None, capability: Any) -> bool | None:
            return True if asked and capability is not None and capability.list_changed else None

        uris = (
            list(wanted.resource_subscriptions or ()) if caps.resources and caps.resources.subscribe else []
        )
        honored = types.SubscriptionFilter(
            tools_list_changed=offered(wanted.tools_list_changed, caps.tools),
            prompts_list_changed=offered(wanted.prompts_list_changed, caps.prompts),
            resources_list_changed=offered(wanted.resources_list_changed, caps.resources),
            resource_subscriptions=uris or None,
        )
        holder = object()
        held: list[str] = []
        try:
            for uri in uris:
                await self._hold(uri, holder)
                held.append(uri)
            return await self._listen(ctx, params.model_copy(update={"notifications": honored}))
        finally:
            with anyio.move_on_after(REPORT_FLUSH, shield=True):
                for uri in held:
                    try:
                        await self._release(uri, holder)
                    except MCPError as exc:
                        log.debug("could not unsubscribe %s upstream: %s", uri, exc.message)

    async def _no_tasks(self, ctx: ServerRequestContext[Any, Any], params: BaseModel) -> None:
        raise MCPError(
            types.METHOD_NOT_FOUND,
            f"{PROG} does not relay tasks ({ctx.method}): it offers no task augmentation, and answers "
            "each tools/call when it completes",
        )

    async def _roots_changed(self, ctx: ServerRequestContext[Any, Any], params: BaseModel) -> None:
        await self.upstream.session.send_notification(types.RootsListChangedNotification())

    # -- gating

    def _session(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        """The session id Signoff is given: this process's, and the client's (hashed ``Mcp-Session-Id``).

        None for a 2026-07-28 request over HTTP: it is in no session (one self-contained POST,
        as every client of the proxy sends them; an ``Mcp-Session-Id`` on it is whatever the
        client chose), so Signoff offers it no session grant and covers it by none.
        """
        if (
            ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            and getattr(ctx.request, "headers", None) is not None
        ):
            return None
        raw = connection_key(ctx)
        return self.ledger.session(hashlib.sha256(raw.encode()).hexdigest()[:16] if raw else None)

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
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern and params.request_state is not None:
            # A later round of a call Signoff allowed and the upstream is running (the
            # requestState the proxy sealed for it, checked by the middleware).
            return await self._rounds(ctx, "tools/call", None)
        tool = gated_tool_name(self.config.name, params.name)
        arguments = dict(params.arguments or {})
        started = anyio.current_time()
        try:
            session_id = self._session(ctx)
            # A call in no session re-attaches to its retry in this process.
            claim = self.ledger.claim(params.name, arguments, session_id or self.ledger.session(None))
            metadata = self._metadata(ctx, params.name)
        except Exception as exc:
            log.exception("the proxy failed before asking Signoff; the call is refused")
            return _proxy_error(tool, exc)
        ask = {"session_id": session_id, "idempotency_key": claim.key, "metadata": metadata}
        try:
            decision = await self._decide(ctx, tool, arguments, ask, started)
            if _spent(decision):
                claim = self.ledger.renew(claim.call)  # a parked call's approval lapsed: ask anew
                ask["idempotency_key"] = claim.key
                decision = await self._decide(ctx, tool, arguments, ask, started)
        except Exception as exc:
            self.ledger.park(claim)
            log.exception("the proxy failed while asking Signoff; the call is refused")
            return _proxy_error(tool, exc)
        except BaseException:
            self.ledger.park(claim)  # the client went away or cancelled: a retry re-attaches
            log.debug("%s was cancelled before a decision; its retry re-attaches (parked)", tool)
            raise
        if not decision.allowed:
            return self._refusal(tool, decision, claim)
        run_with = decision.arguments(arguments)
        report = {**ask, "tool_name": tool, "arguments": run_with}
        outbound = _outbound(ctx.params, arguments=run_with)
        if modern:
            return await self._rounds(ctx, "tools/call", outbound, report, decision)
        try:
            result = await self._relay(ctx, "tools/call", outbound)
        except MCPError as exc:
            self._report_outcome(report, None, exc)
            raise
        except BaseException:
            self._report(report, None, ABANDONED)
            raise
        self._report_outcome(report, result, None)
        return _with_receipt(result, decision)

    async def _decide(
        self,
        ctx: ServerRequestContext[Any, Any],
        tool: str,
        arguments: dict[str, Any],
        ask: dict[str, Any],
        started: float,
    ) -> GateDecision:
        """Signoff's answer, held up to ``--hold`` seconds while a person decides. A request
        known to be pending stays the answer when Signoff cannot be heard from again within
        the hold (slow, restarting): the call waits, and its retry re-attaches."""
        first = await self.gate.pre_tool_use(tool, arguments, wait=False, **ask)
        left = self.config.hold - (anyio.current_time() - started)
        if not first.pending or left <= 0:
            return first
        async with anyio.create_task_group() as tg:
            if _has_progress_token(ctx):
                tg.start_soon(self._keep_informed, ctx, first.request_id, started)
            decision = await self.gate.pre_tool_use(tool, arguments, deadline=left, **ask)
            tg.cancel_scope.cancel()
        return first if decision.failure is GateFailure.UNAVAILABLE else decision

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
        if decision.expired:  # nobody decided: not a refusal
            return _error_result(expired_text(tool, decision.reason), "expired", decision.request_id)
        return _error_result(denied_text(tool, decision.reason), "deny", decision.request_id)

    # -- reports

    def _report_outcome(
        self, call: dict[str, Any], result: dict[str, Any] | None, error: MCPError | None
    ) -> None:
        if error is not None or result is None:
            self._report(call, None, error.message if error is not None else "no result")
        else:
            is_error = result.get("isError") is True
            self._report(call, result, "the tool answered isError" if is_error else None)

    def _report(self, call: dict[str, Any], result: Any, error: str | None) -> None:
        """Report the executed call in the background: the client has its answer meanwhile."""
        if self._background is None:
            log.warning("report of %s dropped: the proxy is stopping", call["tool_name"])
            return
        self._reporting += 1
        self._background.start_soon(self._send_report, call, result, error)

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
