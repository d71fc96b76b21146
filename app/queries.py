"""Reads shared by the operator API and the console: requests by filter, one request with
its trail, the audit log and its verification, the configuration with secrets masked."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from pydantic import BaseModel, SecretStr
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession
from sqlmodel.sql.expression import SelectOfScalar

from signoff.app.audit import verify_chain
from signoff.app.channel_types import identity_of
from signoff.app.config import SignoffConfig
from signoff.app.deliveries import WEBHOOK
from signoff.app.models import AuditEvent, ConfirmationRequest, Delivery, Grant, OutboxStatus, Status, Vote
from signoff.app.redaction import redact
from signoff.app.requests.eligibility import gates_of, shown_ids
from signoff.app.requests.grants import grants_by_request
from signoff.app.requests.states import get_request, held
from signoff.app.requests.tally import votes_for, votes_of_requests
from signoff.app.schemas import AdminRequestOut, AuditEventOut, AuditVerifyOut, RequestOut

__all__ = [
    "RequestFilter",
    "admin_view",
    "admin_view_of",
    "audit_events",
    "audit_page",
    "config_view",
    "count_requests",
    "deliveries_for",
    "failed_webhooks",
    "iter_requests",
    "list_requests",
    "masked",
    "masked_channels",
    "masked_ids",
    "readable",
    "request_out",
    "request_outs",
    "request_trail",
    "shown_events",
    "shown_votes",
    "verify_audit",
]


log = logging.getLogger("signoff")
T = TypeVar("T")


def readable(reqs: Iterable[ConfirmationRequest], show: Callable[[ConfirmationRequest], T]) -> list[T]:
    """``show`` of each request, leaving out (and logging) any stored in a form it cannot
    show: one unreadable row never takes down a listing."""
    out: list[T] = []
    for req in reqs:
        try:
            out.append(show(req))
        except Exception as exc:
            log.error(
                "request %s cannot be shown (%s: %s); left out of the listing; fix or delete its row",
                getattr(req, "id", "?"),
                type(exc).__name__,
                exc,
            )
    return out


def _may_have_grants(req: ConfirmationRequest) -> bool:
    """Whether an approval of ``req`` could have given a grant (its gates offered some)."""
    return req.status == Status.APPROVED and any(g.grants for g in gates_of(req))


async def _grants_of(session: AsyncSession, reqs: Sequence[ConfirmationRequest]) -> dict[str, list[Grant]]:
    return await grants_by_request(session, (r.id for r in reqs if _may_have_grants(r)))


async def request_out(session: AsyncSession, req: ConfirmationRequest) -> RequestOut:
    """The request as the API shows it: with its votes and the grant its approval gave."""
    grants = await _grants_of(session, [req])
    return RequestOut.of(req, await votes_for(session, req.id), grants.get(req.id, ()))


async def request_outs(session: AsyncSession, reqs: Sequence[ConfirmationRequest]) -> list[RequestOut]:
    """The requests as the API shows them, with their votes and grants (a query each),
    unreadable rows left out."""
    votes = await votes_of_requests(session, (r.id for r in reqs))
    grants = await _grants_of(session, reqs)
    return readable(reqs, lambda r: RequestOut.of(r, votes[r.id], grants.get(r.id, ())))


async def request_outs_by_id(session: AsyncSession, ids: Sequence[str]) -> dict[str, RequestOut]:
    """The requests with these ids as the API shows them (three queries however many), by id;
    ids with no (readable) row are left out."""
    r = ConfirmationRequest
    # A request this session holds already is as this transaction wrote it (the state
    # machine keeps its copy so): not read again.
    known = {rid: held(session, rid) for rid in ids}
    reqs = [req for req in known.values() if req is not None]
    if rest := [rid for rid, req in known.items() if req is None]:
        reqs += (await session.exec(select(r).where(col(r.id).in_(rest)))).all()
    return {out.id: out for out in await request_outs(session, reqs)}


@dataclass(frozen=True, slots=True)
class RequestFilter:
    """Which requests to list; every field left ``None`` matches everything."""

    status: Status | None = None
    agent: str | None = None
    tool: str | None = None
    """The exact tool name."""
    tool_contains: str | None = None
    """Part of the tool name, any case."""
    decider: str | None = None
    """Who decided: their user id or display name, any case."""
    created_from: datetime | None = None
    created_to: datetime | None = None
    before: datetime | None = None
    """Only requests created before this (paging, newest first)."""


def _requests_stmt(f: RequestFilter) -> SelectOfScalar[ConfirmationRequest]:
    r = ConfirmationRequest
    stmt = select(r).order_by(col(r.created_at).desc(), col(r.id).desc())
    if f.status is not None:
        stmt = stmt.where(col(r.status) == f.status)
    if f.agent is not None:
        stmt = stmt.where(col(r.agent_id) == f.agent)
    if f.tool is not None:
        stmt = stmt.where(col(r.tool_name) == f.tool)
    if f.tool_contains:
        stmt = stmt.where(sa.func.lower(col(r.tool_name)).contains(f.tool_contains.lower(), autoescape=True))
    if f.decider:
        who = f.decider.lower()
        stmt = stmt.where(
            sa.or_(
                sa.func.lower(col(r.decided_by_user_id)) == who,
                sa.func.lower(col(r.decided_by_name)) == who,
            )
        )
    if f.created_from is not None:
        stmt = stmt.where(col(r.created_at) >= f.created_from)
    if f.created_to is not None:
        stmt = stmt.where(col(r.created_at) < f.created_to)
    if f.before is not None:
        stmt = stmt.where(col(r.created_at) < f.before)
    return stmt


async def list_requests(session: AsyncSession, f: RequestFilter, *, limit: int) -> list[ConfirmationRequest]:
    """Requests matching ``f``, newest first."""
    return list((await session.exec(_requests_stmt(f).limit(limit))).all())


async def count_requests(session: AsyncSession, f: RequestFilter) -> int:
    stmt = select(sa.func.count()).select_from(_requests_stmt(f).order_by(None).subquery())
    return int((await session.exec(stmt)).one())


async def iter_requests(
    session: AsyncSession, f: RequestFilter, *, batch: int = 500
) -> AsyncIterator[list[ConfirmationRequest]]:
    """Every request matching ``f``, newest first, in batches (keyset paging: no OFFSET)."""
    last: tuple[datetime, str] | None = None
    r = ConfirmationRequest
    while True:
        stmt = _requests_stmt(f)
        if last is not None:
            stmt = stmt.where(
                sa.or_(
                    col(r.created_at) < last[0],
                    sa.and_(col(r.created_at) == last[0], col(r.id) < last[1]),
                )
            )
        rows = list((await session.exec(stmt.limit(batch))).all())
        if not rows:
            return
        yield rows
        if len(rows) < batch:
            return
        last = (rows[-1].created_at, rows[-1].id)


def shown_votes(votes: Sequence[Vote]) -> list[Vote]:
    """``votes`` as the console shows them: a secret channel id (an ntfy topic) replaced by
    its voter's directory key (:func:`~signoff.app.requests.eligibility.shown_ids`); copies,
    never the rows themselves."""
    shown = shown_ids(votes)
    return [
        Vote(**{**v.model_dump(), "user_id": shown[v.user_id]}) if v.user_id in shown else v for v in votes
    ]


async def shown_events(session: AsyncSession, events: Sequence[AuditEvent]) -> list[AuditEvent]:
    """``events`` as the console, the operator API and the command line show them: an actor
    whose channel id is a secret of theirs (an ntfy topic) named by their directory key
    (:func:`~signoff.app.requests.eligibility.shown_ids`, from the votes of the events'
    requests and what each event recorded); copies, never the rows (whose hashes cover the
    ids as they are)."""
    asked = {e.request_id for e in events if e.request_id and e.actor_id}
    votes = (
        [v for found in (await votes_of_requests(session, asked)).values() for v in found] if asked else []
    )
    shown = shown_ids(votes, events)
    return [
        AuditEvent(**{**e.model_dump(), "actor_id": shown[e.actor_id]}) if e.actor_id in shown else e
        for e in events
    ]


async def request_trail(session: AsyncSession, request_id: str) -> list[AuditEvent]:
    """The audit events about one request, in order, as they are shown (:func:`shown_events`)."""
    stmt = select(AuditEvent).where(col(AuditEvent.request_id) == request_id).order_by(col(AuditEvent.seq))
    return await shown_events(session, list((await session.exec(stmt)).all()))


async def deliveries_for(session: AsyncSession, request_id: str) -> list[Delivery]:
    """The card posts, card updates and webhook events owed or sent for one request, in order."""
    stmt = select(Delivery).where(col(Delivery.request_id) == request_id).order_by(col(Delivery.id))
    return list((await session.exec(stmt)).all())


async def failed_webhooks(session: AsyncSession, *, limit: int = 200) -> list[Delivery]:
    """Webhook events that gave up, newest first."""
    stmt = (
        select(Delivery)
        .where(col(Delivery.kind) == WEBHOOK, col(Delivery.status) == OutboxStatus.FAILED)
        .order_by(col(Delivery.id).desc())
        .limit(limit)
    )
    return list((await session.exec(stmt)).all())


async def admin_view(session: AsyncSession, request_id: str) -> AdminRequestOut | None:
    """One request with its votes and audit trail; None if there is no such request."""
    req = await get_request(session, request_id)
    return None if req is None else await admin_view_of(session, req)


async def admin_view_of(session: AsyncSession, req: ConfirmationRequest) -> AdminRequestOut:
    """:func:`admin_view` of ``req``, already read."""
    base = await request_out(session, req)
    trail = await request_trail(session, req.id)
    return AdminRequestOut(**base.model_dump(), audit=[AuditEventOut.of(e) for e in trail])


async def audit_events(
    session: AsyncSession, *, request_id: str | None = None, after: int = 0, limit: int = 200
) -> list[AuditEvent]:
    """Audit events in order, from ``after`` (a sequence number), as they are shown
    (:func:`shown_events`)."""
    stmt = select(AuditEvent).where(col(AuditEvent.seq) > after).order_by(col(AuditEvent.seq)).limit(limit)
    if request_id is not None:
        stmt = stmt.where(col(AuditEvent.request_id) == request_id)
    return await shown_events(session, list((await session.exec(stmt)).all()))


async def audit_page(
    session: AsyncSession,
    *,
    before: int | None = None,
    action: str | None = None,
    request_id: str | None = None,
    limit: int = 50,
) -> list[AuditEvent]:
    """Audit events newest first, older than ``before`` (a sequence number), as they are shown
    (:func:`shown_events`)."""
    stmt = select(AuditEvent).order_by(col(AuditEvent.seq).desc()).limit(limit)
    if before is not None:
        stmt = stmt.where(col(AuditEvent.seq) < before)
    if action:
        stmt = stmt.where(col(AuditEvent.action) == action)
    if request_id:
        stmt = stmt.where(col(AuditEvent.request_id) == request_id)
    return await shown_events(session, list((await session.exec(stmt)).all()))


async def verify_audit(session: AsyncSession) -> AuditVerifyOut:
    """Check the hash chain end to end."""
    count, broken = await verify_chain(session)
    if broken is None:
        return AuditVerifyOut(ok=True, events=count)
    return AuditVerifyOut(ok=False, events=count, broken_at=broken.seq or None, problem=broken.problem)


def masked(value: Any) -> Any:
    """``value`` with every secret replaced by ``********`` (or ``""`` when it is empty)."""
    if isinstance(value, SecretStr):
        return "********" if value.get_secret_value() else ""
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return value


def masked_ids(ids: Mapping[str, Any]) -> dict[str, Any]:
    """A person's entry (their ids by channel type among its fields) with each id that is a
    secret masked: a channel type whose ``Identity.secret_ids`` says so (an ntfy topic)."""
    return {t: "********" if identity_of(t).secret_ids else i for t, i in ids.items()}


def masked_channels(config: SignoffConfig) -> dict[str, dict[str, Any]]:
    """Each channel's settings as loaded, secrets masked."""
    return {n: masked(cast(BaseModel, c).model_dump()) for n, c in config.channels.items()}


def masked_webhooks(config: SignoffConfig) -> dict[str, dict[str, Any]]:
    """Each webhook's settings as loaded, its secret masked and its URL redacted (a receiver
    may take a token in its query: ``?token=…``)."""
    return {
        n: {**masked(w.model_dump()), "url": redact(w.url, config.redact)} for n, w in config.webhooks.items()
    }


def config_view(config: SignoffConfig) -> dict[str, Any]:
    """The configuration as loaded, secrets masked (people's secret ids among them; operators'
    password hashes left out)."""
    return {
        "source": config.source,
        "channels": masked_channels(config),
        "people": {k: masked_ids(p.model_dump(exclude_none=True)) for k, p in config.people.items()},
        "agents": {a: c.model_dump(mode="json") for a, c in config.agents.items()},
        "redact": sorted(config.redact),
        "webhooks": masked_webhooks(config),
        "console": masked(config.console.model_dump()),
    }
