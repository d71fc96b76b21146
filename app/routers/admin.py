"""The operator API: the queue, one request with its trail, decisions, grants, personal tokens,
the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.responses import JSONResponse
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import queries, switches, tokens
from signoff.app.audit import Actor
from signoff.app.bodies import storable
from signoff.app.db import transaction
from signoff.app.deps import AdminDep, ReadsDep, RuntimeDep, SessionDep
from signoff.app.models import Status, as_utc, utcnow
from signoff.app.operators import GrantNamed, decide
from signoff.app.queries import RequestFilter
from signoff.app.replicas import live_replicas
from signoff.app.requests import grants
from signoff.app.routers import StrictJSONRoute, refusal
from signoff.app.schemas import (
    AdminRequestOut,
    AuditEventOut,
    AuditVerifyOut,
    DecisionIn,
    GrantOut,
    Problem,
    ReloadOut,
    RequestOut,
    SwitchIn,
    SwitchOut,
    TokenOut,
    Unprocessable,
)

router = APIRouter(
    prefix="/v1/admin", tags=["operators"], dependencies=[AdminDep], route_class=StrictJSONRoute
)
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem},
    403: {"model": Problem},
    404: {"model": Problem},
}


@router.get("/requests", response_model=list[RequestOut], responses=ERRORS)
async def list_requests(
    session: ReadsDep,
    status_: Annotated[Status | None, Query(alias="status")] = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    tool: Annotated[str | None, Query(max_length=500)] = None,
    before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[RequestOut]:
    """Requests, newest first, filtered by status, agent, tool; page with ``before`` (a time
    without a zone is UTC)."""
    which = RequestFilter(status=status_, agent=agent, tool=tool, before=_utc(before))
    rows = await queries.list_requests(session, which, limit=limit)
    return await queries.request_outs(session, rows)


def _utc(moment: datetime | None) -> datetime | None:
    """``moment`` in UTC (one without a zone is UTC, as the command line and the console read
    it); 422 for one whose UTC falls outside the years a date can hold."""
    if moment is None:
        return None
    try:
        return as_utc(moment)
    except OverflowError:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, f"before {moment.isoformat()} is out of range in UTC"
        ) from None


async def _admin_view(session: AsyncSession, request_id: str) -> AdminRequestOut:
    view = await queries.admin_view(session, request_id)
    if view is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r}")
    return view


@router.get("/requests/{request_id}", response_model=AdminRequestOut, responses=ERRORS)
async def read_request(request_id: str, session: ReadsDep) -> AdminRequestOut:
    """One request with its votes and audit trail."""
    return await _admin_view(session, request_id)


@router.post(
    "/requests/{request_id}/decision",
    response_model=AdminRequestOut,
    responses={**ERRORS, 409: {"model": Problem}, 410: {"model": Problem}, 422: {"model": Unprocessable}},
)
async def decide_request(
    request_id: str, body: DecisionIn, runtime: RuntimeDep
) -> AdminRequestOut | JSONResponse:
    """Approve or reject as a named operator (a vote like any other; 409 if refused).

    The callback contract: the same operator's same decision again answers 200 with the
    request as it stands; a conflicting decision after the request is decided answers 409
    naming the final state and who made it; an expired or cancelled request answers 410.

    ``grant``: approve with one of the grants the request's gates offer instead of approving
    once; a grant they do not offer is refused (409) and nothing changes. ``arguments``:
    approve with those argument fields changed; a change the gates do not allow (a field not
    ``editable``, a redacted one, one that would bring the call under a gate not asked) is
    refused (422) and nothing changes."""
    grant = None
    if body.grant is not None:
        seconds = int(body.grant.for_.total_seconds())
        grant = GrantNamed(body.grant.scope, seconds, body.grant.same)
    async with transaction(runtime.sessions) as session:
        result = await decide(
            session,
            request_id,
            verdict=body.verdict,
            operator=body.operator,
            config=runtime.config,
            reason=body.reason,
            grant=grant,
            arguments=body.arguments,
            via="api",
        )
    if result is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r}")
    if (refused := refusal(result)) is not None:
        return refused
    # Read once the decision has committed (the waiting agents answer first): the trail
    # with it.
    async with runtime.reads() as reads:
        return await queries.admin_view_of(reads, result.request)


@router.get("/grants", response_model=list[GrantOut], responses=ERRORS)
async def list_grants(
    session: ReadsDep,
    active: bool | None = None,
    agent: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[GrantOut]:
    """Grants newest first: who may still act without asking (``active=true``), or every one."""
    now = utcnow()
    rows = await grants.list_grants(session, active=active, agent=agent, now=now, limit=limit)
    return [GrantOut.of(g, now) for g in rows]


@router.delete("/grants/{grant_id}", response_model=GrantOut, responses={**ERRORS, 409: {"model": Problem}})
async def revoke_grant(
    grant_id: Annotated[str, Path(max_length=64)],
    session: SessionDep,
    operator: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> GrantOut | JSONResponse:
    """Revoke a grant (audited): from the next call on, on every replica, it allows nothing."""
    if operator is not None and not storable(operator):
        raise HTTPException(422, "operator must not contain NUL characters or lone surrogates")
    if not storable(grant_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no grant {grant_id!r}")
    now = utcnow()
    actor = Actor("api", operator, operator) if operator else Actor("api", None, "operator API")
    grant, revoked = await grants.revoke(session, grant_id, actor=actor, now=now)
    if grant is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no grant {grant_id!r}")
    if not revoked:
        when = grant.revoked_at.strftime("%Y-%m-%d %H:%M:%S UTC") if grant.revoked_at else "?"
        return JSONResponse(
            {"detail": f"grant {grant_id} was already revoked at {when} by {grant.revoked_by}"},
            status.HTTP_409_CONFLICT,
        )
    return GrantOut.of(grant, now)


@router.get("/tokens", response_model=list[TokenOut], responses=ERRORS)
async def list_tokens(
    session: ReadsDep,
    person: Annotated[str | None, Query(max_length=300)] = None,
    active: bool | None = None,
) -> list[TokenOut]:
    """Personal tokens not yet expired, newest first: everyone's, or ``person``'s;
    ``active=true``: only those not revoked (never a token's text)."""
    if person is not None and not storable(person):
        return []
    now = utcnow()
    return [TokenOut.of(t, now) for t in await tokens.list_tokens(session, person=person, live=bool(active))]


@router.delete("/tokens/{token_id}", response_model=TokenOut, responses={**ERRORS, 409: {"model": Problem}})
async def revoke_token(
    token_id: Annotated[str, Path(max_length=64)],
    session: SessionDep,
    operator: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> TokenOut | JSONResponse:
    """Revoke anyone's personal token (audited): from then on, on every replica, it decides
    nothing."""
    if operator is not None and not storable(operator):
        raise HTTPException(422, "operator must not contain NUL characters or lone surrogates")
    if not storable(token_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id!r}")
    actor = Actor("api", operator, operator) if operator else Actor("api", None, "operator API")
    token, revoked = await tokens.revoke(session, token_id, actor=actor)
    if token is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no token {token_id!r}")
    if not revoked:
        when = token.revoked_at.strftime("%Y-%m-%d %H:%M:%S UTC") if token.revoked_at else "?"
        return JSONResponse(
            {"detail": f"token {token_id} was already revoked at {when} by {token.revoked_by}"},
            status.HTTP_409_CONFLICT,
        )
    return TokenOut.of(token, utcnow())


@router.get("/audit", response_model=list[AuditEventOut], responses=ERRORS)
async def list_audit(
    session: ReadsDep,
    request_id: str | None = None,
    after: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[AuditEventOut]:
    """Audit events in order, from ``after`` (a sequence number)."""
    events = await queries.audit_events(session, request_id=request_id, after=after, limit=limit)
    return [AuditEventOut.of(e) for e in events]


@router.get("/audit/verify", response_model=AuditVerifyOut, responses=ERRORS)
async def verify_audit(session: ReadsDep) -> AuditVerifyOut:
    """Check the hash chain end to end."""
    return await queries.verify_audit(session)


@router.get("/config", responses=ERRORS)
async def read_config(runtime: RuntimeDep, session: ReadsDep) -> dict[str, Any]:
    """The configuration as loaded, secrets masked, with its version, when it was loaded, and the
    version each live replica runs (``replicas_agree`` is false while they differ)."""
    live = await live_replicas(session, utcnow())
    return {
        "version": runtime.version,
        "loaded_at": runtime.loaded_at.isoformat(),
        "replicas": [
            {"id": r.id, "version": r.config_version, "loaded_at": r.loaded_at.isoformat()} for r in live
        ],
        "replicas_agree": len({r.config_version for r in live} | {runtime.version}) == 1,
        **queries.config_view(runtime.config),
    }


@router.post("/config/reload", response_model=ReloadOut, responses={**ERRORS, 422: {"model": ReloadOut}})
async def reload_config(runtime: RuntimeDep) -> JSONResponse:
    """Reload ``SIGNOFF_CONFIG``: a file with problems changes nothing and answers 422 naming each."""
    done = await runtime.reload()
    body = ReloadOut.model_validate(done)
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if done.ok else 422)


@router.get("/switches", response_model=list[SwitchOut], responses=ERRORS)
async def list_switches(session: ReadsDep) -> list[SwitchOut]:
    """Operator switches (``read_only`` for ``readonly_guard``)."""
    return [SwitchOut.model_validate(r, from_attributes=True) for r in await switches.list_switches(session)]


@router.put(
    "/switches/{name}",
    response_model=SwitchOut,
    responses={**ERRORS, 404: {"model": Problem}, 422: {"model": Unprocessable}},
)
async def update_switch(
    name: Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")],
    body: SwitchIn,
    session: SessionDep,
    runtime: RuntimeDep,
) -> SwitchOut:
    """Turn a switch on or off as a named operator (audited); 404 for turning on a switch no
    ``readonly_guard`` watches."""
    if (why := switches.unwatched(runtime.config, name, on=body.on)) is not None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, why)
    actor = Actor("web", body.operator, body.operator)
    row = await switches.set_switch(session, name, on=body.on, actor=actor, reason=body.reason)
    return SwitchOut.model_validate(row, from_attributes=True)
