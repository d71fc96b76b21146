"""The v1 HTTP contract: request and response bodies (fields may be added, never renamed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from signoff.app.bodies import storable
from signoff.app.builtin_hooks.confirmation_gate import parse_duration
from signoff.app.models import AuditEvent, ConfirmationRequest, Grant, PersonalToken, Status, Vote, utcnow
from signoff.app.requests.edits import argument_changes, editable_fields, executed_as_approved
from signoff.app.requests.eligibility import GateSnapshot, gates_of, shown_ids
from signoff.app.requests.single_use import spent, valid_for
from signoff.channels import ABSENT, MAX_GRANT_FIELDS, MAX_REASON_CHARS, GrantChoice, Verdict, edit_problem


def _storable(value: str) -> str:
    if not storable(value):
        raise ValueError("must not contain NUL characters or lone surrogates")
    return value


Text = Annotated[str, AfterValidator(_storable)]
"""A string stored in a text column (no NUL, no lone surrogate: see signoff.app.bodies)."""


class ToolCallIn(BaseModel):
    """One tool call as the agent reports it, before (pre-tool-use) or after (post-tool-use) it runs."""

    model_config = ConfigDict(extra="ignore")

    tool_name: str = Field(min_length=1, max_length=500)
    arguments: dict[str, Any] = Field(default_factory=dict)
    session_id: str | None = Field(default=None, max_length=200)
    tool_call_id: str | None = Field(default=None, max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=500)
    """The call's key: the ask's, and the report's, which uses up that call's approval."""


class PreToolUseIn(ToolCallIn):
    """The body of ``POST /v1/hooks/pre-tool-use``."""


class PostToolUseIn(ToolCallIn):
    result: Any = None
    error: str | None = Field(default=None, max_length=10_000)


class PostToolUseOut(BaseModel):
    decision: Literal["allow", "deny"]
    reason: str | None = None
    modified: bool = False
    """True when a hook rewrote the result; ``result`` is then what the model should see."""
    result: Any = None
    receipt: dict[str, Any] | None = None
    """The signed execution receipt, when the report closed an approved request (see DESIGN.md
    "Receipts")."""


class SessionStartIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    session_id: str | None = Field(default=None, max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionStartOut(BaseModel):
    decision: Literal["allow", "deny"]
    reason: str | None = None
    additional_context: str | None = None


class SwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    on: bool
    operator: Text = Field(min_length=1, max_length=200)
    reason: Text | None = Field(default=None, max_length=MAX_REASON_CHARS)


class SwitchOut(BaseModel):
    name: str
    on: bool
    updated_at: datetime
    updated_by: str | None
    reason: str | None


class ReloadOut(BaseModel):
    """A configuration reload: the version in force and, when refused, every problem."""

    model_config = ConfigDict(from_attributes=True)

    ok: bool
    version: str
    loaded_at: datetime
    problems: list[str]
    rebuilt: list[str]
    closed: list[str]


class Decider(BaseModel):
    channel: str
    user_id: str | None
    name: str | None


class GrantChoiceOut(BaseModel):
    """A grant as a gate offers it or an approver chose it."""

    scope: Literal["session", "agent"]
    seconds: int
    same: list[str]

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> GrantChoiceOut | None:
        if not raw:
            return None
        try:
            choice = GrantChoice.from_dict(raw)
        except ValueError:
            return None
        return cls(scope=choice.scope, seconds=choice.seconds, same=list(choice.same))


class GrantOut(BaseModel):
    """A grant given with an approval: who gave it, what it covers, until when, how often used."""

    id: str
    request_id: str
    agent_id: str
    scope: Literal["session", "agent"]
    session_id: str | None
    tool_name: str
    gate: str
    same: dict[str, Any]
    """Each argument field held equal, with its approved value (redacted)."""
    granted_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None
    uses: int
    last_used_at: datetime | None
    active: bool
    """Not revoked and not expired: calls it covers are allowed without asking."""

    @classmethod
    def of(cls, g: Grant, now: datetime) -> GrantOut:
        return cls(
            id=g.id,
            request_id=g.request_id,
            agent_id=g.agent_id,
            scope=g.scope,
            session_id=g.session_id,
            tool_name=g.tool_name,
            gate=g.gate,
            same=dict(g.same_shown),
            granted_by=g.granted_by,
            created_at=g.created_at,
            expires_at=g.expires_at,
            revoked_at=g.revoked_at,
            revoked_by=g.revoked_by,
            uses=g.uses,
            last_used_at=g.last_used_at,
            active=g.revoked_at is None and g.expires_at > now,
        )


class TokenOut(BaseModel):
    """A personal token for the command line: whose, when made, until when, when last used
    (never its text)."""

    id: str
    person: str
    """Who it decides as."""
    operator: str
    """The name it was made signed in as."""
    label: str | None
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    active: bool
    """Not revoked and not expired: it decides as its person."""

    @classmethod
    def of(cls, t: PersonalToken, now: datetime) -> TokenOut:
        return cls(
            id=t.id,
            person=t.person,
            operator=t.operator,
            label=t.label,
            created_at=t.created_at,
            expires_at=t.expires_at,
            last_used_at=t.last_used_at,
            revoked_at=t.revoked_at,
            revoked_by=t.revoked_by,
            active=t.revoked_at is None and t.expires_at > now,
        )


class ArgumentChangeOut(BaseModel):
    """One argument field the approver changed."""

    field: str
    proposed: Any = None
    """The value the call was asked with (redacted; absent from the call: ``proposed_absent``)."""
    approved: Any = None
    """The value it was approved with."""
    proposed_absent: bool = False


class VoteOut(BaseModel):
    verdict: str
    gate: str
    """The name of the gate the vote counts for."""
    channel: str
    user_id: str
    name: str | None
    email: str | None
    reason: str | None
    created_at: datetime
    grant: GrantChoiceOut | None = None
    """The grant the approval chose (``None``: approve once)."""
    assurance: str | None = None
    """How the voter was identified (``oidc``, ``slack_signed``, …); ``None``: not known."""

    @classmethod
    def of(cls, v: Vote, gates: Sequence[GateSnapshot] = ()) -> VoteOut:
        return cls(
            grant=GrantChoiceOut.of(v.grant_choice),
            assurance=v.assurance,
            verdict=v.verdict,
            gate=gates[v.gate].name if 0 <= v.gate < len(gates) else "",
            channel=v.channel,
            user_id=shown_ids([v]).get(v.user_id, v.user_id),
            name=v.name,
            email=v.email,
            reason=v.reason,
            created_at=v.created_at,
        )


class GateOut(BaseModel):
    """One gate the request needs: who may approve it, where, and how it stands."""

    name: str
    channel: str
    approvers: list[str]
    quorum: int
    approvals: int
    approved: bool
    """It has its quorum (the request is approved once every gate has)."""
    votes: list[VoteOut]
    min_assurance: str | None = None
    """The weakest identification a vote on it may have (``None``: any)."""


class RequestOut(BaseModel):
    id: str
    agent_id: str
    tool_name: str
    arguments: dict[str, Any]
    status: Status
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: Decider | None
    reason: str | None
    user_id: str | None
    session_id: str | None
    tool_call_id: str | None
    channel: str
    gate: str
    """The first gate's name; ``gates`` lists every gate the call needs."""
    quorum: int
    """Approvals needed, over every gate."""
    approvals: int
    """Approvals that count towards the gates' quorums (``quorum`` of them approve)."""
    votes: list[VoteOut]
    gates: list[GateOut]
    config_version: str | None = None
    """The version of the configuration the call was gated under."""
    executed_at: datetime | None = None
    """When the approved call was reported executed: its approval allows nothing more."""
    approval_valid_until: datetime | None = None
    """Approved and not yet executed: until when a replay of its key is allowed."""
    spent: str | None = None
    """Approved, but its approval allows nothing more, as of this answer: why (its call was
    reported executed, or it lapsed). A client re-reading the request denies with it."""
    grant: GrantOut | None = None
    """The grant given with the approval, if any (the first gate's, with several)."""
    editable: list[str] = []
    """Pending: the argument fields its approver may change before approving."""
    approved_arguments: dict[str, Any] | None = None
    """Approved with changes: the call as approved (redacted like ``arguments``)."""
    changes: list[ArgumentChangeOut] = []
    """Approved with changes: each field changed, proposed and approved. The agent runs its
    call's own arguments with these values (``modified_arguments``)."""
    executed_mismatch: bool = False
    """The call was reported executed with arguments other than the approved ones."""
    receipt: dict[str, Any] | None = None
    """Decided: the signed decision receipt ``{payload, key_id, signature}`` (DESIGN.md
    "Receipts"; verify it with ``signoff-verify`` and ``GET /v1/receipts/keys``)."""
    execution_receipt: dict[str, Any] | None = None
    """Reported executed: the signed execution receipt, chained to ``receipt``."""

    @classmethod
    def of(
        cls,
        r: ConfirmationRequest,
        votes: Sequence[Vote],
        grants: Sequence[Grant] = (),
        *,
        now: datetime | None = None,
        gates: Sequence[GateSnapshot] = (),
    ) -> RequestOut:
        """``r`` as the API shows it; ``gates``: its gates, typed, when the caller has them."""
        decider = r.decided_by_user_id
        decided_by = (
            Decider(
                channel=r.decided_by_channel,
                user_id=shown_ids(votes).get(decider, decider) if decider else decider,
                name=r.decided_by_name,
            )
            if r.decided_by_channel
            else None
        )
        snapshots = list(gates) or gates_of(r)
        shown = [_gate_out(i, g, votes, snapshots) for i, g in enumerate(snapshots)]
        return cls(
            id=r.id,
            agent_id=r.agent_id,
            tool_name=r.tool_name,
            arguments=r.arguments,
            status=Status(r.status),
            created_at=r.created_at,
            expires_at=r.expires_at,
            decided_at=r.decided_at,
            decided_by=decided_by,
            reason=r.reason,
            user_id=r.user_id,
            session_id=r.session_id,
            tool_call_id=r.tool_call_id,
            channel=r.channel,
            gate=shown[0].name,
            quorum=sum(g.quorum for g in shown),
            approvals=sum(min(g.approvals, g.quorum) for g in shown),
            votes=[VoteOut.of(v, snapshots) for v in votes],
            gates=shown,
            config_version=snapshots[0].config_version,
            executed_at=r.executed_at,
            approval_valid_until=r.decided_at + valid_for(r)
            if r.status == Status.APPROVED and r.decided_at and r.executed_at is None
            else None,
            spent=spent(r, now),
            grant=GrantOut.of(grants[0], now or utcnow()) if grants else None,
            editable=list(editable_fields(snapshots)) if r.status == Status.PENDING else [],
            approved_arguments=r.approved_arguments,
            changes=[
                ArgumentChangeOut(
                    field=c.field,
                    proposed=None if c.proposed is ABSENT else c.proposed,
                    approved=c.approved,
                    proposed_absent=c.proposed is ABSENT,
                )
                for c in argument_changes(r)
            ],
            executed_mismatch=r.executed_arguments is not None
            and not executed_as_approved(r, r.executed_arguments),
            receipt=r.receipt,
            execution_receipt=r.execution_receipt,
        )


