"""The agent API: the pre-tool-use gate, reading, waiting on and cancelling requests."""

from __future__ import annotations

import email.message
import functools
import inspect
import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal, cast
from urllib.parse import parse_qsl

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from prometheus_client import Counter
from pydantic import Field, TypeAdapter, ValidationError
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.types import ASGIApp, Receive, Scope, Send

from signoff.app.audit import Actor
from signoff.app.bodies import Refused, parse_json, storable
from signoff.app.db import transaction
from signoff.app.deps import (
    AgentDep,
    RuntimeDep,
    SessionDep,
    agent_for,
    bearer_token,
    get_agent,
    get_runtime,
    get_session,
)
from signoff.app.metrics import GATE_CALLS
from signoff.app.models import ConfirmationRequest, Status
from signoff.app.requests.gate import CutShort, GateService
from signoff.app.requests.kernel import idempotency_key
from signoff.app.requests.single_use import record_executed
from signoff.app.requests.states import TERMINAL, get_request, transition
from signoff.app.requests.tally import votes_for
from signoff.app.routers import StrictJSONRoute
from signoff.app.runtime import Runtime
from signoff.app.schemas import (
    DecisionOut,
    PostToolUseIn,
    PostToolUseOut,
    PreToolUseIn,
    Problem,
    RequestOut,
    SessionStartIn,
    SessionStartOut,
    ToolCallIn,
    Unprocessable,
)
from signoff.app.waiters import Draining
from signoff.hooks import DEFAULT_HOOK_TIMEOUT, Decision, HookContext, HookRegistry, HookResult

router = APIRouter(prefix="/v1", tags=["agent"], route_class=StrictJSONRoute)


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem},
    404: {"model": Problem},
    413: {"model": Problem},
    422: {"model": Unprocessable},
}


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of JSON-like ``value``, stopping once past ``limit``."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return deepest


def _within_limits(raw: bytes, max_depth: int, max_bytes: int) -> bool:
    """Whether the raw JSON body alone proves both limits hold, without walking the values.

    Depth: a field's depth is at most the number of ``{`` and ``[`` in the whole body.
    Size: re-encoding as JSON turns one byte of the body into at most six (``\\u007f``).
    """
    return 6 * len(raw) <= max_bytes and raw.count(b"{") + raw.count(b"[") <= max_depth


def _check_limits(runtime: Runtime, body: ToolCallIn, raw: bytes | None = None) -> None:
    # Text that cannot be stored and repeated keys were refused as the body was read
    # (signoff.app.bodies).
    s = runtime.settings
    if raw is not None and _within_limits(raw, s.max_argument_depth, s.max_argument_bytes):
        return
    for field in ("arguments", "metadata"):
        value = getattr(body, field)
        if _depth(value, s.max_argument_depth) > s.max_argument_depth:
            raise HTTPException(422, f"{field} are nested deeper than {s.max_argument_depth} levels")
        size = len(json.dumps(value, separators=(",", ":"), default=str))
        if size > s.max_argument_bytes:
            raise HTTPException(
                422, f"{field} take {size} bytes as JSON; the limit is {s.max_argument_bytes}"
            )


PRE_TOOL_USE = "/v1/hooks/pre-tool-use"


class PreToolUseRoute(StrictJSONRoute):
    """``POST /v1/hooks/pre-tool-use``, answered by :func:`answer_pre_tool_use`: it resolves
    the endpoint's parameters itself, skipping FastAPI's generic dependency solving and
    response validation. The endpoint's signature documents the operation."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        # answer_pre_tool_use gives the endpoint exactly these: refuse one it would skip.
        if self.dependencies or [d.call for d in self.dependant.dependencies] != [
            get_agent,
            get_runtime,
            get_session,
        ]:
            raise TypeError(f"{path} is answered by answer_pre_tool_use: resolve new parameters there")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return answer_pre_tool_use


class AgentHotPaths:
    """ASGI middleware: the two calls agents make most, answered ahead of the router's search
    and FastAPI's per-route scaffolding, their errors by the app's exception handlers, as
    they would be behind the router:

    - ``POST /v1/hooks/pre-tool-use`` — every tool call of every agent — by
      :func:`answer_pre_tool_use`;
    - ``GET /v1/requests/{id}/wait`` — a parked agent, held for up to a minute, thousands at
      once — by :func:`answer_wait`, so that a parked waiter holds no more than it needs.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if method == "POST" and path == PRE_TOOL_USE:
                try:
                    response = await answer_pre_tool_use(Request(scope, receive))
                except Exception as exc:
                    response = await _handled(scope, exc)
                await response(scope, receive, send)
                return
            if method == "GET" and (request_id := _waited_on(path)) is not None:
                try:
                    body = await answer_wait(scope, request_id)
                except Exception as exc:
                    await (await _handled(scope, exc))(scope, receive, send)
                    return
                await send({"type": "http.response.start", "status": 200, "headers": _json_headers(body)})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def _handled(scope: Scope, exc: Exception) -> Response:
    """The app's own answer to ``exc`` (its exception handlers), or ``exc`` raised again."""
    handlers = scope["app"].exception_handlers
    for kind in type(exc).__mro__:
        if kind in handlers:
            answer = handlers[kind](Request(scope), exc)
            return cast(Response, await answer if inspect.isawaitable(answer) else answer)
    raise exc


