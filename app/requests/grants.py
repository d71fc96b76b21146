"""Grants: what an approver may allow beyond the one call.

A gate may offer grants (``grants: [{scope: session, for: 1h, same: [to]}]``). An approver
who chooses one instead of "approve once" lets later calls through without asking while the
grant is active (not expired, not revoked) and the call is covered:

- the same agent, and the tool exactly as the approved call named it (no case folding, no
  look-alike mapping: those widen what a *gate* catches, never what a grant allows);
- for ``scope: session``, the same session id (a call without one is never covered);
- each ``same`` field equal to the approved call's, compared as canonical JSON, so the type
  counts (``1``, ``1.0``, ``"1"`` and ``true`` all differ) and text is compared as sent
  (no Unicode normalisation); a field absent from the approved call must be absent;
- the gate, as configured now, still offers a grant at least as narrow, for no less time
  since the grant was given (a reload that narrows or shortens the offers ends or shortens it);
- the gate, as configured now, would take the grantors' approval of this call: enough of them
  for its quorum are still its approvers (its escalations' included), identified surely
  enough, voting where its cards go (operators anywhere); where it forbids self-approval, a
  grantor never counts for a call made on their own behalf. A reload that removes a grantor,
  raises the quorum or the level needed ends what they granted.

A grant stands in for its own gate only. A call matching several gates is allowed by grants
alone when every one of them has one; otherwise a request asks the gates without one (the
granted gates are checked again, against their rows, each time the call is answered).

With a quorum, the grant given is the narrowest of the approving votes' choices: ``session``
is narrower than ``agent``, a shorter time narrower than a longer one, more ``same`` fields
narrower than fewer; any approver who approved once makes it an approval once. Incomparable
choices meet: the narrowest scope, the shortest time and every field any of them held equal.

Every use re-reads the grant's row in a conditional UPDATE (no cache), so a revocation on
any replica stops the next call, and expiry needs no sweep.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import GRANT_CREATED, GRANT_REVOKED, SignoffConfig
from signoff.app.db import core_row, emit
from signoff.app.models import ConfirmationRequest, Grant, Vote, utcnow
from signoff.app.requests.canonical import canonical
from signoff.app.requests.eligibility import GateSnapshot, Voter, gate_refusal, gates_of, recorded
from signoff.channels import Assurance, GrantChoice, Verdict, duration_text, while_same
from signoff.hooks import HookContext

__all__ = [
    "approved_how",
    "argument_digests",
    "choice_refusal",
    "covers",
    "create_for_approval",
    "describe",
    "field_digest",
    "find_for_call",
    "given",
    "grants_by_request",
    "list_grants",
    "meet",
    "offers_of",
    "resolve_choice",
    "revoke",
    "use",
]

_GRANTS: sa.Table = Grant.__table__  # type: ignore[attr-defined]
_INSERT = sa.insert(_GRANTS)
_ABSENT = "\x00absent"
"""What an absent field is digested as: no JSON text starts with NUL."""


def field_digest(arguments: Mapping[str, Any], name: str) -> str:
    """The SHA-256 of argument ``name``'s canonical value (or of its absence)."""
    text = canonical(arguments[name]) if name in arguments else _ABSENT
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def argument_digests(gate: ConfirmationGate, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The digests of every field the gate's grants may hold equal, as the call has them (a
    request keeps these: its stored arguments are redacted, the digests are of the real ones)."""
    return {name: field_digest(arguments, name) for offer in gate.grants for name in offer.same}


def offers_of(gate: GateSnapshot) -> list[GrantChoice]:
    """The grants a request's gate offered when the call was made."""
    return list(gate.grants)


def meet(choices: Sequence[GrantChoice]) -> GrantChoice:
    """The narrowest grant within every one of ``choices`` (see the module's description)."""
    scope = "session" if any(c.scope == "session" for c in choices) else "agent"
    same = tuple(sorted({name for c in choices for name in c.same}))
    return GrantChoice(scope, min(c.seconds for c in choices), same)


def given(votes: Iterable[Vote], gate: int) -> GrantChoice | None:
    """The grant the approving votes on gate ``gate`` give: None when any approved once."""
    choices = []
    for vote in votes:
        if vote.gate != gate or vote.verdict != Verdict.APPROVE:
            continue
        if not vote.grant_choice:
            return None
        try:
            choices.append(GrantChoice.from_dict(vote.grant_choice))
        except ValueError:
            return None
    return meet(choices) if choices else None


