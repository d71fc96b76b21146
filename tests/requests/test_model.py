"""A reference model of what an approval authorizes, and a model-based test of the server.

:class:`Model` is written from DESIGN.md ("What an approval authorizes", its "Order of
answers", "The state machine", "Trust rules"), not from the code: a few plain dictionaries of
requests, votes, grants and executions, and one function answering a call allow, deny or
pending. :class:`Approvals` (a hypothesis ``RuleBasedStateMachine``) drives the real app in
process and the model with the same random steps: calls in several spellings, with reused and
fresh keys, for several people; votes from listed and unlisted people through the operator
API, with grants and edits; execution reports; reloads that add, remove and loosen gates;
the read-only switch; revocations, cancellations; time passing; and calls made while another
connection holds the database longer than a hook may take (a stall).

After every call the server's answer is checked against the model's, strictly where it
matters: never ``allow`` where the model would not allow, and an allow runs exactly the
arguments that were approved (``modified_arguments``). A stall may also be answered deny or
503 (failing closed), and where DESIGN.md leaves the answer open the model accepts each
answer it allows (``Expected.decisions``).

``make test`` runs a bounded number of examples (:data:`EXAMPLES`, :data:`STEPS`); a longer
run: ``SIGNOFF_MODEL_EXAMPLES=2000 .venv/bin/pytest -q tests/requests/test_model.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from signoff.app.db import transaction
from signoff.app.models import ConfirmationRequest, Grant, Vote
from tests.requests.support import ADMIN, POST, PRE, Served, Stall, serving

EXAMPLES = int(os.environ.get("SIGNOFF_MODEL_EXAMPLES", "30"))
"""Random step sequences per database (``make test``: a bounded few)."""
STEPS = int(os.environ.get("SIGNOFF_MODEL_STEPS", "30"))
"""Steps per sequence at most."""
STALL_LIMIT = 0.03
"""Seconds each hook may take while a stall holds the database for :data:`STALL_HELD` at most
(released as soon as the call is answered)."""
STALL_HELD = 0.15

AGENT = "bot"

# ---------------------------------------------------------------------------------------------
# The world: people, tools, arguments, gates.

PEOPLE: dict[str, dict[str, str]] = {
    "alice": {"name": "Alice", "web": "alice", "fake": "U_ALICE", "email": "alice@example.com"},
    "bob": {"name": "Bob", "web": "bob", "fake": "U_BOB"},
    "carol": {"name": "Carol", "web": "carol", "fake": "U_CAROL"},
    "dave": {"name": "Dave", "web": "dave"},
}
"""The directory. Dave is listed but approves nothing; Mallory (an operator below) is not listed."""
OPERATORS = ["alice", " Alice ", "bob", "carol", "dave", "mallory"]
USERS = [None, "alice", "U_ALICE", "bob", "zed"]
"""Who calls are made for (``user_id``): nobody, Alice by her key and by her chat id, Bob,
someone the directory does not know."""
TOOLS: dict[str, str | None] = {
    "pay_invoice": "pay",
    "PAY_Invoice": "pay",
    "\uff50\uff41\uff59_invoice": "pay",  # full-width letters
    "p\u0430y_invoice": "pay",  # a Cyrillic a
    "pay\u200b_invoice": "pay",  # a zero-width space
    "wire_funds": "wire",
    "WIRE_funds": "wire",
    "read_file": None,
}
"""Each spelling the agent may send, and the tool it is to a gate (None: no gate's)."""
ARGUMENTS: list[dict[str, Any]] = [
    {"to": "acme", "amount": 90000},
    {"amount": 90000, "to": "acme"},  # the same call, keys in another order
    {"to": "acme", "amount": 40000},
    {"to": "Acme", "amount": 90000},
    {"to": {"iban": "DE89", "bic": "X"}, "amount": 90000},
    {"to": {"bic": "X", "iban": "DE89"}, "amount": 90000},  # the same call
    {"to": "acme"},
]
SESSIONS = ["s-1", None, "s-2"]
EDIT_PICKS: list[dict[str, Any] | None] = [
    None,
    None,
    {"amount": 40000},
    None,
    {"amount": 90000},
    {"to": "evil"},
]
"""The arguments a vote changes: none, or these (``to`` is editable at no gate)."""


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: how DESIGN.md compares arguments."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def held(arguments: Mapping[str, Any], name: str) -> str | None:
    """What a ``same`` field holds: the field's canonical JSON, or None when it is absent."""
    return canonical(arguments[name]) if name in arguments else None


def person(name: str | None) -> str | None:
    """The directory key of whoever ``name`` names (their key, a channel id or their email, in
    any case, spaces around it ignored)."""
    if name is None:
        return None
    wanted = name.strip().casefold()
    for key, entry in PEOPLE.items():
        if wanted in {key, *(v.casefold() for f, v in entry.items() if f != "name")}:
            return key
    return None


def same_person(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return (person(a) is not None and person(a) == person(b)) or a.strip().casefold() == b.strip().casefold()


class Offer(NamedTuple):
    """A grant: its scope, how long it lasts, the fields it holds the same."""

    scope: str
    minutes: int
    same: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        return {"scope": self.scope, "for": f"{self.minutes}m", "same": list(self.same)}


def meet(choices: list[Offer]) -> Offer:
    """With a quorum, the narrowest of the approving votes' grants."""
    scope = "session" if any(c.scope == "session" for c in choices) else "agent"
    return Offer(scope, min(c.minutes for c in choices), tuple(sorted({f for c in choices for f in c.same})))


@dataclass(frozen=True)
class Gate:
    name: str
    tool: str
    """The tool it gates (every spelling of it)."""
    approvers: tuple[str, ...]
    quorum: int = 1
    from_amount: int | None = None
    """Only calls whose ``amount`` is at least this (None: every call of the tool)."""
    timeout: int = 30
    """Minutes its approvers have."""
    valid_for: int = 10
    """Minutes an approval allows its call after the decision."""
    editable: tuple[str, ...] = ()
    offers: tuple[Offer, ...] = ()

    def catches(self, tool: str, arguments: Mapping[str, Any]) -> bool:
        if TOOLS[tool] != self.tool:
            return False
        amount = arguments.get("amount")
        return self.from_amount is None or (isinstance(amount, int) and amount >= self.from_amount)

    def config(self) -> dict[str, Any]:
        hook: dict[str, Any] = {
            "type": "confirmation_gate",
            "name": self.name,
            "tools": [f"{self.tool}_*"],
            "channel": "chat",
            "approvers": list(self.approvers),
            "quorum": self.quorum,
            "timeout": f"{self.timeout}m",
            "approval_valid_for": f"{self.valid_for}m",
        }
        if self.from_amount is not None:
            hook["when"] = f"has(args.amount) && args.amount >= {self.from_amount}"
        if self.editable:
            hook["editable"] = list(self.editable)
        if self.offers:
            hook["grants"] = [o.body() for o in self.offers]
        return hook


GRANTS_OFFERED = {
    "pay": (Offer("session", 60, ("to",)), Offer("session", 60, ("amount", "to")), Offer("agent", 20)),
    "wire": (Offer("agent", 60), Offer("session", 20)),
}
GRANT_PICKS: list[Offer | int | None] = [None, 0, 1, 2, None, Offer("agent", 60, ("to",))]
"""What a vote asks for beside approving: nothing, one of the grants the request's gates offer
(by its place among them), or one that no gate offers."""


@dataclass(frozen=True)
class Policy:
    """One configuration of the agent's gates: the reloads move between these."""

    security: bool = False
    """Whether gate ``security`` (Carol) also gates payments."""
    loose: bool = False
    """Whether ``payments`` asks only from 50,000."""
    wire_quorum: int = 2

    @property
    def gates(self) -> list[Gate]:
        gates = [
            Gate(
                "payments",
                "pay",
                ("alice", "bob"),
                from_amount=50000 if self.loose else None,
                editable=("amount",),
                offers=GRANTS_OFFERED["pay"],
            )
        ]
        if self.security:
            gates.append(Gate("security", "pay", ("carol",), timeout=15, valid_for=5))
        gates.append(
            Gate("wire", "wire", ("alice", "bob", "carol"), quorum=self.wire_quorum, valid_for=15,
                 offers=GRANTS_OFFERED["wire"])
        )  # fmt: skip
        return gates

    def config(self) -> dict[str, Any]:
        guard = {"type": "readonly_guard", "name": "read-only", "tools": ["pay_*", "wire_*"], "priority": 200}
        return {
            "channels": {"chat": {"type": "fake"}},
            "people": PEOPLE,
            "agents": {AGENT: {"hooks": [*(g.config() for g in self.gates), guard]}},
        }


# ---------------------------------------------------------------------------------------------
# The model.

PENDING, APPROVED, REJECTED, EXPIRED, CANCELLED = "pending", "approved", "rejected", "expired", "cancelled"


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]
    session: str | None = None
    key: str | None = None
    user: str | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"tool_name": self.tool, "arguments": self.arguments}
        for name, value in (
            ("session_id", self.session),
            ("idempotency_key", self.key),
            ("user_id", self.user),
        ):
            if value is not None:
                body[name] = value
        return body

    def same_call(self, other: Call) -> bool:
        """The same tool (as spelled) and canonically the same arguments."""
        return self.tool == other.tool and canonical(self.arguments) == canonical(other.arguments)


