"""The decision kernel: what a gated call is answered.

:func:`decide` is one pure function (no I/O, no clock of its own, nothing of HTTP): given the
call, the confirmation gates that match it under the configuration in force and a
:class:`Snapshot` of what the database holds for it, it returns an :class:`Answer`. Everything
else (the gate service, the route, replays, the MCP proxy's server side) gathers the snapshot
in one unit of work and applies the answer.

The order of answers:

1. **The call's own request first.** A request that holds the call's idempotency key answers
   it: a different call or another user under the key → deny; pending → pending; rejected,
   expired or cancelled → deny; approved → allow, with the approver's changes as
   ``modified_arguments``, unless the approval was used (reported executed) or lapsed → deny.
   Every matching gate must have been asked by it, or be covered by a grant now; a gate that
   was not asked, or that would catch the call as approved with changes, denies. Grants never
   answer for a gate the request asked.
2. **Grants** answer only a call without a request of its own: every matching gate covered
   by an active grant → allow (each use is counted as the answer is applied, against the
   grant's row).
3. **Otherwise a new request** asks every matching gate no grant covers: pending.

A deny from anywhere is final: the gate service answers deny for the whole call when any hook
denies, times out or fails, and never replaces that answer with a late one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig, identity_key
from signoff.app.models import ConfirmationRequest, Grant
from signoff.app.requests import edits, grants
from signoff.app.requests.canonical import call_digest
from signoff.app.requests.eligibility import gates_of
from signoff.app.requests.single_use import spent
from signoff.app.requests.states import decision_for
from signoff.hooks import Decision, HookContext

__all__ = ["Answer", "KeyedGate", "Snapshot", "decide", "idempotency_key", "same_user"]

KeyedGate = tuple[str, ConfirmationGate]
"""A gate of the agent with the key requests record it by."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the database holds for one call, read in one unit of work."""

    now: datetime
    request: ConfirmationRequest | None = None
    """The request holding the call's idempotency key, if one does (and was looked up)."""
    grants: Mapping[str, Grant] = field(default_factory=dict)
    """The active grant covering the call for each matching gate that has one, by gate key."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The kernel's answer, and what it rests on."""

    decision: Decision
    reason: str | None = None
    request: ConfirmationRequest | None = None
    """The request the answer rests on (none yet when ``ask`` names gates)."""
    ask: tuple[str, ...] = ()
    """Pending without a request: the keys of the gates a new request must ask."""
    grants: Mapping[str, Grant] = field(default_factory=dict)
    """The grants an allow rests on, by gate key (each use still to be counted)."""
    modified_arguments: Mapping[str, object] | None = None
    """Approved with changes: the arguments the call runs with."""
    gates: tuple[str, ...] = ()
    """The keys of every gate that matched the call."""
    config_version: str = ""
    """The version of the configuration the gates were matched under."""

    @property
    def request_id(self) -> str | None:
        return self.request.id if self.request is not None else None


def idempotency_key(call: HookContext) -> str | None:
    """The key a call's request is held under: its own, else its session and tool call ids."""
    if call.idempotency_key:
        return call.idempotency_key
    if call.session_id and call.tool_call_id:
        return f"{call.session_id}:{call.tool_call_id}"
    return None


def decide(
    call: HookContext, gates: Sequence[KeyedGate], snapshot: Snapshot, config: SignoffConfig
) -> Answer:
    """The answer for ``call``, matched by ``gates`` (at least one), over ``snapshot``."""
    keys = tuple(key for key, _ in gates)
    if snapshot.request is not None:
        answer = _from_request(call, gates, snapshot.request, snapshot, config)
    elif all(key in snapshot.grants for key in keys):
        granted = {key: snapshot.grants[key] for key in keys}
        answer = Answer(
            Decision.ALLOW, "; ".join(grants.describe(g) for g in granted.values()), grants=granted
        )
    else:
        # A grant stands in for its own gate only: the request asks every other gate.
        answer = Answer(Decision.PENDING, ask=tuple(key for key in keys if key not in snapshot.grants))
    return replace(answer, gates=keys, config_version=config.version)


def _from_request(
    call: HookContext,
    gates: Sequence[KeyedGate],
    req: ConfirmationRequest,
    snapshot: Snapshot,
    config: SignoffConfig,
) -> Answer:
    """The answer from the request holding the call's idempotency key (see the module)."""

    def deny(reason: str) -> Answer:
        return Answer(Decision.DENY, reason, request=req)

    if req.call_digest != call_digest(call.tool_name, call.arguments):
        # Never let an approval for one call stand in for another.
        return Answer(
            Decision.DENY,
            f"idempotency key {req.idempotency_key!r} was already used for a different call "
            f"(request {req.id}); send a new key for a new call",
        )
    if not same_user(req.user_id, call.user_id, config):
        # Its approvers decided a call made on someone else's behalf (and may not approve one
        # made on their own).
        return deny(
            f"idempotency key {req.idempotency_key!r} was already used for a call on behalf of "
            f"another user (request {req.id}); send a new key for a new call"
        )
    asked = {g.key for g in gates_of(req)}
    answer = decision_for(req)
    if answer.decision is Decision.DENY:
        return deny(answer.reason or f"request {req.id} was not approved")
    unasked = [key for key, _ in gates if key not in asked]
    # A gate the request did not ask: a grant standing in for it now, or a deny (the
    # configuration changed since, or the grant that stood in for it has ended).
    uncovered = [key for key in unasked if key not in snapshot.grants]
    if uncovered:
        return deny(
            f"gate {uncovered[0]!r} was not asked in request {req.id} under idempotency key "
            f"{req.idempotency_key!r}; send a new key to ask every gate again"
        )
    if answer.decision is Decision.PENDING:
        return Answer(Decision.PENDING, answer.reason, request=req)
    if (why := spent(req, snapshot.now)) is not None:
        return deny(why)
    granted = {key: snapshot.grants[key] for key in unasked}
    modified = edits.modified_arguments(req, call.arguments)
    if modified is not None:
        # Earlier gates of the chain saw the call as proposed: every gate the request did not
        # ask is asked of the call as approved, in this call's context.
        if (why := edits.replay_refusal(req, call.with_arguments(modified), config)) is not None:
            return deny(why)
    reasons = [answer.reason or "", *(grants.describe(g) for g in granted.values())]
    return Answer(
        Decision.ALLOW,
        "; ".join(r for r in reasons if r),
        request=req,
        grants=granted,
        modified_arguments=modified,
    )


def same_user(recorded: str | None, given: str | None, config: SignoffConfig) -> bool:
    """Whether ``given`` (a replay's ``user_id``) names whoever ``recorded`` (the request's) did:
    the same id in any spelling, or two ids of one person of the directory."""
    if identity_key(recorded or "") == identity_key(given or ""):
        return True
    person = config.recognise(recorded)
    return person is not None and person == config.recognise(given)