def choice_refusal(
    choice: GrantChoice, gates: Sequence[GateSnapshot], *, session_id: str | None
) -> str | None:
    """Why an approval of ``gates`` (the ones a vote counts for) cannot give ``choice``."""
    for gate in gates:
        offers = offers_of(gate)
        if choice not in offers:
            name = gate.name
            if not offers:
                return f"The gate {name!r} offers no grants: approve once."
            listed = "; ".join(_offer_text(o) for o in offers)
            return f"The gate {name!r} does not offer that grant (it offers: {listed})."
    if choice.scope == "session" and not session_id:
        return "This call names no session, so it cannot be approved for the session."
    return None


def resolve_choice(
    gates: Sequence[GateSnapshot], *, scope: str, seconds: int, same: Sequence[str] | None
) -> GrantChoice | str:
    """The offered grant an operator names by scope and time (and ``same``, when given, or when
    the scope and time alone name several), or why none is meant."""
    offers = list(dict.fromkeys(o for g in gates for o in offers_of(g)))
    fitting = [o for o in offers if o.scope == scope and o.seconds == seconds]
    if same is not None:
        fitting = [o for o in fitting if set(o.same) == set(same)]
    if len(fitting) == 1:
        return fitting[0]
    if not offers:
        return "This request's gates offer no grants: approve once."
    listed = "; ".join(_offer_text(o) for o in offers)
    if not fitting:
        return f"This request's gates offer no such grant (they offer: {listed})."
    return f"Several grants fit; say which fields stay the same (they offer: {listed})."


def _offer_text(offer: GrantChoice) -> str:
    text = f"{offer.scope} for {duration_text(offer.seconds)}"
    return text + (f" with the same {', '.join(offer.same)}" if offer.same else "")


def approved_how(grant: Grant) -> str:
    """What an approval with ``grant`` authorized: ``for this session until 2026-12-01 11:32 UTC``."""
    where = "this session" if grant.scope == "session" else "this agent"
    return f"for {where} until {grant.expires_at.strftime('%Y-%m-%d %H:%M UTC')}"


def describe(grant: Grant) -> str:
    """The grant as an allow's reason names it."""
    where = f"session {grant.session_id}" if grant.scope == "session" else f"agent {grant.agent_id}"
    until = grant.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    same = f", {while_same(sorted(grant.same))}" if grant.same else ""
    return f"allowed by grant {grant.id} from {grant.granted_by} (for {where}, until {until}{same})"


async def create_for_approval(
    session: AsyncSession, req: ConfirmationRequest, *, actor: Actor, now: datetime
) -> list[Grant]:
    """In the approving transaction: the grant each gate's approving votes give, stored and
    audited (``grant_created``). A request whose gates offer no grant has none to give, and
    its votes are not read: a vote names a grant only where its gate offers it (apply_vote)."""
    gates = gates_of(req)
    if not any(offers_of(gate) for gate in gates):
        return []
    votes = list(
        (await session.exec(select(Vote).where(col(Vote.request_id) == req.id).order_by(col(Vote.id)))).all()
    )
    made: list[Grant] = []
    for index, gate in enumerate(gates):
        choice = given(votes, index)
        if choice is None:
            continue
        digests = gate.argument_digests
        if any(name not in digests for name in choice.same):
            continue  # the call's values were not kept: nothing could be held equal
        approving = [v for v in votes if v.gate == index and v.verdict == Verdict.APPROVE]
        grant = Grant(
            id=uuid.uuid4().hex,
            request_id=req.id,
            agent_id=req.agent_id,
            scope=choice.scope,
            session_id=req.session_id if choice.scope == "session" else None,
            tool_name=req.tool_name,
            gate=gate.key,
            same={name: digests[name] for name in choice.same},
            same_shown={name: req.arguments.get(name) for name in choice.same},
            granted_by=", ".join(dict.fromkeys(v.name or v.voter for v in approving))[:1000],
            grantors=[_grantor(v) for v in approving],
            created_at=now,
            expires_at=now + timedelta(seconds=choice.seconds),
        )
        await session.exec(_INSERT, params=core_row(grant))
        made.append(grant)
    await audit.append_many(
        session,
        [
            audit.Entry(
                Action.GRANT_CREATED,
                actor,
                req.id,
                {
                    "grant": g.id,
                    "gate": g.gate,
                    "scope": g.scope,
                    "session_id": g.session_id,
                    "tool": g.tool_name,
                    "same": g.same_shown,
                    "granted_by": g.granted_by,
                    "expires_at": g.expires_at.isoformat(),
                },
            )
            for g in made
        ],
    )
    emit(session, GRANT_CREATED, [g.id for g in made], now=now)
    return made