@dataclass
class Request:
    id: str
    call: Call
    asks: tuple[Gate, ...]
    """The gates it asks, as they were when it was made."""
    created_at: datetime
    status: str = PENDING
    votes: dict[str, dict[str, tuple[str, Offer | None]]] = field(default_factory=dict)
    """By gate name, by voter: the verdict and the grant chosen."""
    decided_at: datetime | None = None
    approved: dict[str, Any] | None = None
    """Approved with changes: the arguments as approved."""
    executed: bool = False

    @property
    def expires_at(self) -> datetime:
        return self.created_at + timedelta(minutes=min(g.timeout for g in self.asks))

    @property
    def valid_until(self) -> datetime:
        assert self.decided_at is not None
        return self.decided_at + timedelta(minutes=min(g.valid_for for g in self.asks))

    @property
    def offers(self) -> set[Offer]:
        return {o for g in self.asks for o in g.offers}


@dataclass
class ModelGrant:
    id: str
    gate: str
    offer: Offer
    tool: str
    session: str | None
    same: dict[str, str | None]
    grantors: tuple[str, ...]
    expires_at: datetime
    revoked: bool = False

    def covers(self, gate: Gate, call: Call, now: datetime) -> bool:
        """Whether this grant lets ``call`` through ``gate`` (as configured now): enough of its
        grantors for the gate's quorum would approve the call now (none of my gates lets a
        requester approve their own call)."""
        return (
            self.gate == gate.name
            and not self.revoked
            and now < self.expires_at
            and self.tool == call.tool  # exactly as approved: no other spelling
            and (self.offer.scope == "agent" or (call.session is not None and call.session == self.session))
            and all(held(call.arguments, name) == value for name, value in self.same.items())
            and self.holding(gate, call) >= gate.quorum
        )

    def holding(self, gate: Gate, call: Call) -> int:
        """How many of the grantors ``gate`` as configured now would take for ``call``: still
        its approvers, and not the person the call is made for."""
        return sum(person(g) in gate.approvers and not same_person(call.user, g) for g in self.grantors)


