"""The agent API: the pre-tool-use gate, reading, waiting on and cancelling requests."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from dataclasses import replace
from typing import Annotated, Any, cast

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from prometheus_client import Counter
from pydantic import ValidationError
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from signoff.app.audit import Actor
from signoff.app.bodies import Refused, StrictJSONRoute, parse_json, storable
from signoff.app.db import transaction
from signoff.app.deps import AgentDep, RuntimeDep, SessionDep
from signoff.app.eligibility import gates_of
from signoff.app.hook_services import ServerHookServices
from signoff.app.intake import Approvals
from signoff.app.keys import authenticate_cached
from signoff.app.metrics import GATE_CALLS
from signoff.app.models import ConfirmationRequest, Status
from signoff.app.queries import request_out
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
    Unprocessable,
)
from signoff.app.single_use import record_executed
from signoff.app.state_machine import TERMINAL, get_request, transition
from signoff.app.votes import votes_for
from signoff.hooks import Decision, HookContext

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


def _check_limits(runtime: Runtime, body: PreToolUseIn | PostToolUseIn, raw: bytes | None = None) -> None:
    # Text that cannot be stored and repeated keys were refused as the body was read
    # (signoff.app.bodies, on the fast path and the route alike).
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


@router.post("/hooks/pre-tool-use", response_model=DecisionOut, responses=ERRORS)
async def run_pre_tool_use(
    body: PreToolUseIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> DecisionOut:
    """Run the agent's PreToolUse hooks: allow, deny, or a pending request for a human."""
    return await _pre_tool_use(body, agent, runtime, session)


PRE_TOOL_USE = "/v1/hooks/pre-tool-use"


class PreToolUseFastPath:
    """ASGI middleware that answers the common case of ``run_pre_tool_use`` — every gated
    tool call of every agent — ahead of FastAPI's routing and dependency solving.

    The common case: a JSON body of a declared length within ``limit``, a live key, and a
    body that validates. The hooks run in a transaction that commits before the answer,
    which is serialised as the response model would be; errors are answered by the app's
    own exception handlers. Anything else goes on to the standard route (with the body,
    if it was read), which gives the standard answers and errors.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PRE_TOOL_USE
            or scope["method"] != "POST"
            or scope["query_string"]
        ):
            await self.app(scope, receive, send)
            return
        content_type = authorization = length = b""
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                length = b""
                break
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        if (
            content_type.partition(b";")[0].strip().lower() != b"application/json"
            or not length.isdigit()
            or int(length) > self.limit
            or scheme.lower() != "bearer"
            or not token
        ):
            await self.app(scope, receive, send)
            return
        runtime: Runtime = scope["app"].state.runtime
        try:
            agent = await authenticate_cached(runtime.reads, runtime.settings.database_url, token)
        except Exception as exc:
            await (await _handled(scope, exc))(scope, receive, send)
            return
        if agent is None:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the agent hung up
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body = PreToolUseIn.model_validate(parse_json(raw))
        except (Refused, ValidationError):
            # The route reads the body by the same rule and gives the standard 422.
            await self.app(scope, _replay(raw, receive), send)
            return
        try:
            # The same transaction rule as SessionDep: commit before answering, roll back on any error.
            async with transaction(runtime.sessions) as session:
                out = await _pre_tool_use(body, agent, runtime, session, raw=raw)
            response: Response = Response(out.model_dump_json(), media_type="application/json")
        except Exception as exc:
            response = await _handled(scope, exc)
        await response(scope, receive, send)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """``receive`` for the standard route, starting with the body already read."""
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _handled(scope: Scope, exc: Exception) -> Response:
    """The app's own answer to ``exc`` (its exception handlers), or ``exc`` raised again."""
    handlers = scope["app"].exception_handlers
    for kind in type(exc).__mro__:
        if kind in handlers:
            answer = handlers[kind](Request(scope), exc)
            return cast(Response, await answer if inspect.isawaitable(answer) else answer)
    raise exc


async def _pre_tool_use(
    body: PreToolUseIn, agent: str, runtime: Runtime, session: AsyncSession, *, raw: bytes | None = None
) -> DecisionOut:
    _check_limits(runtime, body, raw)
    registry = runtime.registries.get(agent)
    if registry is None:
        return DecisionOut(decision="deny", reason=_not_configured(agent))
    services = ServerHookServices(session, runtime, agent)
    ctx = HookContext(
        agent_id=agent,
        tool_name=body.tool_name,
        arguments=body.arguments,
        user_id=body.user_id,
        session_id=body.session_id,
        tool_call_id=body.tool_call_id,
        idempotency_key=body.idempotency_key,
        metadata=body.metadata,
        services=services,
    )
    result = await registry.run_pre_tool_use(ctx)
    if (late := await services.settle()) is not None:
        # The gate timed out while its request was being written, and the write went through:
        # the request is the answer (see ServerHookServices.request_approval).
        result = replace(late, modified_arguments=result.modified_arguments)
    result = await services.conclude(ctx, result)
    made = services.approvals.request
    gate_name = gates_of(made)[0].name if made is not None else ""
    _gate_calls("pre_tool_use", agent, gate_name, result.decision.value).inc()
    request = None
    if made is not None and result.request_id == made.id:
        # A request made by this call has no votes yet.
        votes = [] if made is services.approvals.created else await votes_for(session, made.id)
        request = RequestOut.of(made, votes)
    return DecisionOut(
        decision=result.decision.value,
        reason=result.reason,
        request_id=result.request_id,
        request=request,
        modified_arguments=dict(result.modified_arguments) if result.modified_arguments is not None else None,
        grant_id=services.grant_id if result.decision is Decision.ALLOW else None,
    )