def _grantor(vote: Vote) -> dict[str, Any]:
    person = vote.voter if ":" not in vote.voter else None
    identity = vote.identity or {}
    subject = identity.get("subject")
    return {
        "voter": vote.voter,
        "person": person,
        "channel": vote.channel,
        "user_id": vote.user_id,
        "name": vote.name,
        "email": vote.email,
        # The identity provider's subject names the grantor too: a call made for it is theirs.
        "aliases": [subject] if isinstance(subject, str) and subject else [],
        # What the grantor was approving as, checked again against the gate as it is now.
        "identity": identity,
        "assurance": vote.assurance,
    }


def _as_voter(grantor: Mapping[str, Any], config: SignoffConfig) -> Voter:
    """A grant's grantor as the voter they were (a grant stored before the grantor's identity
    and level were kept knows neither: such a grantor is no ``group:`` member, and below every
    level)."""
    aliases = tuple(str(a) for a in grantor.get("aliases") or ())
    identity = grantor.get("identity")
    if not isinstance(identity, dict):
        identity = {"subject": aliases[0]} if aliases else {}
    groups = identity.get("groups")
    channel = str(grantor.get("channel", ""))
    level = str(grantor.get("assurance"))
    assurance = Assurance(level) if level in set(Assurance) else None
    return Voter(
        channel=channel,
        user_id=str(grantor.get("user_id", "")),
        person=grantor.get("person"),
        identity={k: v for k, v in identity.items() if isinstance(v, str)},
        email=grantor.get("email"),
        operator=config.is_web(channel),
        assurance=assurance,
        groups=frozenset(str(g) for g in groups) if isinstance(groups, list) else frozenset(),
        aliases=aliases,
    )


def _grantors_hold(grant: Grant, gate: GateSnapshot, call: HookContext, config: SignoffConfig) -> bool:
    """Whether the grant's grantors would approve ``call`` through ``gate`` (as configured now):
    enough of them for its quorum still approvers (its escalations' included), identified
    surely enough, voting where its cards go (operators anywhere), and none approving for
    themselves where the gate forbids it."""
    requesters = (config.recognise(call.user_id), call.user_id) if call.user_id else ()
    # Every escalation counts, as if its time had come by the grant.
    latest = max((e.after_seconds for e in gate.escalations), default=0.0)
    since = grant.created_at - timedelta(seconds=latest)
    holding = sum(
        gate_refusal(
            gate,
            channel=gate.channel,
            requesters=requesters,
            voter=_as_voter(grantor, config),
            config=config,
            created_at=since,
            now=grant.created_at,
        )
        is None
        for grantor in grant.grantors
        if isinstance(grantor, Mapping)
    )
    return holding >= gate.quorum


def covers(
    grant: Grant,
    gate: ConfirmationGate,
    call: HookContext,
    config: SignoffConfig,
    *,
    now: datetime | None = None,
) -> bool:
    """Whether ``grant`` (read as active) allows ``call`` through ``gate`` (see the module)."""
    if grant.agent_id != call.agent_id or grant.tool_name != call.tool_name:
        return False
    if grant.scope == "session":
        if not call.session_id or grant.session_id != call.session_id:
            return False
    elif grant.scope != "agent":
        return False
    now = now or utcnow()
    if not any(
        (offer.scope == "agent" or grant.scope == "session")
        and set(offer.same) <= set(grant.same)
        and now < grant.created_at + offer.for_
        for offer in gate.grants
    ):
        # The gate (as reloaded) offers nothing this grant is as narrow as: it no longer holds.
        return False
    if any(field_digest(call.arguments, name) != digest for name, digest in grant.same.items()):
        return False
    return _grantors_hold(grant, recorded(grant.gate, gate, config)[0], call, config)


