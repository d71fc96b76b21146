"""Health, readiness and metrics."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlmodel import col, select

from app.deps import RuntimeDep
from app.models import ConfirmationRequest, Delivery, OutboxStatus, Status

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """The database answers."""
    try:
        async with runtime.engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "reason": f"database: {type(exc).__name__}"}, 503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(runtime: RuntimeDep) -> str:
    """Prometheus text format."""
    async with runtime.reads() as session:
        by_status = (
            await session.exec(
                select(ConfirmationRequest.status, sa.func.count()).group_by(col(ConfirmationRequest.status))
            )
        ).all()
        backlog = (
            await session.exec(
                select(sa.func.count())
                .select_from(Delivery)
                .where(col(Delivery.status) == OutboxStatus.PENDING)
            )
        ).one()
        failed = (
            await session.exec(
                select(sa.func.count())
                .select_from(Delivery)
                .where(col(Delivery.status) == OutboxStatus.FAILED)
            )
        ).one()
    counts = {str(s): int(n) for s, n in by_status}
    lines = ["# TYPE signoff_requests gauge"]
    lines += [f'signoff_requests{{status="{s.value}"}} {counts.get(s.value, 0)}' for s in Status]
    lines += [
        "# TYPE signoff_outbox_backlog gauge",
        f"signoff_outbox_backlog {backlog}",
        "# TYPE signoff_outbox_failed gauge",
        f"signoff_outbox_failed {failed}",
        "# TYPE signoff_waiters gauge",
        f"signoff_waiters {runtime.hub.waiting}",
    ]
    return "\n".join(lines) + "\n"