async def answer_pre_tool_use(request: Request) -> Response:
    """Resolve :func:`run_pre_tool_use`'s parameters as FastAPI would, run it, answer.

    In FastAPI's order: the body is read and parsed (a body that is not JSON is a 422
    before the key is looked at), then the key is checked (401), then the body is
    validated (422, FastAPI's own error list), then the hooks run in a transaction that
    commits before the answer. Errors are answered by the app's exception handlers.
    """
    raw = await _body(request.receive)
    content_type = authorization = None
    for name, value in request.scope["headers"]:  # the first of each, as Starlette reads them
        if name == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
        elif name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
    value = _body_value(raw, content_type)
    runtime = await get_runtime(request)
    agent = await agent_for(runtime, bearer_token(authorization))  # as AgentDep
    body = _validated(value)
    _check_limits(runtime, body, raw)
    try:
        async with transaction(runtime.sessions) as session:  # as SessionDep
            out = await run_pre_tool_use(body, agent, runtime, session)
    except CutShort as exc:  # the unit of work was rolled back
        out = DecisionOut(decision="deny", reason=exc.result.reason, request_id=exc.result.request_id)
    return Response(out.model_dump_json(), media_type="application/json")


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the agent hung up: FastAPI's answer
            raise HTTPException(400, "There was an error parsing the body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


_EMPTY = object()


def _body_value(raw: bytes, content_type: str | None) -> Any:
    """The body as FastAPI hands it to validation: parsed by :func:`parse_json` when it is
    JSON (a 422 when that refuses it), its text when it is of another type."""
    if not raw:
        return _EMPTY
    if content_type == "application/json" or (content_type is not None and _is_json(content_type)):
        try:
            return parse_json(raw)
        except Refused as exc:
            raise HTTPException(422, str(exc)) from None
    return raw.decode(errors="replace")


def _validated(value: Any) -> PreToolUseIn:
    """The body as the endpoint takes it, or FastAPI's 422 (its list of errors)."""
    if value is _EMPTY:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        return PreToolUseIn.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=value) from None


