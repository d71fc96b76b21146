"""The confirmation gate: a PreToolUse hook that sends matching calls to a human.

A gate matches a call when the tool name fits one of its globs and its optional
``when`` condition holds. Conditions are CEL (Common Expression Language), compiled
once at load and evaluated over ``args``, ``tool``, ``agent``, ``user`` and
``metadata``; CEL cannot run code, touch files or loop forever. Loading refuses a
condition that reads any other name (``arguments.amount``), suggesting the one meant.

A condition that cannot be evaluated for a call (a missing field, a type mismatch, a
value that is not true or false) denies the call, saying why: logged at WARNING, audited
(``condition_error``, with the gate, the condition and the error) and counted
(``signoff_condition_errors_total``). It neither lets the call through nor quietly asks
a human about every call. ``has(args.amount) && args.amount >= 50000`` is the way to read
a field calls may leave out: without it, it is a clean non-match.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
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

from signoff.app.audit import Action
from signoff.app.builtin_hooks._filter import ToolFilter, parse_duration
from signoff.app.metrics import CONDITION_ERRORS
from signoff.app.spelling import did_you_mean
from signoff.channels import MAX_EDIT_FIELDS, MAX_GRANT_FIELDS, Assurance, GrantChoice, duration_text
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

log = logging.getLogger("signoff")


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

_BOOLEANS = {
    **dict.fromkeys(("true", "t", "yes", "y", "on", "1"), True),
    **dict.fromkeys(("false", "f", "no", "n", "off", "0"), False),
}
"""Strings a tool's boolean parameter takes as a boolean (Pydantic's lax mode, which the
frameworks and Python MCP servers validate arguments with), case aside."""
_NUMERIC = re.compile(r"\s*[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?\s*")


def _as_boolean(text: str) -> bool | None:
    return _BOOLEANS.get(text.strip().lower())


def _as_number(text: str) -> int | float | None:
    if not _NUMERIC.fullmatch(text):
        return None
    number = float(text.replace("_", ""))
    if number != number or number in (float("inf"), float("-inf")):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**63 else number


def _boolean_first(text: str) -> bool | int | float | None:
    as_boolean = _as_boolean(text)
    return as_boolean if as_boolean is not None else _as_number(text)


def _number_first(text: str) -> bool | int | float | None:
    as_number = _as_number(text)
    return as_number if as_number is not None else _as_boolean(text)


def as_read(value: Any, read: Callable[[str], Any]) -> Any:
    """``value`` with each string ``read`` can read (as a boolean, as a number) replaced by what
    it reads, at any depth; None when no string changed."""
    changed = False

    def walk(item: Any) -> Any:
        nonlocal changed
        if isinstance(item, str):
            got = read(item)
            if got is not None:
                changed = True
                return got
            return item
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    out = walk(value)
    return out if changed else None


def _holds(program: Any, values: dict[str, Any]) -> bool:
    """Whether the condition gives true for ``values`` (a reading it cannot be evaluated for
    adds no catch: the arguments as sent decide then)."""
    try:
        return _evaluated(program, values) is True
    except Exception:
        return False


def _evaluated(program: Any, values: dict[str, Any]) -> bool | str:
    """The condition's result for ``values``: true or false, or why it is neither (raises
    when it cannot be evaluated)."""
    result = program.execute(values)
    if not isinstance(result, bool):
        kind = _CEL_TYPES.get(type(result), "null" if result is None else type(result).__name__)
        return f"the condition gave a {kind}, not true or false"
    return result


_BINDER = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,")
"""A comprehension macro's variable (the ``x`` of ``args.items.all(x, x > 0)``):
``Program.variables()`` reports such names among the ones read, so they are told apart
here. A name bound so and also read outside its macro is not caught at load; evaluating it
then fails, which denies the call."""

_API_NAMES = {"arguments": "args", "tool_name": "tool", "agent_id": "agent", "user_id": "user"}
"""What the agent API calls the values a condition reads (the likeliest slips)."""

_CEL_TYPES = {
    bool: "bool",
    int: "int",
    float: "double",
    str: "string",
    bytes: "bytes",
    list: "list",
    dict: "map",
    datetime: "timestamp",
    timedelta: "duration",
}
"""CEL's names for the types of the values a condition may give."""


def _unknown_names(program: Any, source: str) -> list[str]:
    """The names ``source`` reads that a condition has no value for, in order."""
    bound = set(_BINDER.findall(source))
    return [v for v in program.variables() if v not in _VARIABLES and v not in bound]


def _unknown_name(name: str) -> str:
    """``'arguments' (did you mean 'args'?)``: an unknown name and the one likely meant."""
    meant = _API_NAMES.get(name)
    hint = f"did you mean {meant!r}?" if meant is not None else did_you_mean(name, _VARIABLES)
    return f"{name!r} ({hint})" if hint else repr(name)


def _error_text(exc: Exception) -> str:
    """What went wrong evaluating a condition, in a few words (CEL's first sentence)."""
    if isinstance(exc, KeyError):
        return f"no field {exc.args[0]!r} in the call" if exc.args else "a field is missing in the call"
    text = str(exc).strip().split(". ")[0].rstrip(".")
    return text or type(exc).__name__


