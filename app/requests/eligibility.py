"""Who may vote on a gate: pure rules over the gate, the requester and the voter.

Every gate a call matched must approve it (a request's ``gates``); each gate's card goes
to that gate's channel, and a vote counts for the gate(s) of the card it came from that
the voter may approve (:func:`eligible_gates`).

The state machine (:func:`signoff.app.requests.votes.cast_vote`) applies them under the
request's lock; the console asks the same functions for its hints. Nothing here reads
the database.

People are recognised by their directory key, any of their channel ids or their email,
in any spelling (:func:`signoff.app.config.identity_key`). Recognition is used both
ways, and never to the voter's advantage:

- a click counts only from the **channel** its card was posted to (the channel's
  conversation is checked by :class:`signoff.app.requests.clicks.ClickService`); operators,
  authenticated, decide wherever the card went (someone signed in through the identity
  provider whom no operator entry names: as a listed approver only, never on a gate open to
  whoever sees its card elsewhere);
- a gate's **escalations** widen it once their time has come (by the server's clock at
  the vote, from the request's creation): their channel's card counts, and their
  approvers may decide, on that card or the gate's own; before then a click from one of
  them is refused, saying from when it will count;
- being an **approver** takes the id the channel vouched for (the clicker's user id on
  that channel type, or the operator's name): a looked-up email grants nothing, since a
  profile's email may be the clicker's to edit;
- being the **requester** takes everything that names the voter (that id, any directory
  entry it or their looked-up email recognises, the raw id and email themselves), so no
  second spelling or second account with the same email approves its own call;
- a **vote already cast** is the voter's by their directory key, by the same account on a
  channel of the same type (a card and its escalation in another conversation of one
  workspace; Feishu's ``union_id`` across apps), or, for someone identified by the identity
  provider, by its subject alone (an email changed there is the same voter; an email or
  username it repeats names nobody else): one person's votes never count twice toward a
  quorum, and nobody's claim to another's id takes that other's vote (:func:`same_voter`);
- a **reload** never widens who decides a request already asked, and narrows it at once:
  an approval counts only where the gate as configured now takes it too
  (:func:`approval_refusal`).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict

from signoff.app.audit import Actor
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.channel_types import CHANNEL_TYPES, identity_of
from signoff.app.config import SignoffConfig, identity_key
from signoff.app.models import AuditEvent, ConfirmationRequest, Vote
from signoff.channels import Assurance, GrantChoice, below

__all__ = [
    "GATE_GONE",
    "GROUP_PREFIX",
    "NOT_AN_APPROVER",
    "NOT_HERE",
    "NOT_SHOWN",
    "OUTSIDER",
    "OWN_CALL",
    "EscalationStep",
    "GateSnapshot",
    "Voter",
    "approval_refusal",
    "approving_gates",
    "asked",
    "assurance_refusal",
    "card_gates",
    "eligible_gates",
    "gate_refusal",
    "gates_of",
    "is_not_yet",
    "is_requester",
    "not_yet",
    "recorded",
    "same_voter",
    "shown_ids",
]

NOT_HERE = "This request's card was not posted here, so a click here does not count."
NOT_AN_APPROVER = "You are not an approver for this request."
OWN_CALL = "You cannot approve a call made on your own behalf."
OUTSIDER = (
    "This gate is open to its channel's own organisation and you are a member of another one: "
    "ask for your id to be listed as an approver."
)
GROUP_PREFIX = "group:"
"""An approver written ``group:NAME`` is everyone the identity provider puts in group NAME."""
_TOO_WEAK = "This gate takes votes identified by "


def assurance_refusal(minimum: str, level: Assurance | None) -> str:
    """Why a vote identified at ``level`` does not count on a gate needing ``minimum``."""
    how = f"yours was identified by {level.value}" if level else "how yours was identified is unknown"
    return (
        f"{_TOO_WEAK}{minimum} or stronger and {how}; sign in to the console through your "
        "organisation's sign-in to vote."
        if minimum == Assurance.OIDC.value
        else f"{_TOO_WEAK}{minimum} or stronger and {how}; vote where you are identified that surely."
    )


_NOT_YET = "This request is escalated to you at "


def not_yet(when: datetime) -> str:
    """Why an escalation's approver may not decide yet: from ``when`` they may."""
    return f"{_NOT_YET}{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC; your vote counts from then."


