"""Signed receipts for decided requests and executed calls.

The transition to a terminal status (:mod:`signoff.app.requests.states`, the one place every
decision is written) signs the **decision receipt** in the same transaction and stores it with
the request; reporting an approved call executed (:mod:`signoff.app.requests.single_use`)
signs the **execution receipt**, chained to the decision receipt by its digest. The format and
the digest are :mod:`signoff.hooks.receipts`'s (the public contract in DESIGN.md "Receipts").

The action digest is taken as the call arrives (the stored arguments are redacted); the
digest of a call approved with changes is taken at the decision when the stored arguments are
the call as sent (nothing was redacted), and is null otherwise: the receipt then lists the
changes, and whoever holds the call computes it as ``{**arguments, **changes}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Actor
from signoff.app.models import ConfirmationRequest, Vote, utcnow
from signoff.app.receipt_keys import sign, signing_key
from signoff.app.requests.canonical import call_digest
from signoff.app.requests.eligibility import GateSnapshot, shown_ids
from signoff.app.requests.tally import votes_of_requests
from signoff.hooks.receipts import action_digest, canonical_bytes, receipt_digest

__all__ = [
    "RECEIPT_VERSION",
    "Decided",
    "digest_of_call",
    "issue_execution",
    "sign_decisions",
    "stored_digest",
]

RECEIPT_VERSION = 1
_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]


def digest_of_call(
    agent: str, tool: str, arguments: Mapping[str, Any], session: str | None, policy_version: str | None
) -> str | None:
    """The call's action digest, or None when RFC 8785 cannot represent its arguments
    (integers beyond ±2**53, say)."""
    try:
        return action_digest(
            agent=agent, tool=tool, arguments=arguments, session=session, policy_version=policy_version
        )
    except ValueError:
        return None


def _faithful(tool: str, arguments: Mapping[str, Any], digest: str | None) -> bool:
    """Whether the stored ``arguments`` are the call as sent (nothing redacted)."""
    return bool(digest) and call_digest(tool, arguments) == digest


@dataclass(frozen=True, slots=True)
class Decided:
    """What a transition to a terminal status returns of its row, for the receipt."""

    request_id: str
    agent: str
    tool: str
    session: str | None
    arguments: Mapping[str, Any]
    call_digest: str | None
    action_digest: str | None
    policy_version: str | None
    gates: Sequence[GateSnapshot]


def stored_digest(d: Decided) -> str | None:
    """The request's action digest: as stored, or (a request made before receipts) taken from
    its stored arguments when those are the call as sent."""
    if d.action_digest:
        return d.action_digest
    if _faithful(d.tool, d.arguments, d.call_digest):
        return digest_of_call(d.agent, d.tool, d.arguments, d.session, d.policy_version)
    return None


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _assurance(vote: Vote) -> str | None:
    """How strongly the voter's identity was established, as the vote recorded it (None: not
    known; votes recorded before the level had a column of its own kept it in ``identity``)."""
    if vote.assurance is not None:
        return str(vote.assurance)
    value = (vote.identity or {}).get("assurance")
    return value if isinstance(value, str) else None


def _vote(vote: Vote, gates: Sequence[GateSnapshot]) -> dict[str, Any]:
    return {
        "gate": gates[vote.gate].name if 0 <= vote.gate < len(gates) else None,
        "person": vote.voter,
        "verdict": vote.verdict,
        "channel": vote.channel,
        "user_id": shown_ids([vote]).get(vote.user_id, vote.user_id),
        "name": vote.name,
        "assurance": _assurance(vote),
        "at": _iso(vote.created_at),
    }


def _jcs_able(value: Any) -> bool:
    try:
        canonical_bytes(value)
    except ValueError:
        return False
    return True


def decision_payload(
    d: Decided,
    verdict: str,
    votes: Sequence[Vote],
    *,
    actor: Actor,
    reason: str | None,
    decided_at: datetime,
    changes: Mapping[str, Any] | None,
    issued_at: datetime,
) -> dict[str, Any]:
    """The decision receipt's payload (see DESIGN.md "Receipts")."""
    proposed = stored_digest(d)
    approved: str | None = None
    if verdict == "approved":
        if not changes:
            approved = proposed
        elif _faithful(d.tool, d.arguments, d.call_digest):
            approved = digest_of_call(
                d.agent, d.tool, {**d.arguments, **changes}, d.session, d.policy_version
            )
    payload: dict[str, Any] = {
        "kind": "decision",
        "version": RECEIPT_VERSION,
        "request_id": d.request_id,
        "agent": d.agent,
        "tool": d.tool,
        "session": d.session,
        "verdict": verdict,
        "action_digest": proposed,
        "approved_digest": approved,
        "votes": [_vote(v, d.gates) for v in votes],
        "gates": [
            {"name": g.name, "channel": g.channel, "approvers": list(g.approvers), "quorum": g.quorum}
            for g in d.gates
        ],
        "decided_by": {
            "channel": actor.channel,
            "user_id": shown_ids(votes).get(actor.id, actor.id) if actor.id is not None else None,
            "name": actor.name,
        },
        "reason": reason,
        "policy_version": d.policy_version,
        "decided_at": _iso(decided_at),
        "issued_at": _iso(issued_at),
    }
    if changes and _jcs_able(dict(changes)):
        payload["changes"] = dict(changes)
    return payload