class ConfirmationGate(ToolFilter):
    """``type: confirmation_gate`` in an agent's ``hooks`` list."""

    type: Literal["confirmation_gate"] = "confirmation_gate"
    tools: tuple[str, ...] = Field(min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool."""
    when: str | None = None
    """A CEL condition over ``args``, ``tool``, ``agent``, ``user``, ``metadata``."""
    channel: str
    approvers: tuple[str, ...] = ()
    """People from the directory, console operators, or raw user ids of the channel's type (none on
    ``web``, whose ids are the directory's keys). Empty: anyone who sees the card."""
    quorum: int = Field(default=1, ge=1)
    timeout: timedelta = timedelta(minutes=30)
    """How long its approvers have to decide (the request expires then). Not how long the
    gate may take to ask: that is the hook registry's default."""
    allow_self_approval: bool = False
    require_reject_reason: bool = False
    min_assurance: Assurance | None = None
    """The weakest identification a vote on it may have (``oidc``, ``slack_signed``, …; see
    :class:`signoff.channels.Assurance`): a vote identified less surely is refused, saying so."""
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
            program = cel.compile(value)
        except Exception as exc:
            raise ValueError(f"invalid CEL condition: {exc}") from None
        unknown = _unknown_names(program, value)
        if unknown:
            names = ", ".join(_unknown_name(n) for n in unknown)
            readable = ", ".join(list(_VARIABLES)[:-1]) + f" and {list(_VARIABLES)[-1]}"
            raise ValueError(
                f"unknown name{'s' if len(unknown) > 1 else ''} in the condition: {names}; "
                f"a condition reads {readable}"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> ConfirmationGate:
        groups = any(a.startswith("group:") for a in self.approvers)
        if self.approvers and not groups and self.quorum > len(self.approvers):
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

    def condition(self, ctx: HookContext) -> bool | str:
        """Whether the ``when`` condition holds for the call (True without one), or, when it
        cannot be evaluated (a missing field, a type mismatch, a value that is not true or
        false), why not.

        It holds also when it holds for the arguments as a tool would read them: a tool that
        takes ``force: bool`` runs ``"force": "true"`` as forced, and one that takes ``amount:
        int`` runs ``"90000"`` as 90,000, while to the condition a string is no boolean and no
        number (``"true" == true`` is false). So a condition that does not hold for the
        arguments as sent is evaluated again with every string that reads as a boolean or a
        number read so (:func:`as_read`), once taking ``"1"`` and ``"0"`` as booleans and once as
        numbers; any reading holding catches the call (a reading it cannot be evaluated for
        catches nothing more: the arguments as sent decide)."""
        condition = self._condition
        if condition is None:
            return True
        program, variables = condition
        try:
            # Only the variables the condition reads (each one converted costs time).
            values = {name: _VARIABLES[name](ctx) for name in variables}
            result = _evaluated(program, values)
        except Exception as exc:
            return _error_text(exc)
        if result is not True and "args" in values:
            for read in (_boolean_first, _number_first):
                args = as_read(values["args"], read)
                if args is not None and _holds(program, {**values, "args": args}):
                    return True
        return result

    def matches(self, ctx: HookContext) -> bool:
        """Whether the gate catches the call: its tool, and a condition that does not give
        false. One that cannot be evaluated catches it (fail closed: what asks whether an
        edited call reaches a gate must hear yes); :meth:`before_tool_use` then denies."""
        return self.matches_tool(ctx.tool_name) and self.condition(ctx) is not False

    async def refusal(self, ctx: HookContext) -> HookResult | None:
        """The deny for a call the condition cannot be evaluated for, logged, audited and
        counted; None when it can be."""
        error = self.condition(ctx)
        if not isinstance(error, str):
            return None
        if ctx.services is not None:
            error = str(ctx.services.redact(error))
        log.warning(
            "gate %r of agent %r denied a call of %s: its condition %r could not be evaluated: %s",
            self.label,
            ctx.agent_id,
            ctx.tool_name,
            self.when,
            error,
        )
        CONDITION_ERRORS.labels(ctx.agent_id, self.label).inc()
        if ctx.services is not None:
            await ctx.services.record(
                ctx,
                Action.CONDITION_ERROR,
                {
                    "gate": self.label,
                    "tool": ctx.tool_name,
                    "when": self.when,
                    "error": error,
                    "user_id": ctx.user_id,
                    "session_id": ctx.session_id,
                    "tool_call_id": ctx.tool_call_id,
                },
            )
        return HookResult.deny(
            f"gate {self.label!r} could not evaluate its condition for this call ({error}), "
            "so the call is denied"
        )

    async def before_tool_use(self, ctx: HookContext) -> HookResult:
        refused = await self.refusal(ctx)
        if refused is not None:
            return refused
        if ctx.services is None:
            return HookResult.deny(
                f"{self.label} needs a human decision but no approval service is available"
            )
        return await ctx.services.request_approval(ctx, self)