def is_not_yet(why: str) -> bool:
    """Whether a refusal is :func:`not_yet`'s: the voter's escalation has not come yet."""
    return why.startswith(_NOT_YET)


class EscalationStep(BaseModel):
    """One escalation of a gate as a request recorded it."""

    model_config = ConfigDict(frozen=True)

    after_seconds: float
    """How long after the request was made it escalates (if nobody decided by then)."""
    channel: str
    """Where its card goes then."""
    approvers: tuple[str, ...] = ()
    """Who else may decide from then on."""


class GateSnapshot(BaseModel):
    """One gate as a request recorded it (an entry of its ``gates``): who was asked and what
    they decide by, whatever the configuration becomes (a reload can only narrow it:
    :func:`approval_refusal`). Read from the row by :func:`gates_of`."""

    model_config = ConfigDict(frozen=True)

    key: str = ""
    """The gate's key among the agent's gates: its name, numbered when two share one."""
    name: str = ""
    channel: str = ""
    """The channel its card goes to."""
    approvers: tuple[str, ...] = ()
    """Directory keys or raw channel user ids; empty: anyone who sees the card."""
    quorum: int = 1
    allow_self_approval: bool = False
    require_reject_reason: bool = False
    timeout_seconds: float = 0.0
    """How long its approvers had."""
    approval_valid_for_seconds: float | None = None
    """How long after the decision its approval allows the call (None: recorded before the
    gate said; the default applies)."""
    grants: tuple[GrantChoice, ...] = ()
    """The grants its approvers were offered beside approving once."""
    editable: tuple[str, ...] = ()
    """The argument fields its approver could change before approving."""
    argument_digests: dict[str, str] = {}
    """The digest of each argument field those grants may hold equal, as the call had it."""
    config_version: str | None = None
    """The configuration the request was gated under (one for all its gates)."""
    escalations: tuple[EscalationStep, ...] = ()
    """Where it escalates, and who else may decide from when, earliest first."""
    names: dict[str, str] = {}
    """Each approver's (and escalation approver's) display name as the request was made."""
    min_assurance: str | None = None
    """The weakest :class:`Assurance` a vote on it may have (None: any)."""

    def due(self, elapsed: float | None) -> list[EscalationStep]:
        """The escalations whose time has come ``elapsed`` seconds after the request was made
        (None: no time is known, so none)."""
        if elapsed is None:
            return []
        return [e for e in self.escalations if e.after_seconds <= elapsed]

    def channels_at(self, elapsed: float | None) -> list[str]:
        """The channels its cards are in by then: its own, then those it escalated to."""
        return list(dict.fromkeys([self.channel, *(e.channel for e in self.due(elapsed))]))

    def approvers_at(self, elapsed: float | None) -> tuple[str, ...]:
        """Who may decide it by then (empty: anyone who sees one of its cards)."""
        if not self.approvers:
            return ()
        widened = [a for e in self.due(elapsed) for a in e.approvers]
        return tuple(dict.fromkeys([*self.approvers, *widened]))

    def name_of(self, approver: str) -> str:
        return self.names.get(approver) or approver

    def stored(self) -> dict[str, object]:
        """The snapshot as a request's ``gates`` column holds it: without the version (the
        request's own, in its ``config_version``) and without the fields left at their
        defaults, which read back as the same snapshot."""
        return self.model_dump(mode="json", exclude={"config_version"}, exclude_defaults=True)


