"""The votes recorded on requests, as the unit of work reading them sees them.

Every read of votes goes through here: one query however many requests, and the votes of a few
requests read once in a transaction are not read again in it (the decision's receipt and the
answer of the agents waiting on it share one read). Whatever writes votes in a
transaction forgets what it read (:func:`forget`); votes of a request are only written under
its lock (:mod:`signoff.app.requests.votes`), so no other writer changes them meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.models import Vote
from signoff.channels import Verdict

__all__ = ["GateApprovals", "approvals_by_gate", "forget", "per_gate", "votes_for", "votes_of_requests"]

_REMEMBERED = 8
"""A read of at most this many requests' votes is remembered (a page or an export of thousands
is not kept for the rest of its transaction)."""
_READ = "signoff.votes"
"""``session.info`` key: (the transaction, the votes it read by request id)."""
_VOTES_OF = (
    select(Vote).where(col(Vote.request_id).in_(sa.bindparam("ids", expanding=True))).order_by(col(Vote.id))
)


def _read(session: AsyncSession) -> dict[str, list[Vote]]:
    tx: Any = session.sync_session.get_transaction()
    held = session.info.get(_READ)
    if held is None or held[0] is not tx:
        held = session.info[_READ] = (tx, {})
    read: dict[str, list[Vote]] = held[1]
    return read


def forget(session: AsyncSession) -> None:
    """Votes were written in ``session``'s transaction: read them again when asked."""
    session.info.pop(_READ, None)


async def votes_of_requests(session: AsyncSession, request_ids: Iterable[str]) -> dict[str, list[Vote]]:
    """The votes on each of ``request_ids``, oldest first (at most one query, however many)."""
    ids = list(dict.fromkeys(request_ids))
    read = _read(session)
    found: dict[str, list[Vote]] = {rid: read[rid] for rid in ids if rid in read}
    missing = [rid for rid in ids if rid not in found]
    if missing:
        found.update((rid, []) for rid in missing)
        for vote in (await session.exec(_VOTES_OF, params={"ids": missing})).all():
            found[vote.request_id].append(vote)
        if len(missing) <= _REMEMBERED:
            read.update((rid, found[rid]) for rid in missing)
    return {rid: list(found[rid]) for rid in ids}


async def votes_for(session: AsyncSession, request_id: str) -> list[Vote]:
    """The votes on request ``request_id``, oldest first."""
    return (await votes_of_requests(session, [request_id]))[request_id]


GateApprovals = Mapping[tuple[str, int], int]
"""Approving votes by (request id, gate index); a gate nobody approved yet is absent."""


async def approvals_by_gate(session: AsyncSession, request_ids: Iterable[str]) -> GateApprovals:
    """Approving votes on each gate of each of ``request_ids`` (one query, however many)."""
    ids = list(dict.fromkeys(request_ids))
    if not ids:
        return {}
    rows = await session.exec(
        select(col(Vote.request_id), col(Vote.gate), sa.func.count())
        .where(col(Vote.request_id).in_(ids), col(Vote.verdict) == Verdict.APPROVE.value)
        .group_by(col(Vote.request_id), col(Vote.gate))
    )
    return {(str(rid), int(gate)): int(n) for rid, gate, n in rows.all()}


def per_gate(approvals: GateApprovals, request_id: str, gates: int) -> list[int]:
    """Approving votes per gate (index) of request ``request_id``, a request of ``gates`` gates."""
    return [approvals.get((request_id, i), 0) for i in range(gates)]