async def sign_decisions(
    session: AsyncSession,
    decided: Sequence[Decided],
    verdict: str,
    *,
    actor: Actor,
    reason: str | Mapping[str, str] | None,
    decided_at: datetime,
    changes: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The signed decision receipt of each request in ``decided`` (being moved to ``verdict``
    in this transaction, which stores them with it), by request id; ``reason`` may differ per
    request (by id)."""
    if not decided:
        return {}
    votes = await votes_of_requests(session, [d.request_id for d in decided])
    key = await signing_key(session)
    issued_at = max(utcnow(), decided_at)
    receipts = {}
    for d in decided:
        why = reason.get(d.request_id) if isinstance(reason, Mapping) else reason
        payload = decision_payload(
            d,
            verdict,
            votes[d.request_id],
            actor=actor,
            reason=why,
            decided_at=decided_at,
            changes=changes,
            issued_at=issued_at,
        )
        receipts[d.request_id] = sign(payload, key)
    return receipts


def _result_digest(result: Any) -> str | None:
    try:
        return hashlib.sha256(canonical_bytes(result)).hexdigest()
    except ValueError:
        return None


async def issue_execution(
    session: AsyncSession,
    *,
    request_id: str,
    agent: str,
    tool: str,
    arguments: Mapping[str, Any],
    result: Any,
    error: str | None,
    session_id: str | None,
    decision_receipt: Mapping[str, Any] | None,
    policy_version: str | None,
    approved_digest: str | None,
    mismatch: bool,
    executed_at: datetime,
) -> dict[str, Any]:
    """Sign and store the execution receipt of request ``request_id``'s approved call, reported
    executed (in this transaction) with ``arguments`` (as sent) and ``result``.
    ``executed_mismatch``: run otherwise than approved (by the digest where the approved one is
    known, else by the stored arguments)."""
    key = await signing_key(session)  # before the time of issue: see signoff.app.receipt_keys
    executed = digest_of_call(agent, tool, arguments, session_id, policy_version)
    if approved_digest is not None and executed is not None:
        mismatch = mismatch or executed != approved_digest
    payload = {
        "kind": "execution",
        "version": RECEIPT_VERSION,
        "request_id": request_id,
        "agent": agent,
        "tool": tool,
        "session": session_id,
        "action_digest": executed,
        "approved_digest": approved_digest,
        "executed_mismatch": mismatch,
        "result_digest": _result_digest(result),
        "error": error is not None,
        "decision_receipt": receipt_digest(decision_receipt) if decision_receipt else None,
        "policy_version": policy_version,
        "executed_at": _iso(executed_at),
        "issued_at": _iso(max(utcnow(), executed_at)),
    }
    receipt = sign(payload, key)
    await session.exec(
        sa.update(_REQUESTS).where(_REQUESTS.c.id == request_id).values(execution_receipt=receipt)
    )
    return receipt