@dataclass(frozen=True, slots=True)
class Voter:
    """Someone voting: where, their id there, and who they are in the directory (if known)."""

    channel: str
    user_id: str
    name: str | None = None
    person: str | None = None
    """The directory key the channel's id (or the operator's name) recognises."""
    identity: Mapping[str, str] | None = None
    email: str | None = None
    """Looked up from the channel when it mattered (it counts against self-approval only)."""
    operator: bool = False
    """An authenticated operator (operator API, CLI, console), who may decide a gate posted
    to any channel; everyone else votes only on a card in the channel it was posted to."""
    assurance: Assurance | None = None
    """How the voter was identified (None: unknown, below every level)."""
    groups: frozenset[str] = frozenset()
    """The identity provider's groups the voter is in, as it said at sign-in (``group:``
    approvers)."""
    aliases: tuple[str, ...] = ()
    """Other identifiers naming the voter (the provider's subject): they count against
    self-approval, never as being an approver."""
    outsider: bool = False
    """A member of another organisation than the channel's own (:attr:`Click.outsider`): they
    vote only where they are a listed approver."""

    @property
    def key(self) -> str:
        """What the voter's votes are recorded under: their directory key; else, for someone
        the identity provider identified, its issuer and subject (never the username or email
        it repeats, which may be someone else's name here); else the channel and its id."""
        if self.person:
            return self.person
        subject = _subject(self.identity)
        if subject is not None:
            digest = hashlib.sha256(f"{subject[0]}#{subject[1]}".encode()).hexdigest()[:32]
            return f"{self.channel}:oidc:{digest}"
        return f"{self.channel}:{self.user_id}"

    @property
    def actor(self) -> Actor:
        return Actor(self.channel, self.user_id, self.name or self.person)


_Recorded = tuple[ConfirmationGate, GateSnapshot, dict[str, object]]
_RECORDED: weakref.WeakKeyDictionary[SignoffConfig, dict[str, _Recorded]] = weakref.WeakKeyDictionary()
"""Per configuration, by gate key: each gate as requests record it (made once; a
configuration never changes, a reload makes a new one)."""


def recorded(
    key: str, gate: ConfirmationGate, config: SignoffConfig
) -> tuple[GateSnapshot, dict[str, object]]:
    """Gate ``key`` of ``config`` as a request asking it records it, but for the call's argument
    digests: typed, and as stored (with the grants it offers, its escalations earliest first,
    the names of everyone it may ask and the configuration's version)."""
    made = _RECORDED.setdefault(config, {})
    entry = made.get(key)
    if entry is None or entry[0] is not gate:
        steps = sorted(gate.escalate, key=lambda e: e.after)
        everyone = [*gate.approvers, *(a for e in steps for a in e.approvers)]
        snapshot = GateSnapshot(
            key=key,
            name=gate.label,
            channel=gate.channel,
            approvers=gate.approvers,
            quorum=gate.quorum,
            allow_self_approval=gate.allow_self_approval,
            require_reject_reason=gate.require_reject_reason,
            min_assurance=gate.min_assurance.value if gate.min_assurance is not None else None,
            timeout_seconds=gate.timeout.total_seconds(),
            approval_valid_for_seconds=gate.approval_valid_for.total_seconds(),
            grants=tuple(offer.choice for offer in gate.grants),
            editable=gate.editable,
            escalations=tuple(
                EscalationStep(
                    after_seconds=e.after.total_seconds(), channel=e.channel, approvers=e.approvers
                )
                for e in steps
            ),
            # Only the names that differ from the key: name_of falls back to the key.
            names={a: name for a in everyone if (name := config.display_name(a)) != a},
            config_version=config.version,
        )
        entry = made[key] = (gate, snapshot, snapshot.stored())
    return entry[1], entry[2]


def _channel_kind(channel: str, config: SignoffConfig) -> str:
    """The type of channel ``channel`` (its name for one not configured, ``web`` among them)."""
    known = config.channels.get(channel)
    return known.type if known is not None else channel


def _subject(identity: Mapping[str, object] | None) -> tuple[object, str] | None:
    """(issuer, subject) of an identity the provider vouched for, or None."""
    subject = (identity or {}).get("subject")
    return ((identity or {}).get("issuer"), subject) if isinstance(subject, str) and subject else None


def _accounts(kind: str, user_id: str, identity: Mapping[str, object] | None) -> set[str]:
    """The ids a channel of type ``kind`` vouched for naming one account: its user id and
    the aliases the type keeps (Feishu's ``union_id``, the same in every app)."""
    aliases = (str(v) for k in identity_of(kind).aliases if (v := (identity or {}).get(k)))
    return {identity_key(v) for v in (user_id, *aliases)} - {""}


