"""Which server processes are running which configuration (each reports itself every few seconds)."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta

from sqlmodel import col, delete, select, update
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.models import Replica

__all__ = ["LIVE_WITHIN", "REPORT_SECONDS", "live_replicas", "replica_id", "report"]

REPORT_SECONDS = 10.0
LIVE_WITHIN = timedelta(seconds=3 * REPORT_SECONDS)
"""A replica that has not reported for this long is taken for gone."""


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:200]


async def report(
    session: AsyncSession, rid: str, *, version: str, loaded_at: datetime, now: datetime
) -> None:
    """Record that replica ``rid`` runs ``version`` (loaded at ``loaded_at``) as of ``now``."""
    result = await session.exec(
        update(Replica)
        .where(col(Replica.id) == rid)
        .values(config_version=version, loaded_at=loaded_at, seen_at=now)
    )
    if result.rowcount == 0:
        session.add(Replica(id=rid, config_version=version, loaded_at=loaded_at, seen_at=now))
    await session.exec(delete(Replica).where(col(Replica.seen_at) < now - 100 * LIVE_WITHIN))


async def live_replicas(session: AsyncSession, now: datetime) -> list[Replica]:
    """Replicas that reported recently, oldest loaded first."""
    rows = await session.exec(
        select(Replica).where(col(Replica.seen_at) >= now - LIVE_WITHIN).order_by(col(Replica.loaded_at))
    )
    return list(rows.all())
