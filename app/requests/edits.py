"""Approving with changes: what an approver may change in a call, and the call as approved.

A gate may name ``editable`` argument fields; its approver may give them other values and
approve (a chat form, the console, the operator API, the command line). An edit is accepted
only when every one of these holds, else it is refused and nothing changes:

- the values are plain JSON within the limits of :func:`signoff.channels.edit_problem`;
- the approval decides the request alone: every gate the request needs counts this vote and
  has a quorum of one (configuration refuses ``editable`` beside a larger quorum);
- every gate of the request lists each changed field as ``editable``;
- no changed field is redacted: not under a key holding a redact word, not a value shown
  redacted, and the new value is no secret (what is approved is stored and shown as given);
- no grant is given with the approval: changed arguments are approved once (a grant's
  ``same`` fields hold the proposed values, so it could let the call run as proposed);
- the changed call is reached by no gate of the agent that was not asked: every gate is
  evaluated again on the changed arguments, and a condition that reads a redacted field (of
  the arguments or the metadata), or cannot be evaluated, counts as reaching it (fail closed).

A field given its proposed value is no change; an edit that changes nothing is an approval
as asked. The request keeps the call as approved (``approved_arguments``); the agent is
answered ``allow`` with ``modified_arguments``, its call's own arguments with the changes,
unless the call as approved, in the context it is replayed in (its user and metadata), is
caught by a gate that was not asked (:func:`replay_refusal`): then it is denied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig
from signoff.app.models import ConfirmationRequest
from signoff.app.redaction import REDACTED, redactor
from signoff.app.requests.canonical import canonical, same
from signoff.app.requests.eligibility import GateSnapshot, gates_of
from signoff.channels import ABSENT, ArgumentChange, GrantChoice, edit_problem
from signoff.hooks import HookContext

__all__ = [
    "approved_changes",
    "argument_changes",
    "changed_fields",
    "edit_refusal",
    "editable_fields",
    "executed_as_approved",
    "modified_arguments",
    "record_approved",
    "replay_refusal",
    "same_call",
]

_REQUESTS: sa.Table = ConfirmationRequest.__table__  # type: ignore[attr-defined]


def editable_fields(gates: Sequence[GateSnapshot]) -> tuple[str, ...]:
    """The fields an approval of every one of ``gates`` may change: those each of them lists."""
    if not gates:
        return ()
    return tuple(name for name in gates[0].editable if all(name in g.editable for g in gates[1:]))


def changed_fields(proposed: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``given`` whose value is not the proposed one (type counts: ``1`` is not ``"1"``)."""
    return {
        name: value
        for name, value in given.items()
        if name not in proposed or not same(proposed[name], value)
    }


def _shows_redacted(value: Any) -> bool:
    return REDACTED in canonical(value)


def edit_refusal(
    req: ConfirmationRequest,
    gates: Sequence[GateSnapshot],
    eligible: Sequence[int],
    changes: Mapping[str, Any],
    config: SignoffConfig,
    *,
    grant: GrantChoice | None = None,
) -> str | None:
    """Why ``changes`` (the fields that change, see :func:`changed_fields`) cannot be approved
    by a vote counting for the gates ``eligible`` of ``gates``, or None (see the module)."""
    if (problem := edit_problem(changes)) is not None:
        return problem
    waiting = [g.name for i, g in enumerate(gates) if i not in eligible or g.quorum > 1]
    if waiting:
        return (
            "Changed arguments come only with an approval that decides the request alone; this one "
            f"also waits for {', '.join(repr(w) for w in waiting)}. Approve as asked, or reject."
        )
    for gate in gates:
        for name in changes:
            if name not in gate.editable:
                allowed = ", ".join(gate.editable) if gate.editable else "no arguments"
                return f"{name} cannot be changed: the gate {gate.name!r} lets its approver change {allowed}."
    secrets = redactor(config.redact_words(req.agent_id))
    for name, value in changes.items():
        if secrets.secret_key(name) or (name in req.arguments and _shows_redacted(req.arguments[name])):
            return f"{name} is redacted, so it cannot be changed."
        if not same(secrets.value(value), value):
            return f"The new value of {name} looks like a secret; secrets cannot be typed into an approval."
    if grant is not None and changes:
        # A grant's `same` fields hold the proposed values: it would let the call run as proposed.
        return (
            "Changed arguments are approved once: a grant cannot be given with them. Approve once "
            "with the changes, or give the grant without them."
        )
    return _escape(req, gates, changes, config)


