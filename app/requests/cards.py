"""A request as a card: the plain data a channel draws (:class:`signoff.channels.Card`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from urllib.parse import quote

from signoff.app.channel_types import identity_of
from signoff.app.config import SignoffConfig, identity_key
from signoff.app.models import ConfirmationRequest, Status, Vote, utcnow
from signoff.app.requests.edits import argument_changes, editable_fields
from signoff.app.requests.eligibility import GateSnapshot, card_gates, gates_of
from signoff.app.requests.grants import given, meet, offers_of
from signoff.channels import Card, GateProgress, GrantChoice, Person, Verdict, shown_text

__all__ = ["build_card", "escalated_to", "waiting_on"]


def _person(key: str, config: SignoffConfig, channel_type: str, gate: GateSnapshot | None = None) -> Person:
    """Someone a gate names (a directory key or a raw id), as a ``channel_type`` card names them."""
    if key in config.people:
        return Person(config.display_name(key), config.channel_id_of(key, channel_type))
    name = gate.name_of(key) if gate is not None else key
    return Person(name, key if identity_of(channel_type).is_user_id(key) else None)


def waiting_on(
    req: ConfirmationRequest,
    votes: Sequence[Vote],
    config: SignoffConfig,
    channel_type: str,
    *,
    gate: int,
    now: datetime,
) -> tuple[Person, ...]:
    """Who may still decide gate ``gate`` of ``req`` by ``now`` and has not voted on it (empty
    when it names nobody: anyone who sees its card may decide)."""
    snapshot = gates_of(req)[gate]
    voted = {v.voter for v in votes if v.gate == gate}
    voted_ids = {identity_key(v.user_id) for v in votes if v.gate == gate}
    elapsed = (now - req.created_at).total_seconds()
    left = []
    for approver in snapshot.approvers_at(elapsed):
        person = config.recognise(approver)
        if (person is not None and person in voted) or identity_key(approver) in voted_ids:
            continue
        left.append(_person(person or approver, config, channel_type, snapshot))
    return tuple(left)


def escalated_to(
    req: ConfirmationRequest, config: SignoffConfig, channel_type: str, *, gate: int, step: int
) -> tuple[Person, ...]:
    """The approvers escalation ``step`` of gate ``gate`` adds, as a ``channel_type`` card names them."""
    snapshot = gates_of(req)[gate]
    approvers = snapshot.escalations[step].approvers
    return tuple(_person(config.recognise(a) or a, config, channel_type, snapshot) for a in approvers)


def _requester(claimed: str | None, config: SignoffConfig, person: Callable[[str], Person]) -> Person | None:
    """Whom the call is on behalf of: a person of the directory, or else the agent's word (its
    ``user_id``) as text, never a mention of whoever holds an id spelled so (an agent could make a
    card read "on behalf of" the chief executive)."""
    if not claimed:
        return None
    return person(claimed) if claimed in config.people else Person(shown_text(claimed))


def build_card(
    req: ConfirmationRequest,
    votes: Sequence[Vote],
    config: SignoffConfig,
    channel_type: str,
    *,
    channel: str,
    now: datetime | None = None,
    public_url: str | None = None,
) -> Card:
    """Plain data for ``channel`` to draw ``req`` as it stands by ``now``: the card of the
    gates posted there (their own channel, or one they escalated to by then), and, when the
    request needs several gates, how each one stands. ``public_url`` (``SIGNOFF_PUBLIC_URL``)
    makes the link to the request in the console."""

    def person(key: str) -> Person:
        if key in config.people:
            return Person(config.display_name(key), config.channel_id_of(key, channel_type))
        # A raw id the configuration lists (an approver by channel id): shown on one line.
        return Person(shown_text(key), key)

    now = now or utcnow()
    gates = gates_of(req)
    elapsed = (now - req.created_at).total_seconds()
    here = card_gates(gates, channel, created_at=req.created_at, now=now) or list(range(len(gates)))
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
    approvers = dict.fromkeys(a for i in here for a in gates[i].approvers_at(elapsed))
    voters = {v.voter: Person(v.name or v.voter, v.user_id) for v in approving if v.gate in here}
    return Card(
        request_id=req.id,
        agent_id=req.agent_id,
        # Text the agent chose, shown on one line as it is (it cannot draw a card's own lines).
        tool_name=shown_text(req.tool_name),
        arguments=req.arguments,
        status=str(req.status.value if isinstance(req.status, Status) else req.status),
        created_at=req.created_at,
        expires_at=req.expires_at,
        quorum=sum(progress[i].quorum for i in here),
        approvers=tuple(person(a) for a in approvers),
        requester=_requester(req.requester or req.user_id, config, person),
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
        console_url=f"{public_url}/ui/requests/{quote(req.id, safe='')}" if public_url else None,
    )
