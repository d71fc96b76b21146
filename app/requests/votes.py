"""Casting votes: one vote recorded per gate it counts for, and the transition it causes.

Who may vote on which gate is :mod:`signoff.app.requests.eligibility` (pure rules); this module
applies them under the request's lock and moves the request through
:mod:`signoff.app.requests.states`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.config import SignoffConfig
from signoff.app.db import core_row, insert_unless_taken
from signoff.app.models import ConfirmationRequest, Status, Vote, utcnow
from signoff.app.requests import edits, grants
from signoff.app.requests.activity import gate_names, log_after_commit
from signoff.app.requests.canonical import same
from signoff.app.requests.eligibility import (
    NOT_AN_APPROVER,
    GateSnapshot,
    Voter,
    approving_gates,
    eligible_gates,
    gates_of,
    same_voter,
)
from signoff.app.requests.states import expire, get_request, queue_updates, transition
from signoff.app.requests.tally import approvals_by_gate, forget, per_gate, votes_for
from signoff.channels import ClickAnswer, GrantChoice, Verdict, changes_text, edit_problem

__all__ = [
    "VoteResult",
    "apply_vote",
    "cast_vote",
    "describe_decided",
    "refuse_vote",
]

_VOTES: sa.Table = Vote.__table__  # type: ignore[attr-defined]
_VOTE_KEY = ("request_id", "gate", "voter")


@dataclass(frozen=True, slots=True)
class VoteResult:
    accepted: bool
    message: str
    request: ConfirmationRequest
    decided: bool = False
    unprocessable: bool = False
    """Refused for what the vote asked (changed arguments the gates do not allow), not for
    who cast it or when: the operator API answers 422."""
    answer: ClickAnswer = ClickAnswer.RECORDED
    """The callback contract's answer (a vote not ``accepted`` and not said otherwise is
    ``REFUSED``)."""

    def __post_init__(self) -> None:
        if not self.accepted and self.answer is ClickAnswer.RECORDED:
            object.__setattr__(self, "answer", ClickAnswer.REFUSED)


_GONE = frozenset({Status.EXPIRED, Status.CANCELLED})
_VERBS = {Verdict.APPROVE.value: "approved", Verdict.REJECT.value: "rejected"}


def describe_decided(req: ConfirmationRequest) -> str:
    who = req.decided_by_name or req.decided_by_user_id
    if req.status == Status.EXPIRED:
        return "This request has already expired."
    by = f" by {who}" if who and req.decided_by_channel != "system" else ""
    return f"This request was already {req.status}{by}."


def _decided_answer(req: ConfirmationRequest) -> ClickAnswer:
    return ClickAnswer.GONE if req.status in _GONE else ClickAnswer.CONFLICT


async def _own_votes(
    session: AsyncSession, request_id: str, voter: Voter, config: SignoffConfig
) -> list[Vote]:
    """The votes ``voter`` cast on request ``request_id`` (:func:`same_voter`)."""
    return [v for v in await votes_for(session, request_id) if same_voter(v, voter, config)]


def _same_decision(votes: Sequence[Vote], verdict: Verdict, grant: GrantChoice | None) -> bool:
    """Whether ``votes`` (one person's) all are ``verdict`` with ``grant``: a repeat of them."""
    chosen = grant.as_dict() if grant is not None else None
    return bool(votes) and all(v.verdict == verdict.value and v.grant_choice == chosen for v in votes)


def _same_changes(req: ConfirmationRequest, verdict: Verdict, changes: Mapping[str, Any]) -> bool:
    """Whether ``changes`` are the ones ``req`` (decided) was decided with: an approval with other
    changes, or with none after an approval with changes, is another decision, and so is a
    rejection that changes arguments."""
    if verdict is not Verdict.APPROVE or req.status != Status.APPROVED:
        return not changes
    return same(changes, edits.approved_changes(req))


def _repeat_message(req: ConfirmationRequest, verdict: Verdict) -> str:
    """The decision as it stands, for someone repeating their own ``verdict``."""
    mine = _VERBS[verdict.value]
    if req.status == Status.PENDING:
        return f"You have already voted on this request: you {mine} it; it is still waiting for others."
    who = req.decided_by_name or req.decided_by_user_id
    by = f" by {who}" if who else ""
    return f"You already {mine} this request; it is {req.status}{by}."


async def cast_vote(
    session: AsyncSession,
    request_id: str,
    *,
    voter: Voter,
    verdict: Verdict,
    config: SignoffConfig,
    reason: str | None = None,
    grant: GrantChoice | None = None,
    arguments: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> VoteResult | None:
    """Lock request ``request_id`` and :func:`apply_vote` to it. None if there is no such request."""
    req = await get_request(session, request_id, for_update=True)
    if req is None:
        return None
    return await apply_vote(
        session,
        req,
        voter=voter,
        verdict=verdict,
        config=config,
        reason=reason,
        grant=grant,
        arguments=arguments,
        now=now,
    )


async def apply_vote(
    session: AsyncSession,
    req: ConfirmationRequest,
    *,
    voter: Voter,
    verdict: Verdict,
    config: SignoffConfig,
    reason: str | None = None,
    grant: GrantChoice | None = None,
    arguments: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> VoteResult:
    """Record one vote on ``req`` (read under lock in this transaction, by
    ``get_request(..., for_update=True)``) and apply the transition it causes: every
    click, link and operator decision comes here, and the request is not read again.

    ``grant``: an approval that gives this grant instead of approving the one call; every
    gate the vote counts for must offer it. ``arguments``: an approval with these argument
    fields changed (see :mod:`signoff.app.requests.edits`). Refusals (not an approver, the
    requester, already decided, a second vote, a grant not offered, a change the gates do
    not allow) change nothing but the audit log, and say why.
    """
    now = now or utcnow()
    request_id = req.id
    changes = edits.changed_fields(req.arguments, arguments) if arguments else {}
    detail = _vote_detail(voter, verdict, reason, grant)
    if changes:
        # Values that cannot be an edit may not be storable either: the refusal names none.
        detail["arguments"] = (
            {"proposed": {name: req.arguments.get(name) for name in changes}, "approved": changes}
            if edit_problem(changes) is None
            else "refused before recording"
        )

    async def refuse(message: str, *, unprocessable: bool = False) -> VoteResult:
        await _audit_refusal(session, req, voter, detail, message)
        return VoteResult(False, message, req, unprocessable=unprocessable)

    async def answered(message: str, answer: ClickAnswer) -> VoteResult:
        await _audit_refusal(session, req, voter, detail, message)
        return VoteResult(False, message, req, answer=answer)

    if req.status != Status.PENDING:
        # The callback contract: the same person's same decision again is answered with the
        # decision as it stands; anything else names the final state and who made it.
        if (
            req.status not in _GONE
            and _same_changes(req, verdict, changes)
            and _same_decision(await _own_votes(session, request_id, voter, config), verdict, grant)
        ):
            return await answered(_repeat_message(req, verdict), ClickAnswer.REPEATED)
        return await answered(describe_decided(req), _decided_answer(req))
    if req.expires_at <= now:
        await expire(session, req, now=now)
        return await answered("This request has already expired.", ClickAnswer.GONE)
    gates = gates_of(req)
    requesters = (req.requester, req.user_id)
    eligible, why = eligible_gates(
        gates, requesters=requesters, voter=voter, config=config, created_at=req.created_at, now=now
    )
    if verdict is Verdict.APPROVE and eligible:
        # A reload since the request was made: the gates as configured now must take it too.
        eligible, why = approving_gates(
            gates,
            eligible,
            req.agent_id,
            requesters=requesters,
            voter=voter,
            config=config,
            created_at=req.created_at,
            now=now,
        )
    if not eligible:
        return await refuse(why or NOT_AN_APPROVER)
    if (
        verdict is Verdict.REJECT
        and any(gates[i].require_reject_reason for i in eligible)
        and not (reason and reason.strip())
    ):
        return await refuse("A reason is required to reject this request.")
    if grant is not None:
        if verdict is not Verdict.APPROVE:
            return await refuse("A grant is given with an approval, not a rejection.")
        why_not = grants.choice_refusal(grant, [gates[i] for i in eligible], session_id=req.session_id)
        if why_not is not None:
            return await refuse(why_not)
    if changes:
        if verdict is not Verdict.APPROVE:
            return await refuse(
                "Changed arguments come with an approval, not a rejection.", unprocessable=True
            )
        why_not = edits.edit_refusal(req, gates, eligible, changes, config, grant=grant)
        if why_not is not None:
            return await refuse(why_not, unprocessable=True)

    # One row per gate the vote counts for; a gate this voter already voted on keeps that vote,
    # whatever channel or spelling it came through. (A lone gate of quorum one took no vote
    # before this one: any vote decides it.)
    quorums = [g.quorum for g in gates]
    voted_on = (
        set() if quorums == [1] else {v.gate for v in await _own_votes(session, request_id, voter, config)}
    )
    counted = [
        i
        for i in eligible
        if i not in voted_on
        and await _insert_vote(session, request_id, i, voter, verdict, reason, grant, now)
    ]
    if not counted:
        mine = [v for v in await _own_votes(session, request_id, voter, config) if v.gate in eligible]
        if _same_decision(mine, verdict, grant):
            return await answered(_repeat_message(req, verdict), ClickAnswer.REPEATED)
        return await answered("You have already voted on this request.", ClickAnswer.CONFLICT)
    names = [gates[i].name for i in counted]
    log_after_commit(
        session,
        "vote",
        request_id,
        agent=req.agent_id,
        tool=req.tool_name,
        gate=",".join(names),
        who=voter.name or voter.key,
        verdict=verdict.value,
    )
    voted = [audit.Entry(audit.Action.VOTE, voter.actor, request_id, {**detail, "gates": names})]

    decided_by = voter.actor
    if verdict is Verdict.REJECT:
        await transition(
            session, request_id, Status.REJECTED, actor=decided_by, reason=reason, now=now, along=voted
        )
        return VoteResult(True, f"Rejected by {decided_by.name or decided_by.id}.", req, decided=True)

    # One gate with a quorum of one: this vote is the approval (the request was pending, under lock).
    if quorums == [1]:
        approvals = [1]
    else:
        approvals = per_gate(await approvals_by_gate(session, [request_id]), request_id, len(gates))
    if all(a >= q for a, q in zip(approvals, quorums, strict=True)):
        won = await transition(
            session,
            request_id,
            Status.APPROVED,
            actor=decided_by,
            reason=reason,
            now=now,
            along=voted,
            changes=changes,
        )
        if won and changes:
            await edits.record_approved(session, req, changes)
        given = await grants.create_for_approval(session, req, actor=decided_by, now=now) if won else []
        how = f" {grants.approved_how(given[0])}" if given else " once"
        who = decided_by.name or decided_by.id
        if won and changes:
            how = f" {grants.approved_how(given[0])}" if given else ""
            changed = changes_text(edits.argument_changes(req))
            return VoteResult(True, f"Approved by {who}{how} with changes: {changed}.", req, decided=True)
        return VoteResult(True, f"Approved{how} by {who}.", req, decided=True)
    await queue_updates(session, request_id)
    await audit.append_many(session, voted)
    return VoteResult(True, _progress(gates, counted, approvals, quorums), req)


def _progress(
    gates: Sequence[GateSnapshot],
    counted: Sequence[int],
    approvals: Sequence[int],
    quorums: Sequence[int],
) -> str:
    """What an approval that did not decide the request changed, and what it still waits for."""
    if len(gates) == 1:
        return f"Approval recorded ({approvals[0]} of {quorums[0]})."

    def state(i: int) -> str:
        return f"{gates[i].name} {approvals[i]} of {quorums[i]}"

    waiting = [i for i in range(len(gates)) if approvals[i] < quorums[i]]
    recorded = ", ".join(state(i) for i in counted)
    return f"Approval recorded ({recorded}); still waiting for {', '.join(state(i) for i in waiting)}."


async def _insert_vote(
    session: AsyncSession,
    request_id: str,
    gate: int,
    voter: Voter,
    verdict: Verdict,
    reason: str | None,
    grant: GrantChoice | None,
    now: datetime,
) -> bool:
    """Record ``voter``'s vote for gate ``gate``; False if they already voted on it."""
    vote = Vote(
        request_id=request_id,
        gate=gate,
        voter=voter.key,
        verdict=verdict.value,
        channel=voter.channel,
        user_id=voter.user_id,
        name=voter.name,
        email=voter.email,
        reason=reason,
        # The provider's groups the voter was in, by which a grant they give is checked again.
        identity={**(voter.identity or {}), **({"groups": sorted(voter.groups)} if voter.groups else {})},
        assurance=voter.assurance.value if voter.assurance is not None else None,
        created_at=now,
        grant_choice=grant.as_dict() if grant is not None else None,
    )
    forget(session)
    return await insert_unless_taken(session, _VOTES, _VOTE_KEY, core_row(vote, skip=("id",)))


def _vote_detail(
    voter: Voter, verdict: Verdict, reason: str | None, grant: GrantChoice | None = None
) -> dict[str, Any]:
    identity = dict(voter.identity or {})
    if voter.email:
        identity["email"] = voter.email
    detail: dict[str, Any] = {"verdict": verdict.value, "reason": reason, "identity": identity}
    detail["assurance"] = voter.assurance.value if voter.assurance is not None else None
    if voter.person:
        detail["person"] = voter.person  # names the voter where their channel id is not shown
    if grant is not None:
        detail["grant"] = grant.as_dict()
    return detail


async def _audit_refusal(
    session: AsyncSession, req: ConfirmationRequest, voter: Voter, detail: dict[str, Any], why: str
) -> None:
    log_after_commit(
        session,
        "vote refused",
        req.id,
        agent=req.agent_id,
        tool=req.tool_name,
        gate=gate_names(req.gate, req.gates),
        who=voter.name or voter.key,
        verdict=detail.get("verdict"),
        why=why,
    )
    await audit.append(
        session,
        audit.Action.VOTE_REFUSED,
        actor=voter.actor,
        request_id=req.id,
        detail={**detail, "why": why},
    )


async def refuse_vote(
    session: AsyncSession,
    req: ConfirmationRequest,
    *,
    voter: Voter,
    verdict: Verdict,
    why: str,
    reason: str | None = None,
) -> VoteResult:
    """Refuse a vote on ``req`` for a reason found before voting (where the click came from,
    who the clicker is): only the audit log changes."""
    await _audit_refusal(session, req, voter, _vote_detail(voter, verdict, reason), why)
    return VoteResult(False, why, req)
