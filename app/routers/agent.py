"""The agent API: the pre-tool-use gate, reading, waiting on and cancelling requests."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from app.audit import Actor
from app.confirmations import TERMINAL, get_request, transition, votes_for
from app.deps import AgentDep, RuntimeDep, SessionDep
from app.hook_services import ServerHookServices
from app.metrics import GATE_CALLS
from app.models import ConfirmationRequest, Status
from app.runtime import Runtime
from app.schemas import (
    DecisionOut,
    PostToolUseIn,
    PostToolUseOut,
    PreToolUseIn,
    Problem,
    RequestOut,
    SessionStartIn,
    SessionStartOut,
)
from hooks import Decision, HookContext

router = APIRouter(prefix="/v1", tags=["agent"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem},
    404: {"model": Problem},
    413: {"model": Problem},
    422: {"model": Problem},
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


def _check_limits(runtime: Runtime, body: PreToolUseIn | PostToolUseIn) -> None:
    s = runtime.settings
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
    _check_limits(runtime, body)
    registry = runtime.registries.get(agent)
    if registry is None:
        return DecisionOut(decision="deny", reason=_not_configured(agent))
    services = ServerHookServices(session, runtime.config, agent)
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
    made = services.approvals.request
    gate_name = str(made.gate.get("name", "")) if made is not None else ""
    GATE_CALLS.labels("pre_tool_use", agent, gate_name, result.decision.value).inc()
    request = None
    if made is not None and result.request_id == made.id:
        request = RequestOut.of(made, await votes_for(session, made.id))
    return DecisionOut(
        decision=result.decision.value,
        reason=result.reason,
        request_id=result.request_id,
        request=request,
        modified_arguments=dict(result.modified_arguments) if result.modified_arguments is not None else None,
    )


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
    ctx = HookContext(
        agent_id=agent,
        tool_name=body.tool_name,
        arguments=body.arguments,
        user_id=body.user_id,
        session_id=body.session_id,
        tool_call_id=body.tool_call_id,
        metadata={**body.metadata, **({"error": body.error} if body.error else {})},
        result=body.result,
        services=ServerHookServices(session, runtime.config, agent),
    )
    result = await registry.run_post_tool_use(ctx)
    GATE_CALLS.labels("post_tool_use", agent, "", result.decision.value).inc()
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
        services=ServerHookServices(session, runtime.config, agent),
    )
    result = await registry.run_session_start(ctx)
    GATE_CALLS.labels("session_start", agent, "", result.decision.value).inc()
    return SessionStartOut(
        decision="deny" if result.decision is Decision.DENY else "allow",
        reason=result.reason,
        additional_context=result.additional_context,
    )


async def _own(runtime: Runtime, agent: str, request_id: str) -> RequestOut:
    async with runtime.reads() as session:
        req = await get_request(session, request_id)
        if req is None or req.agent_id != agent:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r} for agent {agent!r}")
        return RequestOut.of(req, await votes_for(session, request_id))


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
            await asyncio.wait_for(woken.wait(), timeout)
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
