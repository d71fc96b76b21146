"""Refused callbacks: every one counted at once, a bounded sample of them in the audit log.

Anyone on the network can reach the callback routes and the email links' form, and each
audit event takes a turn of the chain's single lock: one event per refusal would let a
flood write the chain as fast as it can send. So each refusal is counted in
``signoff_callback_rejections_total`` at once; the first of its kind (surface, channel,
reason, client address) in a window is audited at once, so that a single bad click is on
record promptly with its reason; the others are tallied. When the window closes
(:meth:`Refusals.flush`: on the server's scheduler every :data:`WINDOW_SECONDS`, and at
shutdown) one event per channel and address says how many were refused and why
("1,942 refused slack callbacks to approvals from 203.0.113.7 in the last 1m").

Whatever arrives, a window writes at most :data:`SAMPLED` events as refusals arrive and at
most ``SAMPLED + 1`` when it closes: the busiest senders by name, then one event for all
the others. Each process aggregates its own refusals.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor, Entry
from signoff.app.db import transaction
from signoff.app.metrics import CALLBACK_REJECTIONS, reason_label
from signoff.app.models import utcnow
from signoff.channels import duration_text

__all__ = ["MAX_KEYS", "SAMPLED", "WINDOW_SECONDS", "Refusals"]

log = logging.getLogger("signoff.refusals")

WINDOW_SECONDS = 60
"""How often the tallies are written to the audit log and started afresh."""
SAMPLED = 10
"""Refusals audited singly per window, and senders named per window when it closes."""
MAX_KEYS = 10_000
"""Kinds of refusal told apart per window; beyond, refusals are counted without their kind
(memory stays bounded however many addresses a flood comes from)."""


class _Key(NamedTuple):
    surface: str
    """The channel type: ``slack``, ``feishu``, ``email``."""
    channel: str | None
    """The channel's name, when the refusal shows it."""
    address: str
    reason: str
    """:func:`~signoff.app.metrics.reason_label` of the reason."""


@dataclass(slots=True)
class _Window:
    since: datetime
    counts: dict[_Key, int] = field(default_factory=dict)
    singly: set[_Key] = field(default_factory=set)
    """Kinds whose first refusal has its own event (written, or being written)."""
    uncounted: int = 0
    """Refusals beyond :data:`MAX_KEYS` kinds, counted without their kind."""


@dataclass(slots=True)
class _Sender:
    surface: str
    channel: str | None
    address: str
    reasons: Counter[str] = field(default_factory=Counter)
    singly: int = 0

    @property
    def total(self) -> int:
        return sum(self.reasons.values())


def _noun(surface: str, n: int) -> str:
    thing = "email link" if surface == "email" else f"{surface} callback"
    return thing if n == 1 else f"{thing}s"


def _addresses(n: int) -> str:
    return "1 address" if n == 1 else f"{n:,} addresses"


class Refusals:
    """This process's refused callbacks, between two flushes (a window)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, now: datetime | None = None) -> None:
        self._sessions = sessions
        self._window = _Window(now or utcnow())

    async def refuse(
        self, *, surface: str, channel: str | None, reason: str, address: str, size: int
    ) -> None:
        """Count one refused callback from ``address`` and audit it if it is the first of its
        kind in this window (``size``: the bytes it carried, for the record)."""
        label = reason_label(reason)
        CALLBACK_REJECTIONS.labels(channel or surface, label).inc()
        window, key = self._window, _Key(surface, channel, address, label)
        # No await until the key is claimed: concurrent refusals of one kind write one event.
        if key not in window.counts and len(window.counts) >= MAX_KEYS:
            window.uncounted += 1
            return
        window.counts[key] = window.counts.get(key, 0) + 1
        if key in window.singly or len(window.singly) >= SAMPLED:
            return
        window.singly.add(key)
        try:
            async with transaction(self._sessions) as session:
                await audit.append(
                    session,
                    Action.CALLBACK_REJECTED,
                    actor=Actor(surface, None, channel),
                    detail={"channel": channel, "reason": reason, "bytes": size, "address": address},
                )
        except BaseException:
            window.singly.discard(key)  # not on record: the window's tally covers it
            raise

    async def flush(self, now: datetime | None = None) -> int:
        """Close the window at ``now``: write its tallies to the audit log and start afresh.
        Returns the events written. A failure to write is logged with the tallies."""
        now = now or utcnow()
        window, self._window = self._window, _Window(now)
        entries = _tallies(window, now)
        if not entries:
            return 0
        try:
            async with transaction(self._sessions) as session:
                await audit.append_many(session, entries)
        except Exception:
            summaries = "; ".join(str((e.detail or {}).get("summary")) for e in entries)
            log.exception("refused callbacks could not be written to the audit log: %s", summaries)
            return 0
        return len(entries)


def _tallies(window: _Window, now: datetime) -> list[Entry]:
    """One event per sender with refusals not on record singly, the busiest :data:`SAMPLED`
    by name, and one for the rest."""
    senders: dict[tuple[str, str | None, str], _Sender] = {}
    for key, n in window.counts.items():
        sender = senders.get(key[:3])
        if sender is None:
            sender = senders[key[:3]] = _Sender(key.surface, key.channel, key.address)
        sender.reasons[key.reason] += n
        sender.singly += key in window.singly
    owed = sorted(
        (s for s in senders.values() if s.total > s.singly),
        key=lambda s: (-s.total, s.surface, s.channel or "", s.address),
    )
    named, rest = owed[:SAMPLED], owed[SAMPLED:]
    seconds = max(int((now - window.since).total_seconds()), 0)
    period = {"since": window.since.isoformat(), "seconds": seconds}
    last = duration_text(seconds)
    entries = []
    for s in named:
        to = f" to {s.channel}" if s.channel else ""
        summary = f"{s.total:,} refused {_noun(s.surface, s.total)}{to} from {s.address} in the last {last}"
        detail: dict[str, Any] = {
            "channel": s.channel,
            "address": s.address,
            "count": s.total,
            "reasons": dict(s.reasons.most_common()),
            "audited_singly": s.singly,
            **period,
            "summary": summary,
        }
        entries.append(Entry(Action.CALLBACK_REJECTED, Actor(s.surface, None, s.channel), detail=detail))
    count = sum(s.total for s in rest) + window.uncounted
    if count:
        addresses = len({s.address for s in rest})
        sources = f"at least {_addresses(max(addresses, 1))}" if window.uncounted else _addresses(addresses)
        summary = f"and {count:,} more refused callbacks from {sources} in the last {last}"
        surfaces: Counter[str] = Counter()
        for s in rest:
            surfaces[s.surface] += s.total
        detail = {
            "count": count,
            "addresses": addresses,
            "surfaces": dict(surfaces.most_common()),
            "audited_singly": sum(s.singly for s in rest),
            "uncounted": window.uncounted,
            **period,
            "summary": summary,
        }
        entries.append(Entry(Action.CALLBACK_REJECTED, audit.SYSTEM, detail=detail))
    return entries
