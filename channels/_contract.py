"""The channel contract: plain data in, plain data out.

A channel turns a :class:`Card` into a message on a chat platform, keeps that
message up to date, and turns a verified button click into a :class:`Click`.
Channels never touch the database: the server hands them a
:class:`ClickHandler` that applies clicks through the state machine.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from signoff.channels._assurance import Assurance

__all__ = [
    "ABSENT",
    "MAX_EDIT_BYTES",
    "MAX_EDIT_VALUE_BYTES",
    "MAX_REASON_CHARS",
    "MIN_SHORT_FORM_CHARS",
    "SHORT_FORM_CHARS",
    "ArgumentChange",
    "ArgumentLine",
    "ArgumentsView",
    "CallbackRejected",
    "CallbackReply",
    "Card",
    "Channel",
    "Click",
    "ClickAnswer",
    "ClickHandler",
    "ClickOutcome",
    "DeliveryError",
    "GateProgress",
    "GrantChoice",
    "Identity",
    "InteractiveChannel",
    "MessageRef",
    "PermanentDeliveryError",
    "Person",
    "RetryableDeliveryError",
    "Verdict",
    "argument_json",
    "changes_text",
    "edit_input",
    "edit_problem",
    "encodable",
    "lay_out_arguments",
    "parse_edit_value",
    "reminder_text",
    "safe_url",
    "shown_text",
    "while_same",
]

MAX_REASON_CHARS = 2000
"""The longest reason a decision may carry, wherever it is typed (a chat form, the console, the API)."""

UNSTORABLE_TEXT = "text that cannot be stored (NUL or a lone surrogate)"
"""The reason a click carrying such text is refused (recorded in the audit log)."""


def encodable(text: str) -> bool:
    """Whether ``text`` can be sent back as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _storable(text: str | None) -> bool:
    """Whether both databases can hold ``text`` as it is: no NUL, no lone surrogate."""
    if text is None:
        return True
    if "\x00" in text:
        return False
    if not encodable(text):
        return False
    return True


MessageRef = dict[str, str]
"""Where a posted card lives (for Slack ``channel`` and ``ts``, for Feishu ``message_id``, for
email the ``message_ids`` of the messages sent)."""