ANY: Any = object()
"""``Expected.modified`` when any ``modified_arguments`` will do."""


@dataclass(frozen=True)
class Expected:
    """The answers the model allows for a call."""

    decisions: frozenset[str]
    why: str
    modified: Any = None
    """With ``allow``: the ``modified_arguments`` the call must run with (ANY: not checked)."""
    request: str | None = None
    """With ``pending``: the request that answers (None: a new one, asking ``asks``)."""
    asks: tuple[str, ...] = ()


def expect(*decisions: str, why: str, **kw: Any) -> Expected:
    return Expected(frozenset(decisions), why, **kw)


@dataclass
class Outcome:
    """What the model makes of a vote: whether the server may accept it and may refuse it, what
    accepting changes, and the grants an approval gives (gate, grant, whether it may be left out)."""

    accept: bool
    refuse: bool
    why: str
    status: str | None = None
    repeat: bool = False
    """The same person's same decision again: answered 200 with the request as it stands,
    nothing recorded (the callback contract)."""
    approved: dict[str, Any] | None = None
    grants: list[tuple[str, Offer, bool]] = field(default_factory=list)
    apply: Callable[[], None] = lambda: None
    on_refusal: Callable[[], None] = lambda: None


def refused(why: str, on_refusal: Callable[[], None] = lambda: None) -> Outcome:
    return Outcome(accept=False, refuse=True, why=why, on_refusal=on_refusal)


def _repeats(r: Request, key: str, verdict: str, choice: Offer | None, gates: set[str] | None = None) -> bool:
    """Whether ``key``'s votes on ``r`` (on ``gates``, else every gate) are all ``verdict``
    with ``choice``: a vote like them again is a repeat."""
    mine = [
        votes[key] for name, votes in r.votes.items() if key in votes and (gates is None or name in gates)
    ]
    return bool(mine) and all(v == (verdict, choice) for v in mine)