def _gate_out(
    index: int, gate: GateSnapshot, votes: Sequence[Vote], gates: Sequence[GateSnapshot]
) -> GateOut:
    mine = [v for v in votes if v.gate == index]
    approvals = sum(1 for v in mine if v.verdict == Verdict.APPROVE)
    return GateOut(
        name=gate.name,
        channel=gate.channel,
        approvers=list(gate.approvers),
        quorum=gate.quorum,
        approvals=approvals,
        approved=approvals >= gate.quorum,
        votes=[VoteOut.of(v, gates) for v in mine],
        min_assurance=gate.min_assurance,
    )


class DecisionOut(BaseModel):
    decision: Literal["allow", "deny", "pending"]
    reason: str | None = None
    request_id: str | None = None
    request: RequestOut | None = None
    modified_arguments: dict[str, Any] | None = None
    grant_id: str | None = None
    """The grant that allowed the call without asking."""
    receipt: dict[str, Any] | None = None
    """The signed decision receipt of the decided request the answer rests on."""


class AuditEventOut(BaseModel):
    seq: int
    request_id: str | None
    action: str
    actor_channel: str | None
    actor_id: str | None
    actor_name: str | None
    detail: dict[str, Any]
    created_at: datetime
    hash: str
    prev_hash: str

    @classmethod
    def of(cls, e: AuditEvent) -> AuditEventOut:
        return cls.model_validate(e, from_attributes=True)