@functools.cache
def _gate_calls(point: str, agent: str, gate: str, decision: str) -> Counter:
    """The counter for one label set, looked up once (agents and gates come from the config)."""
    return GATE_CALLS.labels(point, agent, gate, decision)


def _not_configured(agent: str) -> str:
    return f"agent {agent!r} is not configured under `agents` in the Signoff configuration"


@router.post("/hooks/post-tool-use", response_model=PostToolUseOut, responses=ERRORS)
async def run_post_tool_use(
    body: PostToolUseIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> PostToolUseOut:
    """Run the agent's PostToolUse hooks: audit the call, rewrite (truncate) its result."""
    _check_limits(runtime, body)
    registry = runtime.registries.get(agent)
    if registry is None:
        return PostToolUseOut(decision="deny", reason=_not_configured(agent))
    services = ServerHookServices(session, runtime, agent)
    ctx = HookContext(
        agent_id=agent,
        tool_name=body.tool_name,
        arguments=body.arguments,
        user_id=body.user_id,
        session_id=body.session_id,
        tool_call_id=body.tool_call_id,
        idempotency_key=body.idempotency_key,
        metadata={**body.metadata, **({"error": body.error} if body.error else {})},
        result=body.result,
        services=services,
    )
    # The call ran: the approval it ran under (if any) allows nothing more.
    await record_executed(
        session,
        runtime.reads,
        agent_id=agent,
        key=Approvals.idempotency_key(ctx),
        tool_name=body.tool_name,
        arguments=body.arguments,
        redact=services.redact,
    )
    result = await registry.run_post_tool_use(ctx)
    _gate_calls("post_tool_use", agent, "", result.decision.value).inc()
    modified = result.modified_result is not None
    return PostToolUseOut(
        decision="deny" if result.decision is Decision.DENY else "allow",
        reason=result.reason,
        modified=modified,
        result=result.modified_result if modified else body.result,
    )


@router.post("/hooks/session-start", response_model=SessionStartOut, responses=ERRORS)
async def run_session_start(
    body: SessionStartIn, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> SessionStartOut:
    """Run the agent's SessionStart hooks: the context they add."""
    registry = runtime.registries.get(agent)
    if registry is None:
        return SessionStartOut(decision="deny", reason=_not_configured(agent))
    ctx = HookContext(
        agent_id=agent,
        user_id=body.user_id,
        session_id=body.session_id,
        metadata=body.metadata,
        services=ServerHookServices(session, runtime, agent),
    )
    result = await registry.run_session_start(ctx)
    _gate_calls("session_start", agent, "", result.decision.value).inc()
    return SessionStartOut(
        decision="deny" if result.decision is Decision.DENY else "allow",
        reason=result.reason,
        additional_context=result.additional_context,
    )


def _no_such_request(agent: str, request_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")


def _plausible_id(request_id: str) -> bool:
    """Whether a request could have this id; others (too long, a NUL, which PostgreSQL
    refuses in text) are answered 404 without asking the database."""
    return 0 < len(request_id) <= 32 and storable(request_id)


async def _own(runtime: Runtime, agent: str, request_id: str) -> RequestOut:
    if not _plausible_id(request_id):
        raise _no_such_request(agent, request_id)
    async with runtime.reads() as session:
        req = await get_request(session, request_id)
        if req is None or req.agent_id != agent:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")
        return await request_out(session, req)


@router.get("/requests/{request_id}", response_model=RequestOut, responses=ERRORS)
async def read_request(request_id: str, agent: AgentDep, runtime: RuntimeDep) -> RequestOut:
    """One of this agent's requests."""
    return await _own(runtime, agent, request_id)


@router.get("/requests/{request_id}/wait", response_model=RequestOut, responses=ERRORS)
async def wait_request(
    request_id: str,
    agent: AgentDep,
    runtime: RuntimeDep,
    timeout: Annotated[float, Query(ge=0, le=60, description="Seconds to wait at most (≤ 60).")] = 30,
) -> RequestOut:
    """Return as soon as the request is decided, or after ``timeout`` with its current state."""
    timeout = min(timeout, runtime.settings.max_wait_seconds)
    woken = runtime.hub.subscribe(request_id)
    try:
        current = await _own(runtime, agent, request_id)
        if current.status in TERMINAL or timeout == 0:
            return current
        try:
            async with asyncio.timeout(timeout):  # no extra task: woken in one loop turn
                await woken.wait()
        except TimeoutError:
            pass
        return await _own(runtime, agent, request_id)
    finally:
        runtime.hub.unsubscribe(request_id, woken)


@router.post(
    "/requests/{request_id}/cancel", response_model=RequestOut, responses={**ERRORS, 409: {"model": Problem}}
)
async def cancel_request(
    request_id: str, agent: AgentDep, runtime: RuntimeDep, session: SessionDep
) -> RequestOut:
    """Withdraw a pending request (the agent no longer needs the call)."""
    if not _plausible_id(request_id):
        raise _no_such_request(agent, request_id)
    req: ConfirmationRequest | None = await get_request(session, request_id)
    if req is None or req.agent_id != agent:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")
    if not await transition(
        session, request_id, Status.CANCELLED, actor=Actor("agent", agent), reason="cancelled by the agent"
    ):
        await session.refresh(req)
        raise HTTPException(status.HTTP_409_CONFLICT, f"request {request_id} is already {req.status}")
    await session.refresh(req)
    return RequestOut.of(req, await votes_for(session, request_id))