def same_voter(vote: Vote, voter: Voter, config: SignoffConfig) -> bool:
    """Whether ``vote`` was cast by ``voter`` (see the module): under the same key, from the
    same account on a channel of the same type, or by the same subject of the same identity
    provider, each in any spelling. Someone identified by the provider is matched by subject
    only: the username or email it repeats is not an id a channel vouched for."""
    if identity_key(vote.voter) == identity_key(voter.key):
        return True
    subject = _subject(voter.identity)
    if subject is not None or _subject(vote.identity) is not None:
        return subject is not None and subject == _subject(vote.identity)
    kind = _channel_kind(voter.channel, config)
    if _channel_kind(vote.channel or "", config) != kind:
        return False
    return bool(_accounts(kind, voter.user_id, voter.identity) & _accounts(kind, vote.user_id, vote.identity))


_SECRET_IDS = frozenset(
    kind.identity.assurance.value
    for kind in CHANNEL_TYPES.values()
    if kind.identity.secret_ids and kind.identity.assurance is not None
)
"""How votes whose channel id is a secret of its person are identified (a channel type whose
:attr:`~signoff.channels.Identity.secret_ids` is set: an ntfy topic, whoever knows it reads
their notifications, the signed Approve among them): what the vote recorded says so for good,
whatever the configuration says of its channel since."""
NOT_SHOWN = "(not shown)"
"""What stands for a secret id whose person the directory did not know."""


def shown_ids(votes: Iterable[Vote], events: Iterable[AuditEvent] = ()) -> dict[str, str]:
    """What everything outside the database shows for each secret channel id among ``votes``
    and the audit ``events`` about them (their actors): the voter's directory key, or
    :data:`NOT_SHOWN`. The agent API and receipts (an agent that read a topic could approve its
    next call with it), the console, the operator API and the command line (everyone the console
    signs in, through an identity provider any account of it) all name voters through this."""
    shown = {
        v.user_id: v.voter if ":" not in v.voter else NOT_SHOWN for v in votes if v.assurance in _SECRET_IDS
    }
    for e in events:
        if e.actor_id and e.actor_id not in shown and (e.detail or {}).get("assurance") in _SECRET_IDS:
            person = (e.detail or {}).get("person")
            shown[e.actor_id] = (
                person if isinstance(person, str) and person and ":" not in person else NOT_SHOWN
            )
    return shown


def _names(voter: Voter, config: SignoffConfig) -> tuple[set[str], set[str]]:
    """Everything naming ``voter``: (directory keys, raw identifiers as identity keys)."""
    raw = [v for v in (voter.user_id, voter.email, voter.person, *voter.aliases) if v]
    people = {p for p in (voter.person, *(config.recognise(v) for v in raw)) if p is not None}
    return people, {identity_key(v) for v in raw} - {""}


def is_requester(requesters: Iterable[str | None], voter: Voter, config: SignoffConfig) -> bool:
    """Whether ``voter`` is (any spelling or directory entry of) whoever the call was made for.

    ``requesters``: what the request recorded about them (the recognised directory key, the
    ``user_id`` as sent); unknown values (None) name nobody.
    """
    people, raw = _names(voter, config)
    for requester in requesters:
        if requester is None or not identity_key(requester):
            continue
        person = config.recognise(requester)
        if (person is not None and person in people) or identity_key(requester) in raw:
            return True
    return False


def _is_approver(approvers: Iterable[str], voter: Voter, config: SignoffConfig) -> bool:
    """Whether an entry of ``approvers`` (a directory key or a raw channel id, any spelling)
    names the voter by the id the channel vouched for."""
    own = identity_key(voter.user_id)
    groups = {identity_key(g) for g in voter.groups}
    for approver in approvers:
        if approver.startswith(GROUP_PREFIX):
            if identity_key(approver.removeprefix(GROUP_PREFIX)) in groups:
                return True
            continue
        person = config.recognise(approver)
        if person is not None:
            if person == voter.person:
                return True
        elif identity_key(approver) == own and _subject(voter.identity) is None:
            # A raw channel id is vouched for by that channel only: never by a username or an
            # (unverified) email the identity provider repeats.
            return True
    return False


