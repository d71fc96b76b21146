"""The proxy's clients: who is connected, which requests are in flight, and what the upstream sends them.

Behind the proxy, the upstream's one client is the proxy; this module passes on to the
proxy's own clients what the upstream sends its client.

**Requests** (``sampling/createMessage``, ``elicitation/create``, ``roots/list``) go to
the client whose request the upstream is serving, in that client's protocol era:

- a handshake-era client is sent the request, on the stream of the request it concerns;
- a 2026-07-28 client, which no server may send requests to, gets its request answered
  with an ``input_required`` result carrying the questions (the multi round-trip
  pattern): the upstream's call runs on in the proxy (:class:`Exchange`) until the
  client retries with its answers and the sealed ``requestState``.

A client that did not declare the capability is not asked: the upstream gets the answer
a client without it gives (the SDK's own words). Which request a question concerns: a
streamable-HTTP upstream sends it on that request's stream, which the proxy follows
(:data:`ORIGIN`); otherwise the one request in flight; otherwise (``roots/list`` when the
upstream starts, say) the one handshake-era client connected, waited for a moment if
none has connected yet. A question the proxy cannot place is refused, saying why.

**Notifications** go to every handshake-era client (as the upstream sends them to its
one client), log messages also to the 2026-07-28 requests in flight that opted in, and
change notifications to the 2026-07-28 ``subscriptions/listen`` streams through
:attr:`Clients.bus`.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import IncomingMessage
from mcp.server.connection import allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.server.validation import wants_sampling_tools
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

__all__ = ["ORIGIN", "Clients", "Exchange", "connection_key", "refusal"]

log = logging.getLogger("signoff.mcp_proxy")

CLIENT_WAIT = 10.0
"""Seconds a question that concerns no request waits for a handshake-era client to connect."""
INPUT_WAIT = 600.0
"""Seconds a 2026-07-28 client has to come back with its answers; then the upstream's call is cancelled."""
MAX_CONNECTIONS = 1000

ORIGIN: ContextVar[ServerRequestContext[Any, Any] | Exchange | None] = ContextVar(
    "signoff_mcp_origin", default=None
)
"""The client request the current upstream call relays (set around it; a streamable-HTTP
upstream's questions arrive in the context of the call whose stream carried them)."""

_RESULT_TYPES: dict[str, type[types.Result]] = {
    "sampling/createMessage": types.CreateMessageResult,
    "elicitation/create": types.ElicitResult,
    "roots/list": types.ListRootsResult,
}
_EVENTS: dict[str, ServerEvent] = {
    "notifications/tools/list_changed": ToolsListChanged(),
    "notifications/prompts/list_changed": PromptsListChanged(),
    "notifications/resources/list_changed": ResourcesListChanged(),
}


def connection_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The client connection a request came on: its ``Mcp-Session-Id`` over HTTP, ``None`` over stdio."""
    headers = getattr(ctx.request, "headers", None)
    raw = headers.get("mcp-session-id") if isinstance(headers, Mapping) else None
    return raw if isinstance(raw, str) and raw else None


def refusal(
    request: types.InputRequest, capabilities: types.ClientCapabilities | None
) -> types.ErrorData | None:
    """What a client with ``capabilities`` answers ``request`` when it does not support it, else ``None``."""
    if isinstance(request, types.CreateMessageRequest):
        sampling = capabilities.sampling if capabilities else None
        if sampling is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="Sampling not supported")
        if wants_sampling_tools(request.params.tools, request.params.tool_choice) and sampling.tools is None:
            return types.ErrorData(
                code=types.INVALID_PARAMS, message="Client does not support sampling tools capability"
            )
    elif isinstance(request, types.ElicitRequest):
        elicitation = capabilities.elicitation if capabilities else None
        if elicitation is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="Elicitation not supported")
        # An empty elicitation capability is form mode alone (the handshake era's default).
        form = elicitation.form is not None or elicitation.url is None
        mode = request.params.mode
        if (mode == "url" and elicitation.url is None) or (mode == "form" and not form):
            mode_name = "URL" if mode == "url" else "Form"
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"{mode_name}-mode elicitation not supported"
            )
    elif capabilities is None or capabilities.roots is None:
        return types.ErrorData(code=types.INVALID_REQUEST, message="List roots not supported")
    return None


def _without_task(request: types.InputRequest) -> types.InputRequest:
    """The request as relayed: task augmentation is not offered to the upstream, so it is ignored."""
    params = request.params
    if params is not None and getattr(params, "task", None) is not None:
        return request.model_copy(update={"params": params.model_copy(update={"task": None})})
    return request


def _result_type(request: types.InputRequest) -> Any:
    """The model of a client's answer to ``request``."""
    if isinstance(request, types.CreateMessageRequest) and wants_sampling_tools(
        request.params.tools, request.params.tool_choice
    ):
        return types.CreateMessageResultWithTools
    return _RESULT_TYPES[request.method]


