"""The outbox's rows: what a transaction owes channels (card posts and updates, reminders,
escalations) and webhooks (events). Written in the transaction of the change that owes them; the dispatcher
(:mod:`signoff.app.outbox`) sends them after commit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.db import wake_after_commit
from signoff.app.models import CARD_KINDS, Delivery, DeliveryKind, OutboxStatus

__all__ = ["CARD_REF", "CARD_ROW", "WEBHOOK", "owed_delivery", "queue_deliveries"]

WEBHOOK = DeliveryKind.WEBHOOK

_INSERT = sa.insert(Delivery.__table__)  # type: ignore[attr-defined]

_CARD_OF = (
    col(Delivery.request_id) == sa.bindparam("request_id"),
    col(Delivery.channel) == sa.bindparam("channel"),
    col(Delivery.kind).in_(CARD_KINDS),
)
CARD_ROW = select(Delivery).where(*_CARD_OF).order_by(col(Delivery.id))
"""The row of request ``request_id``'s card on ``channel`` (params ``request_id``, ``channel``): its
first post, or the escalation that brought it there; ``.first()`` of the result."""
CARD_REF = select(Delivery.message_ref).where(*_CARD_OF).order_by(col(Delivery.id))
"""Where that card was posted (its ``message_ref``; None until it is)."""


def owed_delivery(
    request_id: str,
    channel: str,
    kind: str,
    now: datetime,
    *,
    gate: int | None = None,
    step: int | None = None,
    event_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The outbox row owing ``channel`` a :class:`DeliveryKind` from ``now`` on: the request's
    card (``post``), a redraw (``update``), gate ``gate``'s reminder or escalation ``step``, or
    to the webhook ``channel`` the event ``payload`` (``webhook``)."""
    return {
        "request_id": request_id,
        "channel": channel,
        "kind": kind,
        "status": OutboxStatus.PENDING,
        "attempts": 0,
        "next_attempt_at": now,
        "leased_until": None,
        "last_error": None,
        "message_ref": None,
        "created_at": now,
        "sent_at": None,
        "gate": gate,
        "step": step,
        "event_id": event_id,
        "payload": payload,
    }


async def queue_deliveries(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Write the outbox rows ``rows`` (:func:`owed_delivery`); the dispatcher wakes at commit."""
    if rows:
        await session.exec(_INSERT, params=rows)
        wake_after_commit(session, queued=True)
