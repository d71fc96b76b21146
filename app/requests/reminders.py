"""Reminders and escalations: when a request's approvers are reminded, and whom it escalates to.

Both are outbox rows written with the request, due at their time (:func:`scheduled`); the
outbox dispatcher sends them (:mod:`signoff.app.outbox`), reminding only the approvers who
have not voted (:func:`signoff.app.requests.cards.waiting_on`) and bringing the card to an
escalation's channel with the approvers it adds
(:func:`signoff.app.requests.cards.escalated_to`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig
from signoff.app.deliveries import owed_delivery
from signoff.app.requests.eligibility import GateSnapshot

__all__ = ["scheduled"]


def scheduled(
    request_id: str,
    now: datetime,
    expires_at: datetime,
    gates: Sequence[ConfirmationGate],
    snapshots: Sequence[GateSnapshot],
    config: SignoffConfig,
) -> tuple[dict[str, Any], ...]:
    """The outbox rows of the gates' reminders (under a card: none on a ``web`` channel) and
    escalations that fall before the request expires, earliest first."""
    rows: list[tuple[datetime, dict[str, Any]]] = []
    for i, (gate, snapshot) in enumerate(zip(gates, snapshots, strict=True)):
        if not config.is_web(gate.channel):
            for j, point in enumerate(gate.remind):
                due = now + point.due(gate.timeout)
                rows.append((due, owed_delivery(request_id, gate.channel, "remind", due, gate=i, step=j)))
        for j, step in enumerate(snapshot.escalations):
            due = now + timedelta(seconds=step.after_seconds)
            rows.append((due, owed_delivery(request_id, step.channel, "escalate", due, gate=i, step=j)))
    rows.sort(key=lambda r: r[0])
    return tuple(row for due, row in rows if due < expires_at)
