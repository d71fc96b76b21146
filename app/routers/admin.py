"""The operator API: the queue, one request with its trail, decisions, the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, SecretStr
from sqlmodel import col, select

from app.audit import verify_chain
from app.confirmations import get_request, votes_for
from app.deps import AdminDep, RuntimeDep, SessionDep
from app.models import AuditEvent, ConfirmationRequest, Status
from app.operators import decide
from app.schemas import AdminRequestOut, AuditEventOut, AuditVerifyOut, DecisionIn, Problem, RequestOut
from channels import Verdict

router = APIRouter(prefix="/v1/admin", tags=["operators"], dependencies=[AdminDep])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem},
    403: {"model": Problem},
    404: {"model": Problem},
}


@router.get("/requests", response_model=list[RequestOut], responses=ERRORS)
async def list_requests(
    session: SessionDep,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    tool: Annotated[str | None, Query(max_length=500)] = None,
    before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[RequestOut]:
    """Requests, newest first, filtered by status, agent, tool; page with ``before``."""
    stmt = select(ConfirmationRequest).order_by(col(ConfirmationRequest.created_at).desc()).limit(limit)
    if status_ is not None:
        stmt = stmt.where(col(ConfirmationRequest.status) == status_)
    if agent is not None:
        stmt = stmt.where(col(ConfirmationRequest.agent_id) == agent)
    if tool is not None:
        stmt = stmt.where(col(ConfirmationRequest.tool_name) == tool)
    if before is not None:
        stmt = stmt.where(col(ConfirmationRequest.created_at) < before)
    rows = (await session.exec(stmt)).all()
    return [RequestOut.of(r, await votes_for(session, r.id)) for r in rows]


async def _admin_view(session: SessionDep, request_id: str) -> AdminRequestOut:
    req = await get_request(session, request_id)
    if req is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r}")
    events = (
        await session.exec(
            select(AuditEvent).where(col(AuditEvent.request_id) == request_id).order_by(col(AuditEvent.seq))
        )
    ).all()
    base = RequestOut.of(req, await votes_for(session, request_id))
    return AdminRequestOut(**base.model_dump(), audit=[AuditEventOut.of(e) for e in events])


@router.get("/requests/{request_id}", response_model=AdminRequestOut, responses=ERRORS)
async def read_request(request_id: str, session: SessionDep) -> AdminRequestOut:
    """One request with its votes and audit trail."""
    return await _admin_view(session, request_id)


@router.post(
    "/requests/{request_id}/decision",
    response_model=AdminRequestOut,
    responses={**ERRORS, 409: {"model": Problem}, 422: {"model": Problem}},
)
async def decide_request(
    request_id: str, body: DecisionIn, runtime: RuntimeDep, session: SessionDep
) -> AdminRequestOut:
    """Approve or reject as a named operator (a vote like any other; 409 if refused)."""
    result = await decide(
        session,
        request_id,
        verdict=Verdict(body.verdict),
        operator=body.operator,
        config=runtime.config,
        reason=body.reason,
        via="api",
    )
    if result is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r}")
    if not result.accepted:
        # The refusal is audited; commit that before answering.
        await session.commit()
        raise HTTPException(status.HTTP_409_CONFLICT, result.message)
    return await _admin_view(session, request_id)


@router.get("/audit", response_model=list[AuditEventOut], responses=ERRORS)
async def list_audit(
    session: SessionDep,
    request_id: str | None = None,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[AuditEventOut]:
    """Audit events in order, from ``after`` (a sequence number)."""
    stmt = select(AuditEvent).where(col(AuditEvent.seq) > after).order_by(col(AuditEvent.seq)).limit(limit)
    if request_id is not None:
        stmt = stmt.where(col(AuditEvent.request_id) == request_id)
    return [AuditEventOut.of(e) for e in (await session.exec(stmt)).all()]


@router.get("/audit/verify", response_model=AuditVerifyOut, responses=ERRORS)
async def verify_audit(session: SessionDep) -> AuditVerifyOut:
    """Check the hash chain end to end."""
    count, broken = await verify_chain(session)
    if broken is None:
        return AuditVerifyOut(ok=True, events=count)
    return AuditVerifyOut(ok=False, events=count, broken_at=broken.seq, problem=broken.problem)


def _masked(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return "********" if value.get_secret_value() else ""
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


@router.get("/config", responses=ERRORS)
async def read_config(runtime: RuntimeDep) -> dict[str, Any]:
    """The configuration as loaded, secrets masked."""
    cfg = runtime.config
    return {
        "source": cfg.source,
        "channels": {n: _masked(cast(BaseModel, c).model_dump()) for n, c in cfg.channels.items()},
        "people": {k: p.model_dump(exclude_none=True) for k, p in cfg.people.items()},
        "agents": {a: c.model_dump(mode="json") for a, c in cfg.agents.items()},
        "redact": sorted(cfg.redact),
    }
