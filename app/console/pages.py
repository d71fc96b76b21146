"""What each console page shows, read from the database and the configuration."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import queries
from signoff.app.audit import Action
from signoff.app.bodies import storable
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.channel_types import is_chat
from signoff.app.config import SignoffConfig
from signoff.app.console.format import duration, summarize, time_left
from signoff.app.models import AuditEvent, ConfirmationRequest, Delivery, Grant, Status, Vote, utcnow
from signoff.app.operators import operator_voter
from signoff.app.queries import RequestFilter
from signoff.app.requests import edits, grants
from signoff.app.requests.eligibility import (
    NOT_AN_APPROVER,
    OWN_CALL,
    Voter,
    approving_gates,
    eligible_gates,
    gates_of,
    is_not_yet,
    same_voter,
)
from signoff.app.requests.states import EXPIRY, get_request
from signoff.app.requests.tally import GateApprovals, approvals_by_gate, per_gate, votes_for
from signoff.app.schemas import AuditVerifyOut
from signoff.app.switches import guarded_switches
from signoff.channels import ArgumentChange, GrantChoice, edit_input, shown_text

__all__ = [
    "AuditView",
    "ConfigView",
    "GateTally",
    "GateView",
    "QueueView",
    "RequestRow",
    "RequestView",
    "audit_view",
    "config_view",
    "queue_view",
    "request_rows",
    "request_view",
]

QUEUE_LIMIT = 200
AUDIT_PAGE = 50
_REQUEST_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def plausible_id(value: str) -> bool:
    """Whether ``value`` could be a request id (anything else is not looked up at all)."""
    return _REQUEST_ID.fullmatch(value) is not None


def _person(config: SignoffConfig, key: str | None) -> str | None:
    if not key:
        return None
    if key not in config.people:
        return shown_text(key)  # the agent's word (its user_id), on one line as it came
    name = config.display_name(key)
    return name if name == key else f"{name} ({key})"


@dataclass(frozen=True, slots=True)
class GateTally:
    """How one of a request's gates stands: its approvals so far, of the ``quorum`` it needs."""

    name: str
    approvals: int
    quorum: int
    channel: str


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One request as a line of the queue, the history or an export."""

    id: str
    agent: str
    tool: str
    summary: str
    status: str
    requester: str | None
    gates: tuple[GateTally, ...]
    """Every gate the call matched, in the order they run: each has to approve."""
    channel: str
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    reason: str | None
    time_left: str
    seconds_left: float

    @property
    def approvals(self) -> int:
        """Approvals that count, over every gate (as the operator API counts them)."""
        return sum(min(g.approvals, g.quorum) for g in self.gates)

    @property
    def quorum(self) -> int:
        """Approvals needed, over every gate."""
        return sum(g.quorum for g in self.gates)

    @property
    def gate(self) -> str:
        """The gates' names."""
        return " · ".join(g.name for g in self.gates)

    @property
    def channels(self) -> str:
        """The channels the gates ask in, each once: ``chat``, ``slack-ops · feishu``."""
        return " · ".join(dict.fromkeys(g.channel for g in self.gates))

    @property
    def progress(self) -> str:
        """Approvals so far of those needed: ``1 / 2``, or per gate ``deploy 1/2 · finance 0/1``."""
        if len(self.gates) == 1:
            return f"{self.gates[0].approvals} / {self.gates[0].quorum}"
        return " · ".join(f"{g.name or '—'} {g.approvals}/{g.quorum}" for g in self.gates)


def _decided_by(req: ConfirmationRequest) -> str | None:
    if req.decided_by_channel is None:
        return None
    if req.decided_by_channel == "system":
        return "(deadline)" if req.decided_by_user_id == EXPIRY.id else "(system)"
    who = req.decided_by_name or req.decided_by_user_id or "?"
    return f"{who} via {req.decided_by_channel}"


def row_of(
    req: ConfirmationRequest, approvals: GateApprovals, config: SignoffConfig, now: datetime
) -> RequestRow:
    """``approvals``: from :func:`signoff.app.requests.votes.approvals_by_gate`, for ``req`` among others."""
    pending = req.status == Status.PENDING
    gates = gates_of(req)
    counts = per_gate(approvals, req.id, len(gates))
    return RequestRow(
        id=req.id,
        agent=req.agent_id,
        tool=shown_text(req.tool_name),
        summary=summarize(req.arguments),
        status=str(req.status),
        requester=_person(config, req.requester or req.user_id),
        gates=tuple(GateTally(g.name, n, g.quorum, g.channel) for g, n in zip(gates, counts, strict=True)),
        channel=req.channel,
        created_at=req.created_at,
        expires_at=req.expires_at,
        decided_at=req.decided_at,
        decided_by=_decided_by(req),
        reason=req.reason,
        time_left=time_left(req.expires_at, now) if pending else "",
        seconds_left=max((req.expires_at - now).total_seconds(), 0) if pending else 0,
    )


async def request_rows(
    session: AsyncSession, config: SignoffConfig, reqs: Sequence[ConfirmationRequest], now: datetime
) -> list[RequestRow]:
    approvals = await approvals_by_gate(session, (r.id for r in reqs))
    return queries.readable(reqs, lambda r: row_of(r, approvals, config, now))