class Verdict(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


GRANT_SCOPES = ("session", "agent")
_SCOPE_WORDS = {"session": "this session", "agent": "this agent"}
MAX_GRANT_FIELDS = 20
"""``same`` fields a grant may hold equal at most (a card carries them in a button's value)."""


def duration_text(seconds: int) -> str:
    """``90`` → ``1m 30s``, ``3600`` → ``1h``, ``93600`` → ``1d 2h``: how long, in two units at most."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return " ".join(parts[:2]) or "0s"


@dataclass(frozen=True, slots=True)
class GrantChoice:
    """A grant an approver may give instead of approving the one call: later calls of the same
    tool by the same agent (``scope`` ``agent``) or in the same session (``session``) are
    allowed without asking for ``seconds``, while the argument fields ``same`` equal the
    approved call's."""

    scope: str
    seconds: int
    same: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.scope not in GRANT_SCOPES:
            raise ValueError(f"grant scope {self.scope!r} is not one of {', '.join(GRANT_SCOPES)}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int) or self.seconds <= 0:
            raise ValueError("a grant lasts a positive whole number of seconds")
        if len(self.same) > MAX_GRANT_FIELDS or not all(
            isinstance(f, str) and f and _storable(f) for f in self.same
        ):
            raise ValueError(f"a grant holds at most {MAX_GRANT_FIELDS} named argument fields equal")
        # One spelling per grant: the fields in order, each once.
        object.__setattr__(self, "same", tuple(sorted(set(self.same))))

    def as_dict(self) -> dict[str, Any]:
        return {"scope": self.scope, "seconds": self.seconds, "same": list(self.same)}

    @classmethod
    def from_dict(cls, data: object) -> GrantChoice:
        """The grant ``data`` describes (as :meth:`as_dict` wrote it); ``ValueError`` if it is not one."""
        if not isinstance(data, Mapping) or set(data) - {"scope", "seconds", "same"}:
            raise ValueError("a grant is an object of scope, seconds and same")
        scope, seconds, same = data.get("scope"), data.get("seconds"), data.get("same", [])
        if not isinstance(scope, str) or not isinstance(seconds, int):
            raise ValueError("a grant names its scope and how many seconds it lasts")
        if not isinstance(same, list | tuple):
            raise ValueError("a grant's same is a list of argument fields")
        return cls(scope=scope, seconds=seconds, same=tuple(same))

    @property
    def where(self) -> str:
        """``this session`` or ``this agent``."""
        return _SCOPE_WORDS[self.scope]

    def label(self) -> str:
        """The choice as a button says it: ``Approve for this session (1h)``."""
        return f"Approve for {self.where} ({duration_text(self.seconds)})"

    def explain(self, agent: str, tool: str) -> str:
        """What giving it allows, in one sentence."""
        who = f"{agent} in this session" if self.scope == "session" else agent
        text = f"For {duration_text(self.seconds)}, {who} may run {tool} again without asking"
        return text + (f" {while_same(self.same)}." if self.same else ".")


def while_same(fields: Sequence[str]) -> str:
    """The condition a grant holds its calls to: ``while the argument "to" stays the same``,
    ``while the arguments "amount" and "to" stay the same`` (quoted: a field may be called
    ``to``, ``for`` or ``and``)."""
    *rest, last = [f'"{f}"' for f in fields]
    if not rest:
        return f"while the argument {last} stays the same"
    return f"while the arguments {', '.join(rest)} and {last} stay the same"


MAX_EDIT_VALUE_BYTES = 4096
"""The longest an edited argument value may be, as compact JSON (UTF-8 bytes)."""
MAX_EDIT_BYTES = 16384
"""The most every edited value of one approval may take together, as compact JSON."""
MAX_EDIT_FIELDS = 20
"""Argument fields one approval may change at most (a gate names at most as many)."""
MAX_EDIT_FIELD_CHARS = 100
_EDIT_DEPTH = 16


def _json_problem(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain JSON that both databases store faithfully, or None."""
    if depth > _EDIT_DEPTH:
        return f"is nested deeper than {_EDIT_DEPTH} levels"
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "is not a finite number"
    if isinstance(value, str):
        return None if _storable(value) else "holds " + UNSTORABLE_TEXT
    if isinstance(value, list):
        return next((p for p in (_json_problem(v, depth + 1) for v in value) if p), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not _storable(key):
                return "has a key that is not storable text"
            if (problem := _json_problem(item, depth + 1)) is not None:
                return problem
        return None
    return f"is not a JSON value (a {type(value).__name__})"


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def edit_problem(arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` (argument field → the value an approver gives it) cannot be an edit,
    in one sentence for the approver, or None: JSON values only, at most
    :data:`MAX_EDIT_FIELDS` fields, each value at most :data:`MAX_EDIT_VALUE_BYTES` and all
    of them :data:`MAX_EDIT_BYTES` as compact JSON. Which fields may change is the gate's
    to say (the server checks that)."""
    if not isinstance(arguments, Mapping):
        return "The changed arguments are not an object of field names and values."
    if len(arguments) > MAX_EDIT_FIELDS:
        return f"At most {MAX_EDIT_FIELDS} argument fields can be changed at once."
    total = 0
    for name, value in arguments.items():
        if not isinstance(name, str) or not name or len(name) > MAX_EDIT_FIELD_CHARS or not _storable(name):
            return f"{str(name)[:MAX_EDIT_FIELD_CHARS]!r} is not an argument field name."
        if (problem := _json_problem(value)) is not None:
            return f"The new value of {name} {problem}."
        size = _json_size(value)
        if size > MAX_EDIT_VALUE_BYTES:
            return f"The new value of {name} takes {size} bytes; at most {MAX_EDIT_VALUE_BYTES} are allowed."
        total += size
    if total > MAX_EDIT_BYTES:
        return f"The changed values take {total} bytes together; at most {MAX_EDIT_BYTES} are allowed."
    return None


def edit_input(value: Any) -> str:
    """How an argument value is written in an edit form's text input: a string as it is,
    anything else as JSON (:func:`parse_edit_value` reads it back)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parse_edit_value(text: str, *, as_text: bool = False) -> Any:
    """The value an approver typed: JSON when it parses as JSON (``40000``, ``true``,
    ``["a"]``), else the text itself. ``as_text``: the field held text, so what was typed
    is text whatever it looks like (``"007"`` stays a string)."""
    if as_text:
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


@dataclass(frozen=True, slots=True)
class ArgumentChange:
    """One argument field an approver changed: the value proposed and the value approved
    (``proposed`` is :data:`ABSENT` when the call did not have the field)."""

    field: str
    proposed: Any
    approved: Any

    def text(self, limit: int = 80) -> str:
        """``amount 90000 → 40000``."""

        def shown(value: Any) -> str:
            text = "(absent)" if value is ABSENT else argument_json(value)
            return text if len(text) <= limit else text[: limit - 1] + "…"

        return f"{shown_text(self.field)} {shown(self.proposed)} → {shown(self.approved)}"


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""The proposed value of a field the call did not have."""


def changes_text(changes: Sequence[ArgumentChange], limit: int = 80) -> str:
    """``amount 90000 → 40000, memo "a" → "b"``."""
    return ", ".join(change.text(limit) for change in changes)


SHORT_FORM_CHARS = 80
"""A value's short form on a card: the first this many characters of its JSON (all of it
when it is shorter)."""
MIN_SHORT_FORM_CHARS = 24
"""When every field's short form does not fit on a card, they shrink together down to this
many characters; below that the card cannot show the call, and offers no approval."""

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
# Unicode's default-ignorable code points outside those categories (DerivedCoreProperties.txt):
# marks, fillers and unassigned code points that no renderer draws (the combining grapheme
# joiner, variation selectors, Hangul fillers, U+2065, the rest of the tag plane).
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u2065\u3164\ufe00-\ufe0f\uffa0"
    "\ufff0-\ufff8\U000e0000-\U000e0fff]"
)
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")
_NOT_PRINTABLE_ASCII_OR_BACKSLASH = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
"""For :func:`shown_text`: a backslash is escaped too (JSON escapes its own), so that a name
spelled with a literal ``\u200b`` never shows as one with the invisible character."""


def _escape_hidden(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    if unicodedata.category(char) not in _HIDDEN_CATEGORIES and _IGNORABLE.match(char) is None:
        return char
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def argument_json(value: Any, *, indent: int | None = None) -> str:
    """``value`` as a card writes it: compact JSON on one line, with every character that does
    not show as itself (controls, format characters such as bidi overrides and zero-width
    spaces, line separators, and the other default-ignorable code points: variation selectors,
    Hangul fillers) written as a ``\\u`` escape, so what a card shows is what runs.

    ``indent``: laid out over lines, that many spaces a level (as a page shows it); the line
    breaks are the layout's own, as every one inside a value is written ``\\n``."""
    if indent is None:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        return _NOT_PRINTABLE_ASCII.sub(_escape_hidden, text)
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=str)
    return "\n".join(_NOT_PRINTABLE_ASCII.sub(_escape_hidden, line) for line in text.split("\n"))


def shown_text(text: str) -> str:
    """``text`` from an agent (a tool name, a requester's id) as a card shows it: on one line,
    every character that does not show as itself (a line break, a bidi override, a zero-width
    space) written as a ``\\u`` escape, so it cannot draw lines of a card's own (``Arguments:``),
    and a backslash doubled, so that an escape shown is never text the agent wrote."""
    return _NOT_PRINTABLE_ASCII_OR_BACKSLASH.sub(_escape_hidden, text)


@dataclass(frozen=True, slots=True)
class ArgumentLine:
    """One argument field as a card shows it: its name and the first ``shown`` characters of
    its value's JSON (:func:`argument_json`)."""

    field: str
    name: str
    """The field's name as :func:`argument_json` writes it."""
    value: str
    """The whole value as :func:`argument_json` writes it."""
    shown: int

    @property
    def hidden(self) -> int:
        """Characters of the value the card leaves out (0: it shows all of it)."""
        return len(self.value) - self.shown

    @property
    def text(self) -> str:
        """``"command": "curl … | sh"``, or cut short ``"description": "Install… 2,816 more characters"``."""
        line = f"{self.name}: {self.value[: self.shown]}"
        return f"{line}… {self.hidden:,} more characters" if self.hidden else line


@dataclass(frozen=True, slots=True)
class ArgumentsView:
    """A call's arguments laid out for one card (:func:`lay_out_arguments`)."""

    lines: tuple[ArgumentLine, ...]
    """A line for every field, in the order of their names; empty when they do not all fit."""
    fields: int
    """How many fields the call has."""

    @property
    def complete(self) -> bool:
        """Whether the card shows every field: a card that does not offers no approval."""
        return len(self.lines) == self.fields

    @property
    def notice(self) -> str | None:
        """What a card says above its link to the request in Signoff: why the call does not fit,
        or that values are cut short (None: the card shows the whole call)."""
        if not self.complete:
            return (
                f"The {self.fields} argument fields of this call do not fit on this card, so it "
                "cannot be approved here; the whole call is in Signoff."
            )
        if any(line.hidden for line in self.lines):
            return "Values cut short here are whole in Signoff."
        return None


def lay_out_arguments(
    arguments: Mapping[str, Any],
    *,
    budget: int,
    line_limit: int | None = None,
    size: Callable[[str], int] = len,
) -> ArgumentsView:
    """The one layout of a call's arguments on every card, email and message: a line per field,
    in the order of their names, each value clipped on its own.

    ``size`` is what a line's :attr:`ArgumentLine.text` takes as the channel writes it (its
    escaping, its separators); the lines take at most ``budget`` together and ``line_limit``
    each. Every field first gets its name and a short form of its value (the same length for
    all, :data:`SHORT_FORM_CHARS` down to :data:`MIN_SHORT_FORM_CHARS`); only then does any
    value get more, the room left shared evenly among the values still cut short. So no field,
    however long or numerous the others, is pushed off the card: when the names and shortest
    forms do not fit, the view has no lines and the card offers no approval."""
    limit = budget if line_limit is None else min(line_limit, budget)
    values = [
        (name, argument_json(name), argument_json(arguments[name])) for name in sorted(arguments, key=str)
    ]

    def short(chars: int) -> list[ArgumentLine]:
        return [ArgumentLine(field, name, value, min(len(value), chars)) for field, name, value in values]

    def fits(lines: list[ArgumentLine]) -> bool:
        costs = [size(line.text) for line in lines]
        return all(cost <= limit for cost in costs) and sum(costs) <= budget

    low, high = MIN_SHORT_FORM_CHARS, SHORT_FORM_CHARS
    if not fits(short(low)):
        return ArgumentsView((), len(values))
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(short(middle)) else (low, middle - 1)
    lines = short(low)
    costs = [size(line.text) for line in lines]
    spare = budget - sum(costs)
    while spare > 0:
        growing = [i for i, line in enumerate(lines) if line.hidden and costs[i] < limit]
        if not growing:
            break
        share = max(spare // len(growing), 1)
        grew = False
        for i in growing:
            room = min(limit, costs[i] + share, costs[i] + spare)
            line = lines[i]
            whole = replace(line, shown=len(line.value))
            if size(whole.text) <= room:
                best = whole
            else:
                # The longest prefix that fits (the note shrinks as it grows: check the result).
                lo, hi = line.shown, len(line.value) - 1
                while lo < hi:
                    middle = (lo + hi + 1) // 2
                    fitting = size(replace(line, shown=middle).text) <= room
                    lo, hi = (middle, hi) if fitting else (lo, middle - 1)
                best = replace(line, shown=lo)
            cost = size(best.text)
            if best.shown > line.shown and cost <= room:
                spare -= cost - costs[i]
                lines[i], costs[i], grew = best, cost, True
        if not grew:
            break
    return ArgumentsView(tuple(lines), len(values))


_URL_SAFE = "-._~:/?=%@+,;!$"


def safe_url(url: str) -> str:
    """``url`` with every character that could end a link in a platform's markup (spaces,
    brackets, parentheses, quotes, ``|``, ``&``, ``*``) percent-encoded."""
    return quote(url, safe=_URL_SAFE)


@dataclass(frozen=True, slots=True)
class Person:
    """Someone named on a card: their id on this channel (if known) and a display name."""

    name: str
    user_id: str | None = None


def reminder_text(
    card: Card,
    waiting_on: tuple[Person, ...],
    *,
    mention: Callable[[Person], str],
    escape: Callable[[str], str] = str,
) -> str:
    """The words of a reminder under ``card``: ``waiting_on`` named by ``mention`` (a channel's
    way of mentioning someone by id, or of writing their name), everything else passed
    through ``escape`` (the channel's escaping of text that came from agents)."""
    who = " ".join(mention(p) for p in waiting_on)
    deadline = card.expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    ask = f"{who} your decision is still needed" if who else "A decision is still needed"
    what = escape(f"{card.agent_id} wants to run {card.tool_name} (request {card.request_id})")
    return f"{ask}: {what}; it expires {deadline}."


@dataclass(frozen=True, slots=True)
class GateProgress:
    """One of the gates a request needs, when it needs several (every one must approve)."""

    name: str
    quorum: int
    approvals: tuple[Person, ...] = ()
    here: bool = True
    """Decided on this card; otherwise on the card in another channel."""

    @property
    def approved(self) -> bool:
        return len(self.approvals) >= self.quorum


@dataclass(frozen=True, slots=True)
class Card:
    """Everything a channel needs to draw one approval card, current as of rendering."""

    request_id: str
    agent_id: str
    tool_name: str
    arguments: Mapping[str, Any]
    """Already redacted by the server; a channel only truncates."""
    status: str
    """``pending``, ``approved``, ``rejected``, ``expired`` or ``cancelled``."""
    created_at: datetime
    expires_at: datetime
    quorum: int
    approvers: tuple[Person, ...]
    """Who may approve; empty means anyone who can see the card."""
    requester: Person | None = None
    approvals: tuple[Person, ...] = ()
    """Approvals recorded so far."""
    decided_by: Person | None = None
    decided_at: datetime | None = None
    reason: str | None = None
    require_reject_reason: bool = False
    gates: tuple[GateProgress, ...] = ()
    """Every gate the request needs, when it needs several; ``quorum``, ``approvers`` and
    ``approvals`` above are then those of the gates decided on this card."""
    grants: tuple[GrantChoice, ...] = ()
    """Pending: the grants an approver may choose on this card beside approving once."""
    granted: GrantChoice | None = None
    """Approved: the grant given with the approval (``None``: approved once)."""
    granted_until: datetime | None = None
    """When that grant expires."""
    editable: tuple[str, ...] = ()
    """Pending: the argument fields an approver may change before approving ("Edit and
    approve"; their current values are in ``arguments``)."""
    changes: tuple[ArgumentChange, ...] = ()
    """Approved: the argument fields the approver changed (empty: approved as asked)."""
    console_url: str | None = None
    """The request's page in the Signoff console, where the whole call is shown (None when
    ``SIGNOFF_PUBLIC_URL`` is unset)."""

    @property
    def is_pending(self) -> bool:
        return self.status == "pending"

    @property
    def approved_how(self) -> str:
        """What an approval authorized, for the decided card: ``once``, ``for this session
        until 2024-05-01 11:32 UTC``, or ``with changes: amount 90000 → 40000``."""
        if self.granted is None:
            how = "once" if not self.changes else ""
        else:
            until = self.granted_until
            when = until.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if until else ""
            how = f"for {self.granted.where}" + (f" until {when}" if when else "")
        if self.changes:
            how = f"{how} with changes: {changes_text(self.changes)}".strip()
        return how


@dataclass(frozen=True, slots=True)
class Click:
    """A verified button press (or rejection form) parsed from a platform callback."""

    request_id: str
    verdict: Verdict
    user_id: str
    user_name: str | None = None
    reason: str | None = None
    event_id: str | None = None
    """The platform's delivery id, for de-duplicating redeliveries."""
    identity: Mapping[str, str] = field(default_factory=dict)
    """Platform facts about the clicker recorded for the audit trail (team id, open_id, …)."""
    conversation: str | None = None
    """The conversation the clicked card is in (a Slack channel id, a Feishu chat id), as the
    platform says; ``None`` when it does not (a click in Slack's Home tab). A click counts
    only in the conversation its card was posted to."""
    grant: GrantChoice | None = None
    """An approval that gives this grant (the server checks that the gate offers it)."""
    arguments: Mapping[str, Any] | None = None
    """An approval with changes: argument field → the value the approver gave it (plain JSON,
    within :func:`edit_problem`'s limits; the server checks that the gate lets those fields
    change). Fields given their proposed value are no change."""
    outsider: bool = False
    """The platform says the clicker belongs to another organisation than the one the app is
    installed in (a Slack Connect member, a member of a Feishu external group). Their click
    counts only where they are a listed approver, never on a gate open to its channel."""

    def __post_init__(self) -> None:
        # Everything here is stored (votes, audit events); text no database can hold would
        # fail there as "database unavailable" or worse. The click is malformed: a 400.
        texts = [self.request_id, self.user_id, self.user_name, self.reason, self.event_id]
        texts += [*self.identity.keys(), *self.identity.values()]
        if not all(_storable(text) for text in texts):
            raise CallbackRejected(UNSTORABLE_TEXT, status_code=400)
        if self.arguments is not None:
            if self.verdict is not Verdict.APPROVE:
                raise CallbackRejected("changed arguments come with an approval", status_code=400)
            if (problem := edit_problem(self.arguments)) is not None:
                raise CallbackRejected(problem, status_code=400)


@dataclass(frozen=True, slots=True)
class Identity:
    """How a channel type names people: the form of its user ids, and what else in a click
    names the clicker. The people directory holds each person's id per channel type
    (``slack: U0ALICE``); these rules say what such an id looks like and how a click is
    matched to it."""

    user_id: re.Pattern[str] | None = None
    """What a user id of this channel type looks like. With a pattern, an approver written
    as a raw id must match it, and a person listed as an approver of a gate on this channel
    type needs an id of this type in the directory. None: the channel type has no ids of
    its own, and its gates' approvers are people of the directory or operators only."""
    aliases: tuple[str, ...] = ()
    """Keys of :attr:`Click.identity` that name the clicker too, tried in order when the
    directory does not know the click's ``user_id`` (Feishu's ``union_id``)."""
    by_email: bool = False
    """People are addressed one by one at the ``email`` of their directory entry (the email
    channel): that address is their id on this channel type, each approver needs one, and a
    gate on it must list its approvers (nobody else would receive the message)."""
    assurance: Assurance | None = None
    """How sure a vote from this channel type is of its voter (recorded with the vote; a
    gate's ``min_assurance`` compares it). None: unknown, below every level."""
    personal: bool = False
    """Each approver is sent a message of their own, at their id of this channel type (an
    ntfy topic): a gate on it must list its approvers, each a person of the directory with
    an id of this type (no raw ids: a misspelt name would be an id anyone could take)."""
    secret_ids: bool = False
    """An id of this channel type is a credential (an ntfy topic: whoever knows it may read
    its person's notifications): only the database holds one. The configuration page masks
    it, and votes and audit events name its person by their directory key instead wherever
    they are shown (agents, receipts, the console, the operator API, the command line); the
    vote's :attr:`assurance` marks such a vote for good."""

    @property
    def one_by_one(self) -> bool:
        """Whether people are reached one by one (by email or at an id of their own), so that
        a gate on this channel type must list its approvers."""
        return self.by_email or self.personal

    def is_user_id(self, value: str) -> bool:
        """Whether ``value`` could be a user id of this channel type."""
        return self.user_id is None or self.user_id.match(value) is not None

    def clicker_ids(self, click: Click) -> list[str]:
        """The ids naming whoever clicked, the click's ``user_id`` first."""
        return [click.user_id, *(click.identity[k] for k in self.aliases if click.identity.get(k))]


class ClickAnswer(StrEnum):
    """The one callback contract every decision surface answers by (Slack, Feishu, email
    links, ntfy actions, the console, the operator API): each maps these to its own answer,
    an HTTP status where it has one (:attr:`status_code`)."""

    RECORDED = "recorded"
    """This click's vote was recorded (whether or not it decided the request)."""
    REPEATED = "repeated"
    """The same person's same decision again (a double tap, a push client's retry): nothing
    new is recorded, and the answer is the decision as it stands."""
    CONFLICT = "conflict"
    """A decision that cannot count because the request is decided otherwise (or this person
    already voted the other way): the answer names the final state and who made it."""
    GONE = "gone"
    """The request expired or was cancelled: the answer names that state."""
    REFUSED = "refused"
    """Not counted for who clicked or where (not an approver, the requester, another
    channel's card, a reason missing, a grant not offered)."""
    MISSING = "missing"
    """There is no such request."""

    @property
    def ok(self) -> bool:
        """Whether the clicker's decision stands: recorded now or before."""
        return self in (ClickAnswer.RECORDED, ClickAnswer.REPEATED)

    @property
    def status_code(self) -> int:
        """The HTTP status of this answer: 200 recorded or repeated, 409 conflict (and any
        other refusal), 410 expired or cancelled, 404 no such request."""
        return _ANSWER_STATUS[self]


_ANSWER_STATUS = {
    ClickAnswer.RECORDED: 200,
    ClickAnswer.REPEATED: 200,
    ClickAnswer.CONFLICT: 409,
    ClickAnswer.GONE: 410,
    ClickAnswer.REFUSED: 409,
    ClickAnswer.MISSING: 404,
}


@dataclass(frozen=True, slots=True)
class ClickOutcome:
    """What the server did with a click, for the channel to show to the clicker."""

    accepted: bool
    """True when the vote was recorded (whether or not it decided the request)."""
    message: str
    """One line for the clicker: the outcome, or why nothing changed."""
    card: Card
    """The request as it stands after the click."""
    answer: ClickAnswer = ClickAnswer.RECORDED
    """Which answer of the callback contract this is (a click not ``accepted`` and not said
    otherwise is ``REFUSED``)."""

    def __post_init__(self) -> None:
        if not self.accepted and self.answer is ClickAnswer.RECORDED:
            object.__setattr__(self, "answer", ClickAnswer.REFUSED)


class ClickHandler(Protocol):
    """What the server offers a channel: apply clicks, enrich identities."""

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        """Record a click through the state machine (votes, quorum, audit, card updates)."""
        ...

    async def enrich_identity(
        self, channel: str, user_id: str, *, name: str | None, email: str | None
    ) -> None:
        """Attach a looked-up display name and email to the votes this user cast."""
        ...

    async def current_card(self, channel: str, request_id: str) -> Card | None:
        """The request as it stands, drawn for ``channel`` (an edit form shows its current
        arguments); None if there is no such request."""
        ...


@dataclass(frozen=True, slots=True)
class CallbackReply:
    """The HTTP answer to a platform callback, plus work to do after answering."""

    status_code: int = 200
    body: Mapping[str, Any] | None = None
    after: Callable[[], Awaitable[None]] | None = None
    """Slow work (user lookups, modal follow-ups) run after the acknowledgement."""


class DeliveryError(Exception):
    """Posting or updating a card failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryableDeliveryError(DeliveryError):
    """A transient failure (rate limit, 5xx, network); try again later."""

    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class PermanentDeliveryError(DeliveryError):
    """A failure retrying cannot fix (bad token, unknown chat); the request is cancelled."""


class CallbackRejected(Exception):
    """A callback failed verification or could not be parsed; nothing is applied.

    ``reason`` is recorded in the audit log and metrics; it is never sent back.
    """

    def __init__(self, reason: str, *, status_code: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status_code = status_code


@runtime_checkable
class Channel(Protocol):
    """Posts approval cards and keeps them current."""

    name: str
    """The channel's name in the configuration (``ops-slack``)."""
    type: str
    """The channel type (``slack``, ``feishu``, ``email``, ``web``)."""

    async def post(self, card: Card) -> MessageRef:
        """Post a new card; raise a :class:`DeliveryError` on failure."""
        ...

    async def update(self, ref: MessageRef, card: Card) -> None:
        """Redraw a posted card; a decided card must have no buttons left."""
        ...

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Tell ``waiting_on`` (mentioning each who has an id here) that the card posted at
        ``ref`` still waits for them, as a reply to it; raise a :class:`DeliveryError` on
        failure. ``waiting_on`` may be empty (anyone who sees the card may decide).
        ``key`` is the same on every attempt of one reminder and differs between reminders:
        a platform that de-duplicates sends by a key of the caller's is given it."""
        ...

    async def aclose(self) -> None:
        """Release clients and background connections."""
        ...


@runtime_checkable
class InteractiveChannel(Channel, Protocol):
    """A channel that receives clicks over HTTP callbacks or its own connection."""

    async def handle_callback(
        self, body: bytes, headers: Mapping[str, str], handler: ClickHandler
    ) -> CallbackReply:
        """Verify (signature first), parse and apply one callback.

        Raises :class:`CallbackRejected` for anything that fails verification.
        """
        ...

    async def start(self, handler: ClickHandler) -> None:
        """Start receiving over a platform connection (Socket Mode, long connection), if configured."""
        ...

    def conversation_of(self, ref: MessageRef | None) -> str | None:
        """The conversation a card posted with ``ref`` is in (before it is posted, ``None``:
        the one it will be posted to); ``None`` if this channel has no conversations."""
        ...

    async def lookup_user(self, user_id: str) -> tuple[str | None, str | None]:
        """The platform's display name and email for a clicker, ``None`` where it has none.

        Raises :class:`DeliveryError` when the platform cannot be asked; the server then
        refuses a click whose clicker it needed to know (fail closed).
        """
        ...