def _is_json(content_type: str) -> bool:
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def run_pre_tool_use(
    body: PreToolUseIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> DecisionOut:
    """Run the agent's PreToolUse hooks: allow, deny, or a pending request for a human."""
    ran = await _run_hooks("pre_tool_use", agent, body, runtime, session)
    if ran is None:
        return DecisionOut(decision="deny", reason=_not_configured(agent))
    result, services, _ = ran
    made = services.request
    request = None
    if made is not None and result.request_id == made.id:
        # A request made by this call has no votes yet.
        votes = [] if made is services.created else await votes_for(session, made.id)
        request = RequestOut.of(made, votes, gates=services.gates)
    return DecisionOut(
        decision=result.decision.value,
        reason=result.reason,
        request_id=result.request_id,
        request=request,
        modified_arguments=dict(result.modified_arguments) if result.modified_arguments is not None else None,
        grant_id=services.grant_id if result.decision is Decision.ALLOW else None,
        receipt=request.receipt if request is not None else None,
    )


router.add_api_route(
    PRE_TOOL_USE.removeprefix(router.prefix),
    run_pre_tool_use,
    methods=["POST"],
    response_model=DecisionOut,
    responses=ERRORS,
    route_class_override=PreToolUseRoute,
)


@router.post("/hooks/post-tool-use", response_model=PostToolUseOut, responses=ERRORS)
async def run_post_tool_use(
    body: PostToolUseIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> PostToolUseOut:
    """Run the agent's PostToolUse hooks: audit the call, rewrite (truncate) its result."""
    _check_limits(runtime, body)
    ran = await _run_hooks("post_tool_use", agent, body, runtime, session)
    if ran is None:
        return PostToolUseOut(decision="deny", reason=_not_configured(agent))
    result, _, receipt = ran
    modified = result.modified_result is not None
    return PostToolUseOut(
        decision=_allow_or_deny(result),
        reason=result.reason,
        modified=modified,
        result=result.modified_result if modified else body.result,
        receipt=receipt,
    )


@router.post("/hooks/session-start", response_model=SessionStartOut, responses=ERRORS)
async def run_session_start(
    body: SessionStartIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> SessionStartOut:
    """Run the agent's SessionStart hooks: the context they add."""
    ran = await _run_hooks("session_start", agent, body, runtime, session)
    if ran is None:
        return SessionStartOut(decision="deny", reason=_not_configured(agent))
    result, _, _ = ran
    return SessionStartOut(
        decision=_allow_or_deny(result), reason=result.reason, additional_context=result.additional_context
    )


Point = Literal["pre_tool_use", "post_tool_use", "session_start"]

_RUN: dict[Point, Callable[[HookRegistry, HookContext], Coroutine[Any, Any, HookResult]]] = {
    "pre_tool_use": HookRegistry.run_pre_tool_use,
    "post_tool_use": HookRegistry.run_post_tool_use,
    "session_start": HookRegistry.run_session_start,
}


async def _run_hooks(
    point: Point, agent: str, body: ToolCallIn | SessionStartIn, runtime: Runtime, session: AsyncSession
) -> tuple[HookResult, GateService, dict[str, Any] | None] | None:
    """Run the agent's hooks at ``point`` and count the answer, with the execution receipt of
    the approved call a post-tool-use report closed; None for an agent the configuration does
    not name."""
    registry = runtime.registries.get(agent)
    timeout = registry.timeout if registry is not None else DEFAULT_HOOK_TIMEOUT
    services = GateService.for_call(session, runtime, agent, time_limit=timeout)
    ctx = _context(agent, body, services)
    receipt = None
    if point == "post_tool_use":
        # The call ran: the approval it ran under (if any) allows nothing more, even when a
        # reload has taken the agent out of the configuration since (its key still reports,
        # and the agent may be put back while the approval would still be valid).
        receipt = await record_executed(
            session,
            runtime.reads,
            agent_id=agent,
            key=idempotency_key(ctx),
            tool_name=ctx.tool_name,
            arguments=ctx.arguments,
            redact=services.redact,
            result=ctx.result,
            error=body.error if isinstance(body, PostToolUseIn) else None,
            session_id=ctx.session_id,
        )
    if registry is None:
        return None
    result = await _RUN[point](registry, ctx)
    if point == "pre_tool_use":
        # The kernel's answer applied: a new request written, a grant's use counted.
        result = await services.conclude(ctx, result)
    gates = services.gates
    gate_name = gates[0].name if gates else ""
    _gate_calls(point, agent, gate_name, result.decision.value).inc()
    return result, services, receipt


def _context(agent: str, body: ToolCallIn | SessionStartIn, services: GateService) -> HookContext:
    """What the hooks see of the call (or of the session start) the agent reported."""
    call = body if isinstance(body, ToolCallIn) else None
    metadata = body.metadata
    if isinstance(body, PostToolUseIn) and body.error:
        metadata = {**metadata, "error": body.error}
    return HookContext(
        agent_id=agent,
        tool_name=call.tool_name if call else "",
        arguments=call.arguments if call else {},
        user_id=body.user_id,
        session_id=body.session_id,
        tool_call_id=call.tool_call_id if call else None,
        idempotency_key=call.idempotency_key if call else None,
        metadata=metadata,
        result=body.result if isinstance(body, PostToolUseIn) else None,
        services=services,
    )


def _allow_or_deny(result: HookResult) -> Literal["allow", "deny"]:
    return "deny" if result.decision is Decision.DENY else "allow"


@functools.cache
def _gate_calls(point: str, agent: str, gate: str, decision: str) -> Counter:
    """The counter for one label set, looked up once (agents and gates come from the config)."""
    return GATE_CALLS.labels(point, agent, gate, decision)


def _not_configured(agent: str) -> str:
    return f"agent {agent!r} is not configured under `agents` in the Signoff configuration"


def _no_such_request(agent: str, request_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")


def _plausible_id(request_id: str) -> bool:
    """Whether a request could have this id; others (too long, a NUL, which PostgreSQL
    refuses in text) are answered 404 without asking the database."""
    return 0 < len(request_id) <= 32 and storable(request_id)


async def _own(runtime: Runtime, agent: str, request_id: str) -> RequestOut:
    if not _plausible_id(request_id):
        raise _no_such_request(agent, request_id)
    current = await runtime.current.get(request_id)
    if current is None or current.agent_id != agent:
        raise _no_such_request(agent, request_id)
    return current


@router.get("/requests/{request_id}", response_model=RequestOut, responses=ERRORS)
async def read_request(request_id: str, agent: AgentDep, runtime: RuntimeDep) -> RequestOut:
    """One of this agent's requests."""
    return await _own(runtime, agent, request_id)


_WAIT_PREFIX, _WAIT_SUFFIX = "/v1/requests/", "/wait"
WAIT_SECONDS = 30.0
"""How long a wait lasts when it does not say."""
_TIMEOUT = TypeAdapter(Annotated[float, Field(ge=0, le=60)])
"""``timeout`` as :func:`wait_request` declares it (the route's ``Query``)."""


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]


def _waited_on(path: str) -> str | None:
    """The request id of a ``/v1/requests/{id}/wait`` path (as the route matches it), or None."""
    if path.startswith(_WAIT_PREFIX) and path.endswith(_WAIT_SUFFIX):
        request_id = path[len(_WAIT_PREFIX) : -len(_WAIT_SUFFIX)]
        if request_id and "/" not in request_id:
            return request_id
    return None


async def answer_wait(scope: Scope, request_id: str) -> bytes:
    """``GET /v1/requests/{id}/wait`` answered from the ASGI scope: the parameters resolved
    in FastAPI's order (the key, 401; then ``timeout``, FastAPI's 422), then
    :func:`wait_for`; the answer is the request as JSON. Errors are raised for the app's
    exception handlers."""
    runtime: Runtime = scope["app"].state.runtime
    authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
    agent = await agent_for(runtime, bearer_token(authorization.decode("latin-1") if authorization else None))
    current = await wait_for(runtime, agent, request_id, _timeout_param(scope.get("query_string", b"")))
    return current.__pydantic_serializer__.to_json(current)


def _timeout_param(query: bytes) -> float:
    """The wait's ``timeout`` from its query string, validated as FastAPI validates it
    (parsed apart from the wait, which holds nothing of it while parked)."""
    # the last of each, as Starlette reads them
    given = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)) if b"timeout" in query else {}
    if "timeout" not in given:
        return WAIT_SECONDS
    try:
        timeout: float = _TIMEOUT.validate_python(given["timeout"])
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        located = [{**e, "loc": ("query", "timeout", *e["loc"])} for e in errors]
        raise RequestValidationError(located) from None
    return timeout


@router.get("/requests/{request_id}/wait", response_model=RequestOut, responses=ERRORS)
async def wait_request(
    request_id: str,
    agent: AgentDep,
    runtime: RuntimeDep,
    timeout: Annotated[
        float, Query(ge=0, le=60, description="Seconds to wait at most (≤ 60).")
    ] = WAIT_SECONDS,
) -> RequestOut:
    """Return as soon as the request is decided, or after ``timeout`` with its current state.
    While this server is stopping, an undecided request is answered 503 with ``Retry-After``
    at once: wait again (another server, or this one restarted, answers).

    Answered by :class:`AgentHotPaths` ahead of the router (through :func:`wait_for`, as
    here); this route documents the operation and answers where that middleware is not
    installed."""
    return await wait_for(runtime, agent, request_id, timeout)


async def wait_for(runtime: Runtime, agent: str, request_id: str, timeout: float) -> RequestOut:
    """The waiting itself: ``agent``'s request ``request_id`` once decided, or after
    ``timeout`` seconds as it is then; 404 for a request not the agent's; :class:`Draining`
    (503 with ``Retry-After``) for one undecided while this server stops."""
    timeout = min(timeout, runtime.settings.max_wait_seconds)
    woken, tick = runtime.hub.subscribe(request_id, timeout or None)
    try:
        current = await _own(runtime, agent, request_id)
        if current.status in TERMINAL or timeout == 0:
            return current
        del current  # a parked waiter holds no copy of its request
        answer = await woken  # a decision, the drain, or the timeout (then None)
        # Woken by a commit of this server: answered as it committed, without reading again.
        if answer is not None and answer.agent_id == agent:
            return answer
        current = await _own(runtime, agent, request_id)
        if runtime.hub.draining and current.status not in TERMINAL:
            raise Draining(request_id)  # 503 with Retry-After: re-attach to another server
        return current
    finally:
        runtime.hub.unsubscribe(request_id, woken, tick)


@router.post(
    "/requests/{request_id}/cancel", response_model=RequestOut, responses={**ERRORS, 409: {"model": Problem}}
)
async def cancel_request(
    request_id: str, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> RequestOut:
    """Withdraw a pending request (the agent no longer needs the call)."""
    if not _plausible_id(request_id):
        raise _no_such_request(agent, request_id)
    req: ConfirmationRequest | None = await get_request(session, request_id, for_update=True)
    if req is None or req.agent_id != agent:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")
    if not await transition(
        session, request_id, Status.CANCELLED, actor=Actor("agent", agent), reason="cancelled by the agent"
    ):
        raise HTTPException(status.HTTP_409_CONFLICT, f"request {request_id} is already {req.status}")
    return RequestOut.of(req, await votes_for(session, request_id))