async def find_for_call(
    session: AsyncSession,
    call: HookContext,
    gates: Sequence[tuple[str, ConfirmationGate]],
    config: SignoffConfig,
    *,
    now: datetime | None = None,
) -> dict[str, Grant]:
    """The active grant covering ``call`` for each of ``gates`` (by key) that has one. Gates
    that offer no grants (now) are not looked up: taking ``grants`` off a gate ends them, and
    narrowing them ends the grants wider than every offer left."""
    offering = {key: gate for key, gate in gates if gate.grants}
    if not offering:
        return {}
    now = now or utcnow()
    g = Grant
    stmt = (
        select(g)
        .where(
            col(g.agent_id) == call.agent_id,
            col(g.tool_name) == call.tool_name,
            col(g.gate).in_(list(offering)),
            col(g.revoked_at).is_(None),
            col(g.expires_at) > now,
        )
        .order_by(col(g.created_at))
    )
    found: dict[str, Grant] = {}
    for grant in (await session.exec(stmt)).all():
        if grant.gate not in found and covers(grant, offering[grant.gate], call, config, now=now):
            found[grant.gate] = grant
    return found


async def use(
    session: AsyncSession, grant: Grant, *, agent: str, detail: Mapping[str, Any], now: datetime | None = None
) -> bool:
    """Count one use of ``grant`` if its row says it is still active (audited ``grant_used``);
    False when it was revoked or expired meanwhile."""
    now = now or utcnow()
    g = _GRANTS.c
    row = (
        await session.exec(
            sa.update(_GRANTS)
            .where(g.id == grant.id, g.revoked_at.is_(None), g.expires_at > now)
            .values(uses=g.uses + 1, last_used_at=now)
            .returning(g.uses)
        )
    ).first()
    if row is None:
        return False
    await audit.append(
        session,
        Action.GRANT_USED,
        actor=Actor("agent", agent),
        detail={
            "grant": grant.id,
            "request": grant.request_id,
            "granted_by": grant.granted_by,
            "uses": int(row[0]),
            **detail,
        },
    )
    return True


async def revoke(
    session: AsyncSession, grant_id: str, *, actor: Actor, now: datetime | None = None
) -> tuple[Grant | None, bool]:
    """Revoke a grant (audited ``grant_revoked``): the grant, and whether this revoked it
    (False: it was already revoked). ``(None, False)`` if there is no such grant."""
    now = now or utcnow()
    g = _GRANTS.c
    by = (actor.name or actor.id or actor.channel)[:200]
    done = (
        await session.exec(
            sa.update(_GRANTS)
            .where(g.id == grant_id, g.revoked_at.is_(None))
            .values(revoked_at=now, revoked_by=by)
            .returning(g.id)
        )
    ).first()
    grant = (
        await session.exec(
            select(Grant).where(col(Grant.id) == grant_id).execution_options(populate_existing=True)
        )
    ).one_or_none()
    if grant is None or done is None:
        return grant, False
    await audit.append(
        session,
        Action.GRANT_REVOKED,
        actor=actor,
        request_id=grant.request_id,
        detail={
            "grant": grant.id,
            "gate": grant.gate,
            "uses": grant.uses,
            "expired": grant.expires_at <= now,
        },
    )
    emit(session, GRANT_REVOKED, [grant.id], now=now)
    return grant, True


async def list_grants(
    session: AsyncSession,
    *,
    active: bool | None = None,
    agent: str | None = None,
    now: datetime | None = None,
    limit: int = 200,
) -> list[Grant]:
    """Grants newest first; ``active``: only those still allowing calls (or only those not)."""
    now = now or utcnow()
    g = Grant
    stmt = select(g).order_by(col(g.created_at).desc(), col(g.id).desc()).limit(limit)
    live = sa.and_(col(g.revoked_at).is_(None), col(g.expires_at) > now)
    if active is True:
        stmt = stmt.where(live)
    elif active is False:
        stmt = stmt.where(sa.not_(live))
    if agent is not None:
        stmt = stmt.where(col(g.agent_id) == agent)
    return list((await session.exec(stmt)).all())


async def grants_by_request(session: AsyncSession, request_ids: Iterable[str]) -> dict[str, list[Grant]]:
    """The grants given with each of ``request_ids`` (one query)."""
    ids = list(request_ids)
    out: dict[str, list[Grant]] = {rid: [] for rid in ids}
    if ids:
        stmt = select(Grant).where(col(Grant.request_id).in_(ids)).order_by(col(Grant.created_at))
        for grant in (await session.exec(stmt)).all():
            out[grant.request_id].append(grant)
    return out