def _escape(
    req: ConfirmationRequest, gates: Sequence[GateSnapshot], changes: Mapping[str, Any], config: SignoffConfig
) -> str | None:
    """Why the changed call would slip past a gate of the agent that was not asked, or None."""
    approved = {**req.arguments, **changes}
    hidden = {name for name, value in approved.items() if _shows_redacted(value)}
    hidden |= {name for name, value in req.request_metadata.items() if _shows_redacted(value)}
    call = HookContext(
        agent_id=req.agent_id,
        tool_name=req.tool_name,
        arguments=approved,
        user_id=req.user_id,
        session_id=req.session_id,
        tool_call_id=req.tool_call_id,
        metadata=dict(req.request_metadata),
    )
    key = _unasked_gate({g.key for g in gates}, call, config, hidden)
    if key is None:
        return None
    return (
        f"With these changes the call would also need the approval of the gate {key!r}, "
        "which was not asked; approve it as asked, or reject it."
    )


def replay_refusal(req: ConfirmationRequest, call: HookContext, config: SignoffConfig) -> str | None:
    """Why ``call`` (a replay of ``req``'s call with the approved arguments, in the context it
    is replayed in: its user and metadata may not be the request's) cannot run as approved,
    or None: a gate of the agent that was not asked catches it."""
    key = _unasked_gate({g.key for g in gates_of(req)}, call, config, set())
    if key is None:
        return None
    return (
        f"the call as approved in request {req.id} would also need the approval of the gate "
        f"{key!r}, which was not asked; send a new key to ask every gate again"
    )


def _unasked_gate(asked: set[str], call: HookContext, config: SignoffConfig, hidden: set[str]) -> str | None:
    """The key of the first gate of the agent outside ``asked`` that catches ``call``."""
    for key, gate in config.confirmation_gates(call.agent_id):
        if key not in asked and _reaches(gate, call, hidden):
            return key
    return None


def _reaches(gate: ConfirmationGate, call: HookContext, hidden: set[str]) -> bool:
    """Whether ``gate`` catches ``call``; a condition naming a redacted field of the arguments
    or the metadata catches it (the value it would read is not known here)."""
    try:
        if not gate.matches_tool(call.tool_name):
            return False
        if gate.when is not None and any(name in gate.when for name in hidden):
            return True
        return gate.matches(call)
    except Exception:
        return True


async def record_approved(
    session: AsyncSession, req: ConfirmationRequest, changes: Mapping[str, Any]
) -> None:
    """In the approving transaction: keep the call as approved with ``changes``."""
    approved = {**req.arguments, **changes}
    await session.exec(
        sa.update(_REQUESTS).where(_REQUESTS.c.id == req.id).values(approved_arguments=approved)
    )
    set_committed_value(req, "approved_arguments", approved)


def approved_changes(req: ConfirmationRequest) -> dict[str, Any]:
    """The fields the approver changed, with their approved values (empty: approved as asked)."""
    if req.approved_arguments is None:
        return {}
    return changed_fields(req.arguments, req.approved_arguments)


def argument_changes(req: ConfirmationRequest) -> tuple[ArgumentChange, ...]:
    """The changes as cards and pages show them: each field, proposed → approved."""
    return tuple(
        ArgumentChange(name, req.arguments.get(name, ABSENT), value)
        for name, value in approved_changes(req).items()
    )


def modified_arguments(req: ConfirmationRequest, arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """The arguments the agent runs the approved call with: its own ``arguments`` with the
    approver's changes (None: approved as asked)."""
    changes = approved_changes(req)
    return {**arguments, **changes} if changes else None


def executed_as_approved(req: ConfirmationRequest, executed: Mapping[str, Any]) -> bool:
    """Whether a call reported executed with ``executed`` (redacted) is the approved call."""
    return same_call(req.arguments, req.approved_arguments, executed)


def same_call(
    arguments: Mapping[str, Any], approved_arguments: Mapping[str, Any] | None, executed: Mapping[str, Any]
) -> bool:
    """Whether ``executed`` (redacted) are the arguments a request (its ``arguments`` and
    ``approved_arguments``) approved."""
    return same(approved_arguments if approved_arguments is not None else arguments, executed)
