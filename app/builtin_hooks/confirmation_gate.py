"""The confirmation gate: a PreToolUse hook that sends matching calls to a human.

A gate matches a call when the tool name fits one of its globs and its optional
``when`` condition holds. Conditions are CEL (Common Expression Language), compiled
once at load and evaluated over ``args``, ``tool``, ``agent``, ``user`` and
``metadata``; CEL cannot run code, touch files or loop forever. A condition that
fails to evaluate (a missing field, a type mismatch) counts as a match, so a human
decides rather than the call slipping through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Annotated, Any, Literal

import cel
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    field_validator,
    model_validator,
)

from signoff.app.builtin_hooks._filter import ToolFilter, parse_duration
from signoff.channels import MAX_EDIT_FIELDS, MAX_GRANT_FIELDS, GrantChoice, duration_text
from signoff.hooks import HookContext, HookResult

__all__ = [
    "MAX_ESCALATIONS",
    "MAX_GRANTS",
    "MAX_REMINDERS",
    "ConfirmationGate",
    "Escalation",
    "GrantOffer",
    "ReminderPoint",
    "parse_duration",
]

MAX_GRANTS = 4
"""Grants one gate may offer (each is a button on the card beside "Approve once")."""
MAX_FIELD_CHARS = 100
MAX_REMINDERS = 10
"""Reminder points one gate may have."""
MAX_ESCALATIONS = 5
"""Escalation steps one gate may have."""


def _field_names(value: tuple[str, ...], limit: int, what: str) -> tuple[str, ...]:
    """``value`` if it is at most ``limit`` distinct argument field names, else why not."""
    if len(value) > limit:
        raise ValueError(f"at most {limit} {what}")
    for name in value:
        if not name.strip() or len(name) > MAX_FIELD_CHARS or "\x00" in name:
            raise ValueError(f"{name!r} is not an argument field name (1 to {MAX_FIELD_CHARS} characters)")
    repeated = sorted({n for n in value if value.count(n) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} named more than once")
    return value


@dataclass(frozen=True, slots=True)
class ReminderPoint:
    """When a gate reminds the approvers who have not voted: a share of its timeout
    (``50%``) or a time after the request was made (``10m``)."""

    percent: float | None = None
    after: timedelta | None = None

    def due(self, timeout: timedelta) -> timedelta:
        """How long after the request the reminder goes out, for a gate of ``timeout``."""
        if self.percent is not None:
            return timeout * (self.percent / 100)
        assert self.after is not None
        return self.after

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        assert self.after is not None
        return duration_text(int(self.after.total_seconds()))


def _reminder_point(value: Any) -> ReminderPoint:
    if isinstance(value, ReminderPoint):
        return value
    if isinstance(value, str) and value.strip().endswith("%"):
        number = value.strip().removesuffix("%").strip()
        try:
            percent = float(number)
        except ValueError:
            percent = float("nan")
        if not 0 < percent < 100:  # NaN fails this too
            raise ValueError(
                f"{value!r} is not a share of the timeout between 0% and 100% (both excluded); "
                "write e.g. 50%, or a duration such as 10m"
            )
        return ReminderPoint(percent=percent)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("a reminder is a share of the timeout such as 50%, or a duration such as 10m")
    try:
        return ReminderPoint(after=parse_duration(value))
    except ValueError as exc:
        raise ValueError(f"{exc}; or a share of the timeout such as 50%") from None


Reminder = Annotated[ReminderPoint, PlainValidator(_reminder_point), PlainSerializer(str)]
"""A reminder point as the configuration writes it (``50%``, ``10m``)."""


class Escalation(BaseModel):
    """One step of a gate's ``escalate`` list: ``{after: 15m, channel: NAME, approvers: [...]}``.

    ``after`` the request was made, if it is still undecided, its card is posted to
    ``channel`` and ``approvers`` may decide it too (on that card, or on the gate's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: timedelta
    channel: str
    approvers: tuple[str, ...] = ()
    """Who else may decide from then on (empty: nobody new, the card only goes further)."""

    @field_validator("after", mode="before")
    @classmethod
    def _parse_after(cls, value: Any) -> timedelta:
        return parse_duration(value)


class GrantOffer(BaseModel):
    """One grant a gate offers its approvers (``grants: [{scope: session, for: 1h, same: [to]}]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    scope: Literal["session", "agent"]
    """``session``: later calls in the same session; ``agent``: any later call of the agent."""
    for_: timedelta = Field(alias="for")
    """How long the grant lasts from the approval."""
    same: tuple[str, ...] = ()
    """Top-level argument fields that must equal the approved call's."""

    @field_validator("for_", mode="before")
    @classmethod
    def _parse_for(cls, value: Any) -> timedelta:
        duration = parse_duration(value)
        if duration.total_seconds() != int(duration.total_seconds()):
            raise ValueError("a grant lasts a whole number of seconds")
        return duration

    @field_validator("same")
    @classmethod
    def _check_same(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _field_names(value, MAX_GRANT_FIELDS, "fields")

    @property
    def choice(self) -> GrantChoice:
        """The offer as channels and votes carry it."""
        return GrantChoice(self.scope, int(self.for_.total_seconds()), self.same)


_VARIABLES: dict[str, Callable[[HookContext], Any]] = {
    "args": lambda ctx: dict(ctx.arguments),
    "tool": lambda ctx: ctx.tool_name,
    "agent": lambda ctx: ctx.agent_id,
    "user": lambda ctx: ctx.user_id or "",
    "metadata": lambda ctx: dict(ctx.metadata),
}
"""What a ``when`` condition can read, and how each is taken from the call."""


class ConfirmationGate(ToolFilter):
    """``type: confirmation_gate`` in an agent's ``hooks`` list."""

    type: Literal["confirmation_gate"] = "confirmation_gate"
    tools: tuple[str, ...] = Field(min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool."""
    when: str | None = None
    """A CEL condition over ``args``, ``tool``, ``agent``, ``user``, ``metadata``."""
    channel: str
    approvers: tuple[str, ...] = ()
    """People from the directory, or raw channel user ids. Empty: anyone who sees the card."""
    quorum: int = Field(default=1, ge=1)
    timeout: timedelta = timedelta(minutes=30)
    """How long its approvers have to decide (the request expires then). Not how long the
    gate may take to ask: that is the hook registry's default."""
    allow_self_approval: bool = False
    require_reject_reason: bool = False
    priority: int = 100
    approval_valid_for: timedelta = timedelta(minutes=10)
    """How long after the decision an approval still allows its call (until the call is
    reported executed): a replay of the call's idempotency key after that is denied."""
    grants: tuple[GrantOffer, ...] = ()
    """What an approver may choose beside approving the one call (see :class:`GrantOffer`)."""
    editable: tuple[str, ...] = ()
    """Top-level argument fields an approver may change before approving ("Edit and
    approve"); only with ``quorum: 1``, and never a field whose value is redacted."""

    @field_validator("editable")
    @classmethod
    def _check_editable(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _field_names(value, MAX_EDIT_FIELDS, "editable fields")

    remind: tuple[Reminder, ...] = Field(default=(), max_length=MAX_REMINDERS)
    """When to remind the approvers who have not voted yet (``[50%, 90%]``, ``[10m]``)."""
    escalate: tuple[Escalation, ...] = Field(default=(), max_length=MAX_ESCALATIONS)
    """Where the request goes, and who else may decide it, while nobody has (see :class:`Escalation`)."""

    @field_validator("timeout", "approval_valid_for", mode="before")
    @classmethod
    def _parse_timeout(cls, value: Any) -> timedelta:
        return parse_duration(value)

    @property
    def time_limit(self) -> float | None:
        return None

    @field_validator("grants", mode="before")
    @classmethod
    def _grant_list(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise ValueError("a list of grants, such as [{scope: session, for: 1h, same: [to]}]")
        if len(value) > MAX_GRANTS:
            raise ValueError(f"a gate offers at most {MAX_GRANTS} grants (each is a button on the card)")
        return value

    @field_validator("grants")
    @classmethod
    def _distinct_grants(cls, value: tuple[GrantOffer, ...]) -> tuple[GrantOffer, ...]:
        choices = [offer.choice for offer in value]
        for i, choice in enumerate(choices):
            if choice in choices[:i]:
                raise ValueError(f"grants[{i}] offers the same grant as grants[{choices.index(choice)}]")
        return value

    @field_validator("when")
    @classmethod
    def _check_when(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            cel.compile(value)
        except Exception as exc:
            raise ValueError(f"invalid CEL condition: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> ConfirmationGate:
        if self.approvers and self.quorum > len(self.approvers):
            raise ValueError(
                f"quorum {self.quorum} is more than the {len(self.approvers)} approver(s) listed"
            )
        if self.editable and self.quorum > 1:
            raise ValueError(
                f"editable needs quorum 1: changed arguments come only from an approval that "
                f"decides alone, and this gate waits for {self.quorum} approvals (remove "
                "editable or set quorum: 1)"
            )
        return self

    @cached_property
    def _condition(self) -> tuple[Any, tuple[str, ...]] | None:
        """The compiled ``when`` and the variables it reads (a plain attribute once computed)."""
        if self.when is None:
            return None
        program = cel.compile(self.when)
        return program, tuple(v for v in program.variables() if v in _VARIABLES)

    def matches(self, ctx: HookContext) -> bool:
        if not self.matches_tool(ctx.tool_name):
            return False
        condition = self._condition
        if condition is None:
            return True
        program, variables = condition
        try:
            # Only the variables the condition reads (each one converted costs time).
            values = {name: _VARIABLES[name](ctx) for name in variables}
            # Only a definite `false` lets the call pass; any other value sends it to a human.
            return program.execute(values) is not False
        except Exception:
            # Fail closed: an unevaluable condition sends the call to a human.
            return True

    async def before_tool_use(self, ctx: HookContext) -> HookResult:
        if ctx.services is None:
            return HookResult.deny(
                f"{self.label} needs a human decision but no approval service is available"
            )
        return await ctx.services.request_approval(ctx, self)
