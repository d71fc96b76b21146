"""Pydantic AI: gate tool calls through Signoff as deferred tool approvals.

```python
from signoff.hooks.adapters.pydantic_ai import SignoffApprovals
from signoff.hooks.client import AsyncGateClient

agent = Agent(model, capabilities=[SignoffApprovals(AsyncGateClient(), tools=["pay_invoice"])])
```

Each covered call is deferred (``ApprovalRequired``) in ``before_tool_execute``, then
resolved inline in ``handle_deferred_tool_calls`` — the path Pydantic AI recommends,
with ``DeferredToolRequestsEvent`` / ``DeferredToolResultsEvent`` and ``answered_by``.
Calls deferred in the same step are asked concurrently. An allow becomes
``ToolApproved`` (with the approved arguments); anything else — a denial, the deadline,
Signoff unreachable, an error — becomes ``ToolDenied``, so the model sees the reason as
the tool's answer and the tool body never runs.

Signoff is asked about the arguments the tool would run with: the model's, *validated*
by the tool's schema (defaults filled in, ``"true"`` made ``True``, ``"5000"`` made
``5000``), not the model's text — a gate on ``args.force == true`` or
``has(args.amount) && args.amount >= 50000`` sees the call the tool would make.

The approved call passes ``before_tool_execute`` again with ``ctx.tool_call_approved``;
it runs only if *this* capability approved it, with the arguments approved (validated
again, they must come out as approved, else it is skipped). A call approved by something
else (an earlier capability, or the application's ``deferred_tool_results``) is checked
with Signoff inline and skipped with the denial as its result if Signoff does not allow it.

Once a covered call has run (``after_tool_execute``, or ``on_tool_execute_error`` when
the tool raised), it is reported to Signoff under the same idempotency key with the
arguments it ran with, which uses up its approval.

The idempotency key is ``pydantic-ai:<conversation_id or run_id>:<tool_call_id>``.
Requires the ``pydantic-ai`` extra: ``pip install '<signoff checkout>/hooks[pydantic-ai]'``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

try:
    from pydantic_ai import (
        ApprovalRequired,
        DeferredToolRequests,
        DeferredToolResults,
        RunContext,
        SkipToolExecution,
        ToolApproved,
        ToolDefinition,
        ToolDenied,
    )
    from pydantic_ai.capabilities import AbstractCapability, ValidatedToolArgs
    from pydantic_ai.messages import ToolCallPart
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from signoff.hooks._install import install_hint

    raise ImportError(
        f"signoff.hooks.adapters.pydantic_ai needs Pydantic AI: {install_hint('pydantic-ai')}"
    ) from exc

from signoff.hooks._gate import canonical_json, describe_changes, json_safe
from signoff.hooks.client import AsyncGateClient, GateClient, GateDecision, GateFailure, make_idempotency_key

__all__ = ["RUNTIME", "SignoffApprovals"]

RUNTIME = "pydantic-ai"
_MARK = "signoff"


def _denial(decision: GateDecision) -> str:
    if decision.failure is not None:
        return f"The tool call was not run: Signoff could not confirm it ({decision.reason})."
    return f"The tool call was denied: {decision.reason or 'denied by Signoff'}."


def _answered_by(decision: GateDecision) -> str:
    by = (decision.request or {}).get("decided_by")
    name = by.get("name") if isinstance(by, dict) else None
    return name if isinstance(name, str) and name else "signoff"


@dataclass
class SignoffApprovals(AbstractCapability[Any]):
    """A capability that asks Signoff before covered tools run.

    Args:
        client: An :class:`AsyncGateClient` (a :class:`GateClient` also works; it
            waits in a worker thread).
        tools: Names of the tools to gate; ``None`` gates every tool.
        deadline: Seconds to wait per call; default the client's.
        user_id: Sent as the requester (approvers cannot approve their own calls).
    """

    client: AsyncGateClient | GateClient
    tools: Collection[str] | None = None
    deadline: float | None = None
    user_id: str | None = None

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live client: not loadable from a spec

    def covers(self, tool_name: str) -> bool:
        """Whether calls of ``tool_name`` go through Signoff."""
        return self.tools is None or tool_name in self.tools

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
    ) -> ValidatedToolArgs:
        """Defer covered calls until Signoff decides; let through only what it approved."""
        if not self.covers(call.tool_name):
            return args
        if not ctx.tool_call_approved:
            # Signoff is asked about the validated arguments, the ones the tool runs with.
            raise ApprovalRequired(metadata={_MARK: "ask", "arguments": json_safe(args)})
        metadata = ctx.tool_call_metadata
        if isinstance(metadata, dict) and metadata.get(_MARK) == "approved":
            # Approved by our handler: the model's arguments, validated as when asked, or the
            # changes an approver made (ToolApproved's override), validated: either way they
            # must come out as approved.
            approved = metadata.get("arguments")
            ran = json_safe(args)
            if approved is not None and canonical_json(ran) == canonical_json(approved):
                return args
            raise SkipToolExecution(
                f"The tool call was not run: its arguments, validated, are not the ones Signoff "
                f"approved ({describe_changes(approved or {}, ran or {})})."
            )
        decision = await self._ask(ctx, call, json_safe(args))
        if decision.allowed:
            return decision.arguments(args)
        raise SkipToolExecution(_denial(decision))

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Ask Signoff about every call this capability deferred, concurrently."""
        ours = [
            call
            for call in requests.approvals
            if (requests.metadata.get(call.tool_call_id) or {}).get(_MARK) == "ask"
        ]
        if not ours:
            return None
        asked = [requests.metadata[call.tool_call_id].get("arguments") for call in ours]
        decisions = await asyncio.gather(
            *(self._ask(ctx, call, arguments) for call, arguments in zip(ours, asked, strict=True))
        )
        approvals: dict[str, ToolApproved | ToolDenied] = {}
        metadata: dict[str, dict[str, Any]] = {}
        answered_by: dict[str, str] = {}
        for call, arguments, decision in zip(ours, asked, decisions, strict=True):
            cid = call.tool_call_id
            if decision.allowed and isinstance(arguments, dict):
                approved = decision.arguments(arguments)
                # Only changes are passed on: the model's arguments are validated once, as when
                # asked (validating the validated values again would apply a validator twice).
                changed = approved if decision.modified_arguments is not None else None
                approvals[cid] = ToolApproved(override_args=changed)
                metadata[cid] = {_MARK: "approved", "request_id": decision.request_id, "arguments": approved}
            else:
                approvals[cid] = ToolDenied(_denial(decision))
            answered_by[cid] = _answered_by(decision)
        return requests.build_results(approvals=approvals, metadata=metadata, answered_by=answered_by)

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        result: Any,
    ) -> Any:
        """Report a covered call that ran, with the arguments it ran with."""
        if self.covers(call.tool_name):
            await self._report(ctx, call, args, result, None)
        return result

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        error: Exception,
    ) -> Any:
        """Report a covered call whose tool raised (it ran), then let the error go on."""
        if self.covers(call.tool_name):
            await self._report(ctx, call, args, None, f"{type(error).__name__}: {error}")
        try:
            raise error
        finally:
            del error  # the traceback holds this frame; keep no cycle through ctx.deps

    def _call(self, ctx: RunContext[Any], call: ToolCallPart) -> dict[str, Any]:
        """What the ask and the report of one call both send."""
        session = ctx.conversation_id or ctx.run_id
        return {
            "session_id": session,
            "tool_call_id": call.tool_call_id,
            "user_id": self.user_id,
            "metadata": {"runtime": RUNTIME, "run_id": ctx.run_id},
            "idempotency_key": make_idempotency_key(RUNTIME, session, call.tool_call_id),
        }

    async def _ask(self, ctx: RunContext[Any], call: ToolCallPart, arguments: Any) -> GateDecision:
        """One Signoff decision about ``arguments``, the call's validated arguments as JSON (None:
        they could not be made JSON); never raises (errors deny)."""
        try:
            if not isinstance(arguments, dict):
                return GateDecision(
                    False,
                    f"the arguments of {call.tool_name} cannot be sent to Signoff as JSON",
                    failure=GateFailure.UNAVAILABLE,
                )
            options = {**self._call(ctx, call), "deadline": self.deadline}
            if isinstance(self.client, AsyncGateClient):
                return await self.client.pre_tool_use(call.tool_name, arguments, **options)
            ask = functools.partial(self.client.pre_tool_use, call.tool_name, arguments, **options)
            return await asyncio.to_thread(ask)
        except Exception as exc:
            return GateDecision(
                False, f"Signoff gate error ({type(exc).__name__}: {exc})", failure=GateFailure.UNAVAILABLE
            )

    async def _report(
        self, ctx: RunContext[Any], call: ToolCallPart, args: dict[str, Any], result: Any, error: str | None
    ) -> None:
        """Report an executed call; never raises (the call already ran)."""
        if isinstance(self.client, AsyncGateClient):
            await self.client.post_tool_use(
                call.tool_name, args, result, error=error, **self._call(ctx, call)
            )
        else:
            report = functools.partial(
                self.client.post_tool_use, call.tool_name, args, result, error=error, **self._call(ctx, call)
            )
            await asyncio.to_thread(report)