class Model:
    """Requests, votes, grants and executions, and the answers they give (DESIGN.md)."""

    def __init__(self) -> None:
        self.policy = Policy()
        self.requests: dict[str, Request] = {}
        self.grants: dict[str, ModelGrant] = {}
        self.read_only = False
        self.skew = timedelta()
        """How far time was moved on (the server's stored times were moved back as far)."""

    def now(self) -> datetime:
        return datetime.now(UTC) + self.skew

    def holding(self, key: str | None) -> Request | None:
        """The request the agent's idempotency key ``key`` holds."""
        return next((r for r in self.requests.values() if key is not None and r.call.key == key), None)

    def answer(self, call: Call) -> Expected:
        """The answers DESIGN.md allows for ``call`` now."""
        answer = self._gates_answer(call)
        if self.read_only and TOOLS[call.tool] is not None:
            # Every hook is evaluated: the read-only guard's deny stands whatever the gates say.
            decisions = {"deny", "pending"} & answer.decisions | {"deny"}
            return replace(answer, decisions=frozenset(decisions), why=answer.why + "; read-only is on")
        return answer

    def _gates_answer(self, call: Call) -> Expected:
        now = self.now()
        gates = [g for g in self.policy.gates if g.catches(call.tool, call.arguments)]
        own = self.holding(call.key)
        if not gates:
            if own is not None:
                return expect(
                    "allow", "deny", why="no gate catches the call; its key holds a request", modified=ANY
                )
            return expect("allow", why="no gate catches the call", modified=ANY)
        granted = {g.name for g in gates if any(x.covers(g, call, now) for x in self.grants.values())}
        asking = tuple(g.name for g in gates if g.name not in granted)
        if own is None:
            if not asking:
                return expect("allow", why=f"grants cover every gate ({', '.join(sorted(granted))})")
            return expect("pending", why=f"a new request asks {', '.join(asking)}", asks=asking)
        if not own.call.same_call(call) or not (
            own.call.user == call.user or same_person(own.call.user, call.user)
        ):
            # Never an approval of one call for another, nor for another person's.
            if not asking:
                return expect(
                    "allow", "deny", why=f"key of request {own.id} holds another call; grants cover it"
                )
            return expect("deny", why=f"key of request {own.id} holds another call (or another person's)")
        asked = {g.name for g in own.asks}
        if own.status == PENDING:
            if not asking:
                return expect(
                    "allow",
                    "pending",
                    why=f"grants cover every gate; request {own.id} is pending",
                    request=own.id,
                )
            if now >= own.expires_at:
                return expect("pending", "deny", why=f"request {own.id} is past its deadline", request=own.id)
            if set(asking) <= asked:
                return expect("pending", why=f"request {own.id} is pending", request=own.id)
            return expect("pending", "deny", why=f"request {own.id} does not ask {asking}", request=own.id)
        # Decided: the key's own request answers, before any grant.
        if own.status != APPROVED:
            return expect("deny", why=f"request {own.id} is {own.status}")
        if own.executed:
            return expect("deny", why=f"the approval of request {own.id} was used")
        if now >= own.valid_until:
            return expect("deny", why=f"the approval of request {own.id} lapsed")
        runs = own.approved if own.approved is not None else call.arguments
        needed = {
            g.name
            for g in self.policy.gates
            if g.catches(call.tool, call.arguments) or g.catches(call.tool, runs)
        }
        unasked = needed - asked
        modified = own.approved
        if unasked and unasked <= granted:
            return expect(
                "allow", "deny", why=f"request {own.id} approved; grants cover {unasked}", modified=modified
            )
        if unasked:
            return expect("deny", why=f"request {own.id} never asked {', '.join(sorted(unasked))}")
        return expect("allow", why=f"request {own.id} is approved", modified=modified)

    def vote(
        self,
        request: Request,
        operator: str,
        verdict: str,
        choice: Offer | None,
        edit: dict[str, Any] | None,
    ) -> Outcome:
        """What DESIGN.md makes of ``operator``'s vote on ``request``."""
        r = request
        now = self.now()
        if choice is not None and choice not in r.offers:
            return refused("the request's gates do not offer that grant")
        key = person(operator) or f"web:{operator.strip().casefold()}"
        if r.status != PENDING:
            # The same decision: the same verdict and grant, and the changes it was approved with.
            asked = {
                n: canonical(v) for n, v in (edit or {}).items() if held(r.call.arguments, n) != canonical(v)
            }
            made = {
                n: canonical(v)
                for n, v in (r.approved or {}).items()
                if held(r.call.arguments, n) != canonical(v)
            }
            same_changes = asked == made if verdict == "approve" and r.status == APPROVED else not asked
            if r.status in (APPROVED, REJECTED) and same_changes and _repeats(r, key, verdict, choice):
                return Outcome(False, False, "the same decision again", status=r.status, repeat=True)
            return refused(f"the request is {r.status}")
        if now >= r.expires_at:
            return refused(
                "the request is past its deadline", on_refusal=lambda: setattr(r, "status", EXPIRED)
            )
        voter = person(operator)
        own_call = r.call.user is not None and same_person(operator, r.call.user)
        eligible = [g for g in r.asks if voter in g.approvers and not own_call]
        if not eligible:
            return refused(f"{operator!r} may not decide any gate of the request (own call: {own_call})")
        if verdict == "approve":
            # An approval counts only where the gate as configured now takes it too: a gate a
            # reload removed takes none (rejecting stays open to whoever was asked).
            now_configured = {g.name: g for g in self.policy.gates}
            eligible = [g for g in eligible if voter in getattr(now_configured.get(g.name), "approvers", ())]
            if not eligible:
                return refused(f"every gate {operator!r} may approve was removed by a reload")
        if choice is not None:
            if verdict != "approve":
                return refused("a grant comes with an approval")
            if not all(choice in g.offers for g in eligible):
                return refused("a gate the vote counts for does not offer that grant")
            if choice.scope == "session" and r.call.session is None:
                return refused("a session grant for a call with no session")
        changes = {
            name: value
            for name, value in (edit or {}).items()
            if held(r.call.arguments, name) != canonical(value)
        }
        lenient = []
        if changes:
            if verdict != "approve":
                return refused("changes come with an approval")
            if len(eligible) < len(r.asks) or any(g.quorum > 1 for g in r.asks):
                return refused("changes come only with an approval that decides the request alone")
            if any(name not in g.editable for g in r.asks for name in changes):
                return refused("a changed field is not editable")
            if choice is not None:
                lenient.append("an edit with a grant (the grant may be refused)")
            approved_call = {**r.call.arguments, **changes}
            asked = {g.name for g in r.asks}
            if any(g.catches(r.call.tool, approved_call) for g in self.policy.gates if g.name not in asked):
                lenient.append("the changed call reaches a gate not asked")
        assert key == (voter or f"web:{operator.strip().casefold()}")
        counted = [g for g in eligible if key not in r.votes.get(g.name, {})]
        if not counted:
            if _repeats(r, key, verdict, choice, {g.name for g in eligible}):
                return Outcome(False, False, "the same vote again", status=r.status, repeat=True)
            return refused(f"{operator!r} already voted otherwise")

        def votes() -> None:
            for g in counted:
                r.votes.setdefault(g.name, {})[key] = (verdict, choice)

        if verdict == "reject":

            def reject() -> None:
                votes()
                _decide(r, REJECTED, now)

            return Outcome(True, False, "a rejection rejects", status=REJECTED, apply=reject)
        after = {
            g.name: {**r.votes.get(g.name, {}), **({key: (verdict, choice)} if g in counted else {})}
            for g in r.asks
        }
        quorate = all(sum(v == "approve" for v, _ in after[g.name].values()) >= g.quorum for g in r.asks)
        if not quorate:
            return Outcome(True, bool(lenient), "approval recorded", status=PENDING, apply=votes)
        approved = {**r.call.arguments, **changes} if changes else None
        given: list[tuple[str, Offer, bool]] = []
        for g in r.asks:
            choices = [c for v, c in after[g.name].values() if v == "approve"]
            if choices and all(c is not None for c in choices):
                grant = meet([c for c in choices if c is not None])
                # An approval with changes carries a grant only if it holds each changed field.
                if not changes or set(changes) <= set(grant.same):
                    given.append((g.name, grant, bool(changes)))

        def approve() -> None:
            votes()
            _decide(r, APPROVED, now)
            r.approved = approved

        why = "approved" + (f" ({'; '.join(lenient)})" if lenient else "")
        return Outcome(
            True, bool(lenient), why, status=APPROVED, approved=approved, grants=given, apply=approve
        )

    def grant(self, request: Request, server: Mapping[str, Any], offer: Offer) -> None:
        """Keep the grant the server gave with ``request``'s approval."""
        assert request.decided_at is not None
        runs = request.approved if request.approved is not None else request.call.arguments
        gate = server["gate"]
        self.grants[server["id"]] = ModelGrant(
            id=server["id"],
            gate=gate,
            offer=offer,
            tool=request.call.tool,
            session=request.call.session if offer.scope == "session" else None,
            same={name: held(runs, name) for name in offer.same},
            grantors=tuple(voter for voter, (v, _) in request.votes[gate].items() if v == "approve"),
            expires_at=request.decided_at + timedelta(minutes=offer.minutes),
        )

    def report(self, call: Call) -> None:
        """The call was reported executed: its key's approval allows nothing more."""
        own = self.holding(call.key)
        if own is not None and own.status == APPROVED:
            own.executed = True