async def _send(
    session: ServerSession, request: types.InputRequest, related: types.RequestId | None
) -> types.InputResponse | types.ErrorData:
    try:
        answer: types.InputResponse = await session.send_request(
            request, _result_type(request), metadata=ServerMessageMetadata(related_request_id=related)
        )
    except MCPError as exc:
        return exc.error
    except ValidationError:
        return types.ErrorData(
            code=types.INTERNAL_ERROR, message=f"the client answered {request.method} malformed"
        )
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return types.ErrorData(code=types.CONNECTION_CLOSED, message="the client went away")
    return answer


class _Question:
    def __init__(self, request: types.InputRequest) -> None:
        self.request = request
        self.wire = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.result_type = _result_type(request)
        self.answer: types.InputResponse | None = None
        self.answered = anyio.Event()


class Exchange:
    """A 2026-07-28 request relayed over several rounds while the upstream's one call runs on.

    The upstream call runs in the proxy, not in the client's request; each round of the
    client's (its first request, then each retry carrying ``requestState``) gets the
    upstream's result, or the questions the upstream asked meanwhile as an
    ``input_required`` result. Answers reach the upstream as its questions' answers.
    """

    def __init__(self, ctx: ServerRequestContext[Any, Any], identity: tuple[str, str]) -> None:
        self.id = secrets.token_urlsafe(18)
        self.method = ctx.method
        self.identity = identity
        """What the request is about (tool or prompt name, or URI, and its canonical arguments)."""
        self.ctx = ctx
        """The current round: progress and log messages go to it."""
        self.scope = anyio.CancelScope()
        self.busy = False
        self.collected = anyio.Event()
        self._questions: dict[str, _Question] = {}
        self._keys = itertools.count(1)
        self._news = anyio.Event()
        self._result: dict[str, Any] | None = None
        self._error: MCPError | None = None
        self._finished = False
        self._abandoned = False

    # -- the upstream's side

    async def ask(self, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        """Put ``request`` to the client at its next round; the answer (waited for up to INPUT_WAIT)."""
        question = _Question(_without_task(request))
        key = str(next(self._keys))
        self._questions[key] = question
        self._news.set()
        try:
            with anyio.move_on_after(INPUT_WAIT):
                await question.answered.wait()
        finally:
            self._questions.pop(key, None)  # answered, or no longer asked
        if question.answer is not None:
            return question.answer
        if not self._abandoned:
            self.cancel()  # the client never came back: its call is abandoned
        return types.ErrorData(code=types.REQUEST_TIMEOUT, message="the client did not answer")

    def finish(self, result: dict[str, Any] | None, error: MCPError | None = None) -> None:
        self._result, self._error, self._finished = result, error, True
        self._news.set()

    def cancel(self) -> None:
        """The client abandoned the request: the upstream's call is cancelled, its questions withdrawn."""
        self._abandoned = True
        self.scope.cancel()
        self.collected.set()
        for question in self._questions.values():
            question.answered.set()

    # -- the client's side

    def answer(self, responses: Mapping[str, Any]) -> None:
        """Take the client's ``inputResponses``; keys the proxy did not ask (or already has) are ignored.

        Raises:
            MCPError: An answer is not a valid answer to its question (the question stays asked).
        """
        for key, raw in responses.items():
            question = self._questions.get(key)
            if question is None:
                continue
            try:
                question.answer = question.result_type.model_validate(raw, by_name=False)
            except ValidationError:
                raise MCPError(
                    types.INVALID_PARAMS,
                    f"inputResponses[{key!r}] is not an answer to {question.request.method}",
                ) from None
            del self._questions[key]
            question.answered.set()

    async def next_round(self, ctx: ServerRequestContext[Any, Any]) -> dict[str, Any]:
        """This round's answer: the upstream's result, or the questions still unanswered.

        Raises:
            MCPError: The upstream's error.
        """
        self.ctx = ctx
        while True:
            if self._finished:
                self.collected.set()
                if self._error is not None:
                    raise self._error
                assert self._result is not None
                return self._result
            if self._questions:
                return {
                    "resultType": "input_required",
                    "inputRequests": {key: q.wire for key, q in self._questions.items()},
                    "requestState": self.id,
                }
            await self._news.wait()
            self._news = anyio.Event()


class Clients:
    """The proxy's clients, as the upstream's messages need them."""

    def __init__(self) -> None:
        self.bus = InMemorySubscriptionBus()
        """Change events for 2026-07-28 ``subscriptions/listen`` streams."""
        self._connections: dict[str | None, ServerSession] = {}
        """Handshake-era clients that completed the handshake, by :func:`connection_key`."""
        self._connected = anyio.Event()
        self._in_flight: dict[int, ServerRequestContext[Any, Any] | Exchange] = {}
        self._live: dict[int, ServerRequestContext[Any, Any]] = {}

    # -- connections

    def connected(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """A handshake-era client completed the handshake (``notifications/initialized``)."""
        key = connection_key(ctx)
        self._connections.pop(key, None)
        self._connections[key] = ctx.session
        while len(self._connections) > MAX_CONNECTIONS:
            self._connections.pop(next(iter(self._connections)))
        self._connected.set()

    def _disconnected(self, session: ServerSession) -> None:
        for key, known in list(self._connections.items()):
            if known is session:
                del self._connections[key]

    # -- requests in flight

    @contextmanager
    def relaying(self, origin: ServerRequestContext[Any, Any] | Exchange) -> Iterator[None]:
        """Around an upstream call: the client request it relays, for the questions it causes."""
        token = ORIGIN.set(origin)
        self._in_flight[id(origin)] = origin
        try:
            yield
        finally:
            del self._in_flight[id(origin)]
            ORIGIN.reset(token)

    @contextmanager
    def live(self, ctx: ServerRequestContext[Any, Any]) -> Iterator[None]:
        """A 2026-07-28 request in flight can carry the upstream's log messages (its own opt-in)."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern:
            self._live[id(ctx)] = ctx
        try:
            yield
        finally:
            if modern:
                self._live.pop(id(ctx), None)

    # -- the upstream's requests

    async def ask(self, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        """The upstream's question, put to the client it concerns; its answer, or the error to give."""
        origin = ORIGIN.get()
        if origin is None and len(self._in_flight) == 1:
            (origin,) = self._in_flight.values()
        if isinstance(origin, Exchange):
            refused = refusal(request, origin.ctx.session.client_capabilities)
            return refused or await origin.ask(request)
        if origin is not None and origin.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message=f"{request.method} cannot reach a 2026-07-28 client during {origin.method}",
            )
        if origin is not None:
            session, related = origin.session, origin.request_id
        else:
            placed = await self._unattributed()
            if isinstance(placed, types.ErrorData):
                return placed
            session, related = placed, None
        return refusal(request, session.client_capabilities) or await _send(
            session, _without_task(request), related
        )

    async def _unattributed(self) -> ServerSession | types.ErrorData:
        """The client for a question that concerns no request in flight: the one connected."""
        if not self._connections and not self._in_flight:
            with anyio.move_on_after(CLIENT_WAIT):
                await self._connected.wait()
        sessions = list(self._connections.values())
        if len(sessions) == 1:
            return sessions[0]
        why = (
            "no handshake-era client is connected"
            if not sessions
            else f"{len(sessions)} clients are connected"
        )
        return types.ErrorData(
            code=types.INVALID_REQUEST, message=f"the proxy cannot tell which client this is for: {why}"
        )

    # -- the upstream's notifications

    async def notify(self, message: IncomingMessage) -> None:
        """The upstream's notifications, to the clients that can take them."""
        if isinstance(message, Exception):
            log.debug("upstream transport: %r", message)
            return
        if isinstance(message, types.ProgressNotification):
            return  # delivered per request, by the progress callbacks
        if isinstance(message, types.LoggingMessageNotification):
            for ctx in list(self._live.values()):
                if message.params.level in allowed_log_levels(ctx.protocol_version, ctx.meta):
                    await self._send_notification(ctx.session, message, ctx.request_id)
        elif (event := _EVENTS.get(message.method)) is not None:
            await self.bus.publish(event)
        elif isinstance(message, types.ResourceUpdatedNotification):
            await self.bus.publish(ResourceUpdated(uri=message.params.uri))
        for session in list(self._connections.values()):
            if not await self._send_notification(session, message, None):
                self._disconnected(session)

    @staticmethod
    async def _send_notification(
        session: ServerSession, message: types.ServerNotification, request_id: types.RequestId | None
    ) -> bool:
        try:
            await session.send_notification(message, related_request_id=request_id)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        except Exception:
            log.debug("could not pass on %s", message.method, exc_info=True)
        return True