def _elapsed(created_at: datetime | None, now: datetime | None) -> float | None:
    if created_at is None or now is None:
        return None
    return (now - created_at).total_seconds()


def _refused(
    gate: GateSnapshot, channel: str, elapsed: float | None, voter: Voter, config: SignoffConfig
) -> str | None:
    own = gate if gate.channel == channel else gate.model_copy(update={"channel": channel})
    elsewhere = voter.channel not in own.channels_at(elapsed)
    if elsewhere and not voter.operator:
        return NOT_HERE
    approvers = own.approvers_at(elapsed)
    if not approvers:
        # Open to whoever sees its card: in its channel, or an operator of the configuration;
        # never to a member of another organisation the channel is shared with.
        if voter.outsider:
            return OUTSIDER
        return NOT_HERE if elsewhere and not _configured_operator(voter, config) else None
    if not _is_approver(approvers, voter, config):
        return NOT_AN_APPROVER
    return None


def _configured_operator(voter: Voter, config: SignoffConfig) -> bool:
    """Whether ``voter`` (an operator) is one the configuration names: by their name (operator
    API, command line, a password sign-in), or, signed in through the identity provider, as
    the person an entry under ``operators`` has. Any other account the provider signs in
    decides a gate of another channel only as one of its listed approvers."""
    if _subject(voter.identity) is None:
        return True
    person = voter.person
    return person is not None and any((o.person or n) == person for n, o in config.operators.items())


def gate_refusal(
    gate: GateSnapshot,
    *,
    channel: str,
    requesters: Iterable[str | None],
    voter: Voter,
    config: SignoffConfig,
    created_at: datetime | None = None,
    now: datetime | None = None,
) -> str | None:
    """Why ``voter`` may not vote on ``gate`` (a request's gate snapshot, its card posted to
    ``channel``), or None if they may. Its escalations count from their time on, by ``now``
    for a request made at ``created_at`` (without both, none counts)."""
    elapsed = _elapsed(created_at, now)
    why = _refused(gate, channel, elapsed, voter, config)
    if why is not None:
        for step in sorted(gate.escalations, key=lambda e: e.after_seconds):
            later = elapsed is None or step.after_seconds > elapsed
            if later and created_at is not None:
                if _refused(gate, channel, step.after_seconds, voter, config) is None:
                    return not_yet(created_at + timedelta(seconds=step.after_seconds))
        return why
    if not gate.allow_self_approval and is_requester(requesters, voter, config):
        return OWN_CALL
    if gate.min_assurance is not None and below(voter.assurance, gate.min_assurance):
        return assurance_refusal(gate.min_assurance, voter.assurance)
    return None


GATE_GONE = (
    "The gate this request was asked under is no longer configured, so it takes no more "
    "approvals; reject it or let it expire."
)


def approval_refusal(
    gate: GateSnapshot,
    agent: str,
    *,
    requesters: Iterable[str | None],
    voter: Voter,
    config: SignoffConfig,
    created_at: datetime | None = None,
    now: datetime | None = None,
) -> str | None:
    """Why the gate as configured now would not take ``voter``'s approval on a request that
    recorded it as ``gate`` under an earlier configuration (None: it would, or nothing changed).

    An approval counts only where both would take it: a reload never widens who decides a
    request already asked (its snapshot says who was asked), and an approver it removes, a
    level it raises or self-approval it forbids takes effect on pending requests at once.
    Where the card is stays the snapshot's to judge."""
    if gate.config_version == config.version:
        return None
    current = dict(config.confirmation_gates(agent)).get(gate.key)
    if current is None:
        return GATE_GONE
    return gate_refusal(
        recorded(gate.key, current, config)[0],
        channel=gate.channel,
        requesters=requesters,
        voter=replace(voter, operator=True),
        config=config,
        created_at=created_at,
        now=now,
    )