class AdminRequestOut(RequestOut):
    audit: list[AuditEventOut]


class GrantIn(BaseModel):
    """A grant to give with an approval: one the request's gate offers."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    scope: Literal["session", "agent"]
    for_: timedelta = Field(alias="for")
    """``30m``, ``1h``, ``1d`` or seconds."""
    same: list[Text] | None = Field(default=None, max_length=MAX_GRANT_FIELDS)
    """The fields it holds equal; left out, those of the offer with this scope and time."""

    @field_validator("for_", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        if isinstance(value, bool):
            raise ValueError("a duration such as 30m, 1h or 1d")
        return parse_duration(value)


class DecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    operator: Text = Field(min_length=1, max_length=200)
    reason: Text | None = Field(default=None, max_length=MAX_REASON_CHARS)
    grant: GrantIn | None = None
    """Approve with this grant instead of approving once (it must be one the gate offers)."""
    arguments: dict[str, Any] | None = None
    """Approve with these argument fields changed (only fields the gate lists as ``editable``)."""

    @field_validator("arguments")
    @classmethod
    def _edit(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and (problem := edit_problem(value)) is not None:
            raise ValueError(problem)
        return value


class AuditVerifyOut(BaseModel):
    ok: bool
    events: int
    broken_at: int | None = None
    """The event where a chain breaks (its ``seq``); None when a chain's head is what is wrong."""
    problem: str | None = None


class Problem(BaseModel):
    detail: str


class Unprocessable(BaseModel):
    """422: the errors of a body that does not validate, or the sentence of a limit it exceeds."""

    detail: list[dict[str, Any]] | str