def _decide(r: Request, status: str, now: datetime) -> None:
    r.status, r.decided_at = status, now


# ---------------------------------------------------------------------------------------------
# The test.


class UnauthorisedAllow(AssertionError):
    """The server allowed a call the model would not."""


class AllowedDuringStall(AssertionError):
    """While the database was held: the server allowed a call the model would not, or with
    other arguments than approved."""


class NotAsApproved(AssertionError):
    """An allow whose ``modified_arguments`` are not the approved arguments."""


class UnauthorisedVote(AssertionError):
    """The server accepted a vote the model refuses."""


class ModelMismatch(AssertionError):
    """Any other disagreement (a fail-closed one: a deny or a pending the model does not give)."""


class Approval(NamedTuple):
    """How an approver approves: once or with a grant (by its place among those the request's
    gates offer), and with arguments changed or not."""

    grant: int | None = None
    edit: dict[str, Any] | None = None


APPROVALS = [
    Approval(),
    Approval(grant=0),
    Approval(grant=1),
    Approval(grant=2),
    Approval(edit={"amount": 40000}),
    Approval(grant=0, edit={"amount": 40000}),
    Approval(grant=1, edit={"amount": 40000}),
]
READ_ONLY = st.sampled_from([False, False, False, True])
"""Whether a call is made while an operator has the read-only switch on (now and then)."""
APPROVER = "an approver"
"""A vote's operator: the first approver of the request's first gate short of its quorum who
has not voted on it and did not make the call."""


def _next_approver(r: Request) -> str:
    for g in r.asks:
        votes = r.votes.get(g.name, {})
        if sum(v == "approve" for v, _ in votes.values()) < g.quorum:
            for a in g.approvers:
                if a not in votes and not same_person(a, r.call.user):
                    return a
    return "alice"


def mostly(values: list[Any]) -> st.SearchStrategy[Any]:
    """The first of ``values`` half the time, else any: calls meet each other's keys,
    approvals and grants often enough."""
    return st.just(values[0]) | st.sampled_from(values)


A_CALL: dict[str, st.SearchStrategy[Any]] = {
    "tool": mostly(list(TOOLS)),
    "arguments": mostly(ARGUMENTS),
    "session": mostly(SESSIONS),
    "keyed": st.sampled_from([True, True, False]),
    "user": mostly(USERS),
}