def _version(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class QueueView:
    rows: list[RequestRow]
    total: int

    @property
    def version(self) -> str:
        """Changes when the queue does (the page's poll gets 204 until then)."""
        return _version(self.total, [(r.id, [g.approvals for g in r.gates]) for r in self.rows])


async def queue_view(session: AsyncSession, config: SignoffConfig, now: datetime) -> QueueView:
    """Pending requests, newest first."""
    pending = RequestFilter(status=Status.PENDING)
    reqs = await queries.list_requests(session, pending, limit=QUEUE_LIMIT)
    total = len(reqs) if len(reqs) < QUEUE_LIMIT else await queries.count_requests(session, pending)
    return QueueView(await request_rows(session, config, reqs, now), total)


@dataclass(frozen=True, slots=True)
class GateView:
    """A gate that matched: as recorded with the request, plus its rule if still configured."""

    name: str
    channel: str
    channel_type: str
    approvers: list[str]
    approvals: int
    """Approvals so far on this gate."""
    quorum: int
    timeout: str
    allow_self_approval: bool
    require_reject_reason: bool
    tools: tuple[str, ...] | None
    when: str | None
    config_version: str | None = None
    """The configuration the request was gated under."""
    current_version: str = ""
    min_assurance: str | None = None
    """The weakest identification a vote on it may have (None: any)."""


def _gate_rule(config: SignoffConfig, agent: str, key: str) -> ConfirmationGate | None:
    return next((gate for k, gate in config.confirmation_gates(agent) if k == key), None)


def gate_views(req: ConfirmationRequest, row: RequestRow, config: SignoffConfig) -> list[GateView]:
    """Every gate of ``req``, in the order they run, with its approvals so far from ``row``."""
    views = []
    for snap, tally in zip(gates_of(req), row.gates, strict=True):
        rule = _gate_rule(config, req.agent_id, snap.key or snap.name)
        channel = config.channels.get(snap.channel)
        views.append(
            GateView(
                name=snap.name,
                channel=snap.channel,
                channel_type=channel.type if channel is not None else "?",
                approvers=[_person(config, a) or a for a in snap.approvers],
                approvals=tally.approvals,
                quorum=snap.quorum,
                timeout=duration(snap.timeout_seconds),
                allow_self_approval=snap.allow_self_approval,
                require_reject_reason=snap.require_reject_reason,
                tools=rule.tools if rule else None,
                when=rule.when if rule else None,
                config_version=snap.config_version,
                current_version=config.version,
                min_assurance=snap.min_assurance,
            )
        )
    return views


@dataclass(frozen=True, slots=True)
class EditableField:
    """A field the console's approval form lets the operator change."""

    name: str
    shown: str
    """Its current value as the input holds it (text as it is, anything else as JSON)."""
    text: bool
    """It holds text: what is typed stays text."""

    @property
    def input_name(self) -> str:
        return f"edit:{'text' if self.text else 'json'}:{self.name}"


@dataclass(frozen=True, slots=True)
class RequestView:
    req: ConfirmationRequest
    row: RequestRow
    gates: list[GateView]
    """Every gate the call matched, in the order they run: each has to approve."""
    votes: list[Vote]
    refused: list[AuditEvent]
    trail: list[AuditEvent]
    deliveries: list[Delivery]
    hint: str | None
    """Why the signed-in operator's vote would be refused, when that is plain in advance."""
    offers: list[GrantChoice]
    """Pending: the grants an approval here may give beside approving once."""
    given: list[Grant]
    """Approved: the grants the approval gave."""
    editable: list[EditableField] = field(default_factory=list)
    """Pending: the argument fields an approval here may change, with their current values."""
    changes: tuple[ArgumentChange, ...] = ()
    """Approved: the fields the approver changed."""
    mismatch: bool = False
    """Reported executed with arguments other than the approved ones."""

    @property
    def pending(self) -> bool:
        return self.req.status == Status.PENDING

    def gate_name(self, index: int) -> str:
        """The name of gate ``index`` (a vote's ``gate``)."""
        return self.gates[index].name if 0 <= index < len(self.gates) else f"#{index}"

    @property
    def on_chat(self) -> bool:
        """Whether a gate asks in a chat channel, whose card shows the decision's reason."""
        return any(is_chat(g.channel_type) for g in self.gates)

    @property
    def require_reject_reason(self) -> bool:
        """A rejection rejects for every gate: it needs a reason when any of them asks for one."""
        return any(g.require_reject_reason for g in self.gates)

    @property
    def version(self) -> str:
        return _version(
            self.row.status,
            [e.seq for e in self.trail],
            [(d.id, str(d.status), d.attempts, d.last_error) for d in self.deliveries],
        )


def _hint(req: ConfirmationRequest, voter: Voter, votes: Sequence[Vote], config: SignoffConfig) -> str | None:
    # The state machine's own rule, asked in advance.
    requesters = (req.requester, req.user_id)
    gates = gates_of(req)
    eligible, why = eligible_gates(
        gates,
        requesters=requesters,
        voter=voter,
        config=config,
        created_at=req.created_at,
        now=utcnow(),
    )
    if why is not None and is_not_yet(why):
        return f"{why} Before then your vote would be refused."
    if why == NOT_AN_APPROVER:
        if len(gates) == 1:
            return "You are not one of this gate's approvers: your vote would be refused."
        return "You are not an approver of any of this request's gates: your vote would be refused."
    if why == OWN_CALL:
        return "This call was made on your behalf: you cannot approve it."
    if why is not None:
        return why  # e.g. the gate takes votes identified more surely than this sign-in
    _, reloaded = approving_gates(
        gates,
        eligible,
        req.agent_id,
        requesters=requesters,
        voter=voter,
        config=config,
        created_at=req.created_at,
        now=utcnow(),
    )
    if reloaded is not None:
        return f"{reloaded} You may still reject it."
    voted = {v.gate for v in votes if same_voter(v, voter, config)}
    if eligible and voted.issuperset(eligible):
        return "You have already voted on this request."
    if eligible and len(eligible) < len(gates):
        mine = ", ".join(gates[i].name for i in eligible)
        others = [g.name for i, g in enumerate(gates) if i not in eligible]
        has = "has" if len(others) == 1 else "have"
        return f"Your vote counts for {mine} only: {', '.join(others)} {has} to approve too."
    return None


async def request_view(
    session: AsyncSession,
    config: SignoffConfig,
    request_id: str,
    *,
    person: str,
    now: datetime,
    voter: Voter | None = None,
) -> RequestView | None:
    """``voter``: who would vote from this page (default: ``person`` signed in with a password)."""
    if not plausible_id(request_id):
        return None
    req = await get_request(session, request_id)
    if req is None:
        return None
    votes = await votes_for(session, request_id)
    trail = await queries.request_trail(session, request_id)
    row = row_of(req, await approvals_by_gate(session, [request_id]), config, now)
    gates = gates_of(req)
    offers = [o for o in grants.offers_of(gates[0]) if all(o in grants.offers_of(g) for g in gates)]
    given = (
        (await grants.grants_by_request(session, [req.id]))[req.id] if req.status == Status.APPROVED else []
    )
    return RequestView(
        req=req,
        row=row,
        gates=gate_views(req, row, config),
        votes=queries.shown_votes(votes),
        refused=[e for e in trail if e.action == Action.VOTE_REFUSED],
        trail=trail,
        deliveries=await queries.deliveries_for(session, request_id),
        hint=_hint(req, voter or operator_voter(person, config, via="console"), votes, config)
        if req.status == Status.PENDING
        else None,
        offers=[o for o in offers if o.scope != "session" or req.session_id]
        if req.status == Status.PENDING
        else [],
        given=given,
        editable=[
            EditableField(
                name,
                edit_input(req.arguments[name]) if name in req.arguments else "",
                isinstance(req.arguments.get(name), str),
            )
            for name in edits.editable_fields(gates)
        ]
        if req.status == Status.PENDING
        else [],
        changes=edits.argument_changes(req),
        mismatch=req.executed_arguments is not None
        and not edits.executed_as_approved(req, req.executed_arguments),
    )


@dataclass(frozen=True, slots=True)
class AuditView:
    events: list[AuditEvent]
    older: int | None
    """The ``before`` of the next (older) page, if there is one."""


async def audit_view(
    session: AsyncSession, *, before: int | None, action: str | None, request_id: str | None
) -> AuditView:
    if not storable((action or "") + (request_id or "")):
        return AuditView([], None)
    events = await queries.audit_page(
        session, before=before, action=action, request_id=request_id, limit=AUDIT_PAGE + 1
    )
    older = events[AUDIT_PAGE - 1].seq if len(events) > AUDIT_PAGE else None
    return AuditView(events[:AUDIT_PAGE], older)


async def verification(session: AsyncSession) -> AuditVerifyOut:
    return await queries.verify_audit(session)


@dataclass(frozen=True, slots=True)
class ConfigView:
    source: str
    channels: dict[str, dict[str, Any]]
    people: list[tuple[str, str | None, str | None, dict[str, str]]]
    operators: list[tuple[str, str]]
    agents: dict[str, list[ConfirmationGate]]
    agent_redact: dict[str, tuple[str, ...]]
    redact: list[str]
    guarded: dict[str, list[str]]
    """Each switch a ``readonly_guard`` watches, with the agents whose guards watch it."""


def config_view(config: SignoffConfig) -> ConfigView:
    """The configuration as loaded; secrets masked the way the operator API masks them."""
    return ConfigView(
        source=config.source,
        channels=queries.masked_channels(config),
        people=[(k, p.name, p.email, queries.masked_ids(p.ids())) for k, p in config.people.items()],
        operators=[(name, op.person or name) for name, op in config.operators.items()],
        agents={a: [h for h in c.hooks if isinstance(h, ConfirmationGate)] for a, c in config.agents.items()},
        agent_redact={a: c.redact for a, c in config.agents.items() if c.redact},
        redact=sorted(config.redact),
        guarded=guarded_switches(config),
    )
