"""A request as a card: the plain data a channel draws (:class:`signoff.channels.Card`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from signoff.app.config import SignoffConfig
from signoff.app.edits import argument_changes, editable_fields
from signoff.app.eligibility import gates_of
from signoff.app.grants import given, meet, offers_of
from signoff.app.models import ConfirmationRequest, Status, Vote
from signoff.channels import Card, GateProgress, GrantChoice, Person, Verdict

__all__ = ["build_card"]


def build_card(
    req: ConfirmationRequest, votes: Sequence[Vote], config: SignoffConfig, channel_type: str, *, channel: str
) -> Card:
    """Plain data for ``channel`` to draw ``req`` as it stands: the card of the gates posted
    there (and, when the request needs several gates, how each one stands)."""

    def person(key: str) -> Person:
        if key in config.people:
            return Person(config.display_name(key), config.channel_id_of(key, channel_type))
        return Person(key, key)

    gates = gates_of(req)
    here = [i for i, g in enumerate(gates) if g.channel == channel] or list(range(len(gates)))
    approving = [v for v in votes if v.verdict == Verdict.APPROVE]

    def approvals(gate: int) -> tuple[Person, ...]:
        return tuple(Person(v.name or v.voter, v.user_id) for v in approving if v.gate == gate)

    progress = tuple(
        GateProgress(g.name, g.quorum, approvals(i), here=i in here) for i, g in enumerate(gates)
    )
    decided_by = None
    if req.status != Status.PENDING and req.decided_by_channel != "system":
        decided_by = Person(req.decided_by_name or req.decided_by_user_id or "", req.decided_by_user_id)
    # The grants every gate of this card offers (one click counts for each of them); for
    # session, only when the call names its session.
    offers = [o for o in offers_of(gates[here[0]]) if all(o in offers_of(gates[i]) for i in here)]
    offers = [o for o in offers if o.scope != "session" or req.session_id]
    granted: GrantChoice | None = None
    if req.status == Status.APPROVED:
        per_gate = [given(votes, i) for i in here]
        granted = meet([g for g in per_gate if g]) if all(per_gate) else None
    # Changes come only with an approval that decides alone: every gate is on this card.
    editable = editable_fields(gates) if len(here) == len(gates) and req.status == Status.PENDING else ()
    approvers = dict.fromkeys(a for i in here for a in gates[i].approvers)
    voters = {v.voter: Person(v.name or v.voter, v.user_id) for v in approving if v.gate in here}
    return Card(
        request_id=req.id,
        agent_id=req.agent_id,
        tool_name=req.tool_name,
        arguments=req.arguments,
        status=str(req.status.value if isinstance(req.status, Status) else req.status),
        created_at=req.created_at,
        expires_at=req.expires_at,
        quorum=sum(progress[i].quorum for i in here),
        approvers=tuple(person(a) for a in approvers),
        requester=person(req.requester)
        if req.requester
        else (Person(req.user_id, req.user_id) if req.user_id else None),
        approvals=tuple(voters.values()),
        decided_by=decided_by,
        decided_at=req.decided_at,
        reason=req.reason,
        require_reject_reason=any(gates[i].require_reject_reason for i in here),
        gates=progress if len(gates) > 1 else (),
        grants=tuple(offers) if req.status == Status.PENDING else (),
        granted=granted,
        granted_until=req.decided_at + timedelta(seconds=granted.seconds)
        if granted is not None and req.decided_at
        else None,
        editable=editable,
        changes=argument_changes(req) if req.status == Status.APPROVED else (),
    )