class Approvals(RuleBasedStateMachine):
    calls = Bundle("calls")

    def __init__(self, loop: asyncio.Runner, served: Served, url: str) -> None:
        super().__init__()
        self.loop, self.served, self.url = loop, served, url
        self.model = Model()
        self.keys = itertools.count(1)
        self.loop.run(served.reset(self.model.policy.config(), AGENT))

    @property
    def http(self) -> httpx.AsyncClient:
        return self.served.http

    # -- calls ---------------------------------------------------------------------------------

    @initialize(target=calls, **A_CALL)
    def first_call(
        self, tool: str, arguments: dict[str, Any], session: str | None, keyed: bool, user: str | None
    ) -> Call:
        return self.call(tool, arguments, session, keyed, user)

    @rule(target=calls, **A_CALL)
    def call(
        self, tool: str, arguments: dict[str, Any], session: str | None, keyed: bool, user: str | None
    ) -> Call:
        """A new call (under a new key, or none)."""
        made = Call(tool, arguments, session, f"k{next(self.keys)}" if keyed else None, user)
        self._ask(made)
        return made

    @rule(
        call=calls,
        change=st.none() | st.sampled_from(["tool", "arguments", "session", "user"]),
        pick=st.integers(0, 7),
        read_only=READ_ONLY,
    )
    def replay(self, call: Call, change: str | None, pick: int, read_only: bool) -> None:
        """The same key again: the same call, or one with its ``change`` field set to the
        ``pick``-th value there is for it; perhaps while the read-only switch is on."""
        self._ask(_changed(call, change, pick), read_only=read_only)

    @rule(
        target=calls,
        call=calls,
        fresh_key=st.booleans(),
        table=st.sampled_from(["confirmation_request", "approval_grant"]),
        read_only=READ_ONLY,
    )
    def stalled(self, call: Call, fresh_key: bool, table: str, read_only: bool) -> Call:
        """A call made earlier, again (under its key, or a new one), while another connection
        holds the database (on PostgreSQL: ``table``) longer than a hook may take."""
        made = replace(call, key=f"k{next(self.keys)}") if fresh_key else call
        self._ask(made, stall=table, read_only=read_only)
        return made

    def _ask(self, call: Call, stall: str | None = None, *, read_only: bool = False) -> None:
        if not read_only:
            self._check(call, stall)
            return
        self._switch(on=True)
        try:
            self._check(call, stall)
        finally:
            self._switch(on=False)

    def _check(self, call: Call, stall: str | None) -> None:
        """Make ``call`` (under a stall on ``stall``) and check the answer against the model's."""
        expected = self.model.answer(call)
        response = self.loop.run(self._post(call, stall))
        stalled = stall is not None
        said = f"{call}{' under a stall' if stalled else ''}: {response.status_code} {response.text}"
        if response.status_code == 503 and stalled:
            self.loop.run(self._discover(call))
            return
        if response.status_code != 200:
            raise ModelMismatch(f"{said}; the model: {expected}")
        answer = response.json()
        decision = answer["decision"]
        if decision == "allow" and "allow" not in expected.decisions:
            kind = AllowedDuringStall if stalled else UnauthorisedAllow
            raise kind(
                f"{said}; the model allows no such call: {expected.why} ({sorted(expected.decisions)})"
            )
        if (
            decision == "allow"
            and expected.modified is not ANY
            and answer["modified_arguments"] != expected.modified
        ):
            kind = AllowedDuringStall if stalled else NotAsApproved
            raise kind(
                f"{said}; the approved call runs with modified_arguments {expected.modified} ({expected.why})"
            )
        if decision not in expected.decisions | ({"deny"} if stalled else set()):
            raise ModelMismatch(f"{said}; the model: {expected}")
        if decision == "pending":
            if expected.request is not None and "pending" in expected.decisions:
                if answer["request_id"] != expected.request:
                    raise ModelMismatch(f"{said}; the model: request {expected.request} answers")
            else:
                self._made(call, answer["request"])
        if stalled or (decision != "pending" and "pending" in expected.decisions):
            # A request may have been written all the same (a late write, a deny after it).
            self.loop.run(self._discover(call))

    def _made(self, call: Call, shown: Mapping[str, Any]) -> None:
        """Keep the new request the server answered ``call`` with."""
        if shown["id"] in self.model.requests or self.model.holding(call.key) is not None:
            raise ModelMismatch(f"{call}: pending on request {shown['id']}, while its key holds one already")
        names = [g["name"] for g in shown["gates"]]
        expected = self.model.answer(call)
        if "pending" in expected.decisions and expected.request is None and tuple(names) != expected.asks:
            raise ModelMismatch(
                f"{call}: request {shown['id']} asks {names}, the model {list(expected.asks)}"
            )
        gates = {g.name: g for g in self.model.policy.gates}
        self.model.requests[shown["id"]] = Request(
            shown["id"], call, tuple(gates[n] for n in names), self.model.now()
        )

    async def _post(self, call: Call, stall: str | None) -> httpx.Response:
        if stall is None:
            return await self.http.post(PRE, json=call.body(), headers=self.served.agent_headers)
        registry = self.served.runtime.registries[AGENT]
        limit = registry.timeout
        registry.timeout = STALL_LIMIT
        try:
            async with Stall(self.url, STALL_HELD, stall, early=True):
                answer = await self.http.post(PRE, json=call.body(), headers=self.served.agent_headers)
        finally:
            registry.timeout = limit
        return answer

    async def _discover(self, call: Call) -> None:
        """Keep a request the server wrote for ``call`` without answering with it."""
        current = asyncio.current_task()
        for _ in range(200):  # whatever the server left running (a write that outlived its hook)
            if not [t for t in asyncio.all_tasks() if t is not current]:
                break
            await asyncio.sleep(0.01)
        listed = (
            await self.http.get("/v1/admin/requests", params={"agent": AGENT, "limit": 500}, headers=ADMIN)
        ).json()
        new = [shown for shown in listed if shown["id"] not in self.model.requests]
        if len(new) > 1:
            raise ModelMismatch(f"{call} wrote {len(new)} requests")
        if new:
            self._made(call, new[0])

    # -- decisions -------------------------------------------------------------------------------

    @precondition(lambda self: self.model.requests)
    @rule(how=st.sampled_from(APPROVALS))
    def approve(self, how: Approval) -> None:
        """Whoever may decide next approves the latest pending request ``how``."""
        self.vote(0, APPROVER, "approve", how.grant, how.edit)

    @precondition(lambda self: self.model.requests)
    @rule(
        request=st.integers(0, 5),
        operator=st.sampled_from(OPERATORS),
        verdict=st.sampled_from(["approve", "reject"]),
        grant=st.sampled_from(GRANT_PICKS),
        arguments=st.sampled_from(EDIT_PICKS),
    )
    def vote(
        self,
        request: int,
        operator: str,
        verdict: str,
        grant: Offer | int | None,
        arguments: dict[str, Any] | None,
    ) -> None:
        """``operator`` (:data:`APPROVER`: whoever may decide next) decides one of the requests
        (0: the latest pending one) through the operator API, with ``grant`` (a number: that
        one of the grants the request's gates offer) and with ``arguments`` changed."""
        r = _latest(sorted(self.model.requests.values(), key=lambda r: r.status == PENDING), request)
        if operator == APPROVER:
            operator = _next_approver(r)
        if isinstance(grant, int):
            offers = sorted(r.offers)
            grant = offers[grant % len(offers)] if offers else None
        outcome = self.model.vote(r, operator, verdict, grant, arguments)
        body: dict[str, Any] = {"verdict": verdict, "operator": operator, "reason": "checked"}
        if grant is not None:
            body["grant"] = grant.body()
        if arguments is not None:
            body["arguments"] = arguments
        response = self.loop.run(
            self.http.post(f"/v1/admin/requests/{r.id}/decision", json=body, headers=ADMIN)
        )
        said = f"{operator!r} votes {body} on {r.id} ({r.call}): {response.status_code} {response.text}"
        if response.status_code in (409, 410, 422):
            if not outcome.refuse:
                raise ModelMismatch(f"{said}; the model accepts the vote: {outcome.why}")
            outcome.on_refusal()
            return
        if response.status_code != 200:
            raise ModelMismatch(said)
        if outcome.repeat:
            if response.json()["status"] != outcome.status:
                raise ModelMismatch(f"{said}; the model: a repeat of a {outcome.status} request")
            return
        if not outcome.accept:
            raise UnauthorisedVote(f"{said}; the model refuses it: {outcome.why}")
        outcome.apply()
        shown = response.json()
        if shown["status"] != outcome.status or (
            outcome.status == APPROVED and shown["approved_arguments"] != outcome.approved
        ):
            raise ModelMismatch(f"{said}; the model: {outcome.status}, approved arguments {outcome.approved}")
        if outcome.grants:
            self._grants(r, outcome)

    def _grants(self, r: Request, outcome: Outcome) -> None:
        listed = self.loop.run(
            self.http.get("/v1/admin/grants", params={"agent": AGENT}, headers=ADMIN)
        ).json()
        given = {g["gate"]: g for g in listed if g["request_id"] == r.id}
        for gate, offer, optional in outcome.grants:
            shown = given.get(gate)
            if shown is None:
                if not optional:
                    raise ModelMismatch(f"approving {r.id} gave no grant on {gate}; the model: {offer}")
                continue
            if (shown["scope"], sorted(shown["same"])) != (offer.scope, list(offer.same)):
                raise ModelMismatch(f"approving {r.id} gave {shown}; the model: {offer}")
            self.model.grant(r, shown, offer)
        # A grant the model does not give stays unknown to it: the calls it lets through fail.

    @precondition(lambda self: any(r.status == APPROVED for r in self.model.requests.values()))
    @rule(call=calls)
    def report(self, call: Call) -> None:
        """The agent reports the call executed (post-tool-use with its key)."""
        body = {**call.body(), "result": "done"}
        response = self.loop.run(self.http.post(POST, json=body, headers=self.served.agent_headers))
        if response.status_code != 200:
            raise ModelMismatch(f"reporting {call}: {response.status_code} {response.text}")
        self.model.report(call)

    @precondition(lambda self: self.model.requests)
    @rule(grant=st.booleans(), which=st.integers(0, 5))
    def withdraw(self, grant: bool, which: int) -> None:
        """The agent cancels one of its requests, or (``grant``) an operator revokes a grant
        (0: the latest)."""
        if grant and self.model.grants:
            g = _latest(list(self.model.grants.values()), which)
            response = self.loop.run(
                self.http.delete(f"/v1/admin/grants/{g.id}", params={"operator": "alice"}, headers=ADMIN)
            )
            if response.status_code != (409 if g.revoked else 200):
                raise ModelMismatch(
                    f"revoking {g.id} (revoked: {g.revoked}): {response.status_code} {response.text}"
                )
            g.revoked = True
            return
        r = _latest(list(self.model.requests.values()), which)
        response = self.loop.run(
            self.http.post(f"/v1/requests/{r.id}/cancel", headers=self.served.agent_headers)
        )
        if response.status_code != (200 if r.status == PENDING else 409):
            raise ModelMismatch(f"cancelling {r.id} ({r.status}): {response.status_code} {response.text}")
        if r.status == PENDING:
            r.status = CANCELLED

    # -- the world changing ----------------------------------------------------------------------

    @rule(security=st.booleans(), loose=st.booleans(), wire_quorum=st.sampled_from([2, 1]))
    def reload(self, security: bool, loose: bool, wire_quorum: int) -> None:
        """An operator reloads the configuration: gates added, removed, loosened."""
        policy = Policy(security, loose, wire_quorum)
        self.loop.run(self.served.reload(policy.config()))
        self.model.policy = policy

    def _switch(self, *, on: bool) -> None:
        body = {"on": on, "operator": "alice"}
        response = self.loop.run(self.http.put("/v1/admin/switches/read_only", json=body, headers=ADMIN))
        assert response.status_code == 200, response.text
        self.model.read_only = on

    @precondition(lambda self: self.model.requests)
    @rule(minutes=st.sampled_from([3, 12, 25, 45]))
    def time_passes(self, minutes: int) -> None:
        """Every stored time moves back ``minutes``: to the server, that much time has passed.
        (Every duration is whole minutes, so no deadline falls within a step.)"""
        self.loop.run(self._shift(timedelta(minutes=minutes)))
        self.model.skew += timedelta(minutes=minutes)

    async def _shift(self, by: timedelta) -> None:
        async with transaction(self.served.runtime.sessions) as session:
            for table, columns in SHIFTED:
                t: sa.Table = table.__table__  # type: ignore[attr-defined]
                rows = (await session.exec(sa.select(t.c.id, *(t.c[c] for c in columns)))).all()  # type: ignore[call-overload]
                for row in rows:
                    moved = {c: v - by for c, v in zip(columns, row[1:], strict=True) if v is not None}
                    if moved:
                        await session.exec(sa.update(t).where(t.c.id == row[0]).values(**moved))