def approving_gates(
    gates: Sequence[GateSnapshot],
    eligible: Sequence[int],
    agent: str,
    *,
    requesters: Iterable[str | None],
    voter: Voter,
    config: SignoffConfig,
    created_at: datetime | None = None,
    now: datetime | None = None,
) -> tuple[list[int], str | None]:
    """Of the gates ``eligible`` (by :func:`eligible_gates`), those whose configuration now
    takes ``voter``'s approval too (:func:`approval_refusal`), and, when none does, why."""
    requesters = tuple(requesters)
    refused = {
        i: approval_refusal(
            gates[i], agent, requesters=requesters, voter=voter, config=config, created_at=created_at, now=now
        )
        for i in eligible
    }
    kept = [i for i in eligible if refused[i] is None]
    return kept, None if kept or not eligible else next(w for w in refused.values() if w is not None)


_PARSED = "_signoff_gates"
"""Where :func:`gates_of` keeps a request's parsed gates, beside the row's own attributes."""


def gates_of(req: ConfirmationRequest) -> list[GateSnapshot]:
    """The request's gates in the order they run (a request made before several gates could
    ask has its one ``gate``, posted to the request's ``channel``, until revision 0012 moves it
    into ``gates``)."""
    parsed: tuple[GateSnapshot, ...] | None = req.__dict__.get(_PARSED)
    if parsed is None:
        first: Mapping[str, object] = req.gate or {}
        version = req.config_version or first.get("config_version")
        known = {"config_version": version if isinstance(version, str) else None}
        if req.gates:
            parsed = tuple(GateSnapshot.model_validate({**g, **known}) for g in req.gates)
        else:
            shape = {"key": first.get("name", ""), **first, "channel": req.channel, **known}
            parsed = (GateSnapshot.model_validate(shape),)
        # What it reads was fixed when the request was made: parsed once per copy of the row.
        req.__dict__[_PARSED] = parsed
    return list(parsed)


def _telling(why: str) -> int:
    """How much a refusal concerns the voter: their own call, then that their time has not
    come, then not an approver, then the channel."""
    if why == OWN_CALL:
        return 0
    if is_not_yet(why):
        return 1
    if why.startswith(_TOO_WEAK):
        return 2
    return {NOT_AN_APPROVER: 3, NOT_HERE: 4}.get(why, 5)


def card_gates(
    gates: Sequence[GateSnapshot], channel: str, *, created_at: datetime, now: datetime
) -> list[int]:
    """The indexes of the gates whose card is in ``channel`` by ``now``: their own channel,
    or one they escalated to by then."""
    elapsed = _elapsed(created_at, now)
    return [i for i, g in enumerate(gates) if channel in g.channels_at(elapsed)]


def asked(gates: Sequence[GateSnapshot], *, within: float) -> list[str]:
    """The names of everyone the gates asked in the first ``within`` seconds (the approvers of
    escalations that came before then included), each once."""
    names: dict[str, None] = {}
    for gate in gates:
        came = [e for e in gate.escalations if e.after_seconds < within]
        for approver in [*gate.approvers, *(a for e in came for a in e.approvers)]:
            names[gate.name_of(approver)] = None
    return list(names)


def eligible_gates(
    gates: Sequence[GateSnapshot],
    *,
    requesters: Iterable[str | None],
    voter: Voter,
    config: SignoffConfig,
    created_at: datetime | None = None,
    now: datetime | None = None,
) -> tuple[list[int], str | None]:
    """The indexes of the gates ``voter``'s vote counts for by ``now`` (escalations count
    once their time has come), and, when it counts for none, why (the reason that concerns
    them most)."""
    requesters = tuple(requesters)
    eligible: list[int] = []
    refusals: list[str] = []
    for i, gate in enumerate(gates):
        why = gate_refusal(
            gate,
            channel=gate.channel,
            requesters=requesters,
            voter=voter,
            config=config,
            created_at=created_at,
            now=now,
        )
        if why is None:
            eligible.append(i)
        else:
            refusals.append(why)
    if eligible or not refusals:
        return eligible, None
    return [], min(refusals, key=_telling)
