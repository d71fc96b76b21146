"""Health, readiness and metrics."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlmodel import col, select

from signoff.app import metrics as m
from signoff.app import version
from signoff.app.db import RETRY_AFTER_SECONDS, head_revision
from signoff.app.deliveries import WEBHOOK
from signoff.app.deps import RuntimeDep
from signoff.app.models import ConfirmationRequest, Delivery, OutboxStatus, Status, utcnow

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up; which release it runs."""
    return {"status": "ok", "version": version()}


@router.get("/readyz")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """Whether this server can serve: its database answers, is writable, has disk space and
    its schema is at this release's revision (see :mod:`signoff.app.readiness`). 503 names
    each problem in ``reason``."""
    problems = await runtime.readiness.problems()
    if problems:
        return JSONResponse(
            {"status": "unavailable", "reason": "; ".join(problems), "version": version()},
            503,
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return JSONResponse({"status": "ready", "version": version(), "revision": head_revision()})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(runtime: RuntimeDep) -> PlainTextResponse:
    """Prometheus text format."""
    async with runtime.reads() as session:
        by_status = (
            await session.exec(
                select(ConfirmationRequest.status, sa.func.count()).group_by(col(ConfirmationRequest.status))
            )
        ).all()
        by_outbox = (
            await session.exec(select(Delivery.status, sa.func.count()).group_by(col(Delivery.status)))
        ).all()
        failed_webhooks = (
            await session.exec(
                select(Delivery.channel, sa.func.count())
                .where(col(Delivery.kind) == WEBHOOK, col(Delivery.status) == OutboxStatus.FAILED)
                .group_by(col(Delivery.channel))
            )
        ).all()
        # Reminders and escalations wait for their time: only what is due is a backlog.
        due = (
            await session.exec(
                select(sa.func.count()).where(
                    col(Delivery.status) == OutboxStatus.PENDING, col(Delivery.next_attempt_at) <= utcnow()
                )
            )
        ).one()
    counts = {str(s): int(n) for s, n in by_status}
    for st in Status:
        m.REQUESTS.labels(st.value).set(counts.get(st.value, 0))
    outbox = {str(s): int(n) for s, n in by_outbox}
    m.OUTBOX_BACKLOG.set(int(due))
    m.OUTBOX_FAILED.set(outbox.get(OutboxStatus.FAILED.value, 0))
    failed = {str(name): int(n) for name, n in failed_webhooks}
    m.WEBHOOK_FAILED.clear()
    for name in {*runtime.config.webhooks, *failed}:
        m.WEBHOOK_FAILED.labels(name).set(failed.get(name, 0))
    m.WAITERS.set(runtime.hub.waiting)
    return PlainTextResponse(generate_latest(m.REGISTRY), media_type=CONTENT_TYPE_LATEST)