SHIFTED = [
    (ConfirmationRequest, ("created_at", "expires_at", "decided_at", "executed_at")),
    (Grant, ("created_at", "expires_at", "revoked_at", "last_used_at")),
    (Vote, ("created_at",)),
]
"""The stored times a deadline, a lapse or an expiry is computed from."""


def _latest(items: list[Any], index: int) -> Any:
    """The ``index``-th item counting from the latest (wrapping round)."""
    return items[-1 - index % len(items)]


_VALUES: dict[str, list[Any]] = {
    "tool": list(TOOLS),
    "arguments": ARGUMENTS,
    "session": SESSIONS,
    "user": USERS,
}


def _changed(call: Call, change: str | None, pick: int) -> Call:
    if change is None:
        return call
    values = _VALUES[change]
    return replace(call, **{change: values[pick % len(values)]})


MODEL_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.postgres
def test_the_server_allows_only_what_the_model_allows(db_url: str, tmp_path: Path) -> None:
    """Every step sequence runs on one server (in process), emptied in between."""
    with asyncio.Runner() as loop:
        stack = AsyncExitStack()
        served = loop.run(
            stack.enter_async_context(serving(db_url, tmp_path / "signoff.yaml", Policy().config(), AGENT))
        )
        try:
            run_state_machine_as_test(lambda: Approvals(loop, served, db_url), settings=MODEL_SETTINGS)
        finally:
            loop.run(stack.aclose())


@pytest.mark.parametrize(
    ("arguments", "other", "same"),
    [
        ({"to": "acme", "amount": 1}, {"amount": 1, "to": "acme"}, True),
        ({"to": {"a": 1, "b": 2}}, {"to": {"b": 2, "a": 1}}, True),
        ({"to": 1}, {"to": 1.0}, False),
        ({"to": "1"}, {"to": 1}, False),
    ],
)
def test_the_model_compares_arguments_as_canonical_json(
    arguments: dict[str, Any], other: dict[str, Any], same: bool
) -> None:
    assert Call("pay_invoice", arguments).same_call(Call("pay_invoice", other)) is same
