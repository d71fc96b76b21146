"""OpenAI Agents SDK: a ``needs_approval`` policy and a resolver that decides through Signoff.

```python
from agents import Agent, function_tool
from signoff.hooks.adapters.openai_agents import SignoffApprovals
from signoff.hooks.client import AsyncGateClient

signoff = SignoffApprovals(AsyncGateClient(), session_id=conversation_id)

@function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
def pay_invoice(invoice_id: str, amount: int) -> str: ...

result = await signoff.run(agent, "pay the March invoices")  # resolves interruptions until done
```

``needs_approval(tool_name)`` submits the call to Signoff without waiting (so the
approvers get their card at once) and interrupts the run unless Signoff allows it
outright; any error interrupts too. ``resolve(result)`` asks Signoff about each
interruption of the run — waiting for a person — and calls ``state.approve(item)`` or
``state.reject(item, rejection_message=reason)``; ``run(...)`` repeats run → resolve →
run until no interruption is left. A rejected call's body never runs and the model
sees the reason as its output. The SDK cannot run an approved call with other
arguments, so a call Signoff approved only with changed arguments (``modified_arguments``)
is rejected with a reason that names the approved values (fail closed).

Signoff is asked about the arguments the tool runs with. The SDK validates a function
tool's arguments before running it (defaults of fields left out filled in, ``"true"`` made
``True``, ``"5000"`` made ``5000``) and interrupts such a call without asking
``needs_approval``; ``resolve`` then asks Signoff about the validated values (so a gate on
``args.force == true`` or ``has(args.amount) && args.amount >= 50000`` sees the call the
tool makes), and rejects a call whose validated arguments the SDK cannot show without
running the tool's own validators (fail closed).

Executed calls are reported to Signoff (under the same idempotency key, with the
arguments they ran with) by the run hooks ``hooks`` (``on_tool_end``), which ``run(...)``
passes to ``Runner.run``; pass ``hooks=signoff.hooks`` when you call ``Runner.run``
yourself. The report uses up the call's approval.

The idempotency key is ``openai-agents:<session_id>:<call_id>``; ``needs_approval`` and
``resolve`` use the same one, so the request created up front is the one waited on.
Pass a stable ``session_id`` (the conversation id) when a ``RunState`` may be resumed
in another process; the default is random per :class:`SignoffApprovals`.
Requires the ``openai-agents`` extra: ``pip install '<signoff checkout>/hooks[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any

try:
    from agents import (
        Agent,
        FunctionTool,
        RunContextWrapper,
        RunHooks,
        Runner,
        RunResult,
        RunResultStreaming,
        RunState,
        Tool,
    )
    from agents.items import ToolApprovalItem
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from signoff.hooks._install import install_hint

    raise ImportError(
        f"signoff.hooks.adapters.openai_agents needs the OpenAI Agents SDK: {install_hint('openai-agents')}"
    ) from exc

from signoff.hooks._gate import describe_changes, json_safe
from signoff.hooks.client import AsyncGateClient, GateClient, GateDecision, GateFailure

__all__ = ["RUNTIME", "NeedsApproval", "SignoffApprovals", "SignoffRunHooks", "run_arguments"]

RUNTIME = "openai-agents"

NeedsApproval = Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]
"""The ``needs_approval`` callable type of ``function_tool``."""


def _refused(reason: str) -> GateDecision:
    return GateDecision(False, reason, failure=GateFailure.UNAVAILABLE)


def _rejection(decision: GateDecision) -> str:
    if decision.failure is not None:
        return f"The tool call was not run: Signoff could not confirm it ({decision.reason})."
    return f"The tool call was denied: {decision.reason or 'denied by Signoff'}."


def run_arguments(tool: Tool | None, name: str, arguments: dict[str, Any]) -> dict[str, Any] | str:
    """The arguments the SDK runs ``tool``'s call with, as JSON: ``arguments`` (the model's)
    when it runs them as they are, else its validated values (defaults filled in, values
    converted); why not when the SDK cannot tell them without running the tool's own code.

    A tool that is not a function tool the SDK validates (a hosted tool, an MCP tool, a
    ``FunctionTool`` of the application's own) is given the model's arguments as they are.
    """
    if not isinstance(tool, FunctionTool):
        return arguments
    prepare = getattr(tool.on_invoke_tool, "prepare_arguments", None)
    prepared = prepare(json.dumps(arguments), name) if prepare is not None else None
    if prepare is None or prepared is None or prepared.unchanged:
        return arguments
    # The validated values by name: the parameters are the schema's properties, in order; the
    # SDK preparing them again must find them unchanged and the same, else the names are wrong.
    names = list(tool.params_json_schema.get("properties", {}))
    if len(prepared.args) <= len(names):
        validated = json_safe({**dict(zip(names, prepared.args, strict=False)), **prepared.kwargs})
        again = prepare(json.dumps(validated), name) if validated is not None else None
        if (
            validated is not None
            and again is not None
            and again.unchanged
            and (again.args, again.kwargs) == (prepared.args, prepared.kwargs)
        ):
            return validated
    return (
        f"the OpenAI Agents SDK cannot show the arguments {name} would run with (they do not "
        "validate against its parameters, or those run validators of the application's own); "
        "Signoff approves only a call it sees as it runs (give the tool plain-typed parameters)"
    )


class SignoffApprovals:
    """Route an OpenAI Agents run's tool approvals through Signoff.

    Args:
        client: An :class:`AsyncGateClient` (a :class:`GateClient` also works, in a thread).
        session_id: Middle part of the idempotency keys; default random per instance.
        tools: Resolve only interruptions of these tools (others stay pending); ``None``: all.
        deadline: Seconds to wait per call; default the client's.
        user_id: Sent as the requester (approvers cannot approve their own calls).
    """

    def __init__(
        self,
        client: AsyncGateClient | GateClient,
        *,
        session_id: str | None = None,
        tools: Collection[str] | None = None,
        deadline: float | None = None,
        user_id: str | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id or uuid.uuid4().hex
        self.tools = None if tools is None else frozenset(tools)
        self.deadline = deadline
        self.user_id = user_id
        self.asked_tools: set[str] = set()
        """Tools Signoff was asked about: their executed calls are reported."""
        self.hooks = SignoffRunHooks(self)
        """Run hooks that report executed calls; :meth:`run` passes them to ``Runner.run``."""

    def idempotency_key(self, call_id: str) -> str:
        """``openai-agents:<session_id>:<call_id>``."""
        return f"{RUNTIME}:{self.session_id}:{call_id}"

    def _call(self, call_id: str) -> dict[str, Any]:
        """What the ask and the report of one call both send."""
        return {
            "session_id": self.session_id,
            "tool_call_id": call_id,
            "user_id": self.user_id,
            "metadata": {"runtime": RUNTIME},
            "idempotency_key": self.idempotency_key(call_id),
        }

    async def _ask(
        self, tool_name: str, arguments: dict[str, Any], call_id: str, *, wait: bool
    ) -> GateDecision:
        self.asked_tools.add(tool_name)
        options = {**self._call(call_id), "deadline": self.deadline, "wait": wait}
        if isinstance(self.client, AsyncGateClient):
            return await self.client.pre_tool_use(tool_name, arguments, **options)
        ask = functools.partial(self.client.pre_tool_use, tool_name, arguments, **options)
        return await asyncio.to_thread(ask)

    async def report(self, context: ToolContext[Any], result: object, tool: Tool | None = None) -> None:
        """Report one executed call (``on_tool_end``): the arguments it ran with, its result."""
        try:
            arguments = json.loads(context.tool_arguments or "{}")
        except ValueError:
            arguments = {"raw": context.tool_arguments}
        if not isinstance(arguments, dict):
            arguments = {"raw": arguments}
        else:
            ran = run_arguments(tool, context.tool_name, arguments)
            arguments = ran if isinstance(ran, dict) else arguments
        call = self._call(context.tool_call_id)
        if isinstance(self.client, AsyncGateClient):
            await self.client.post_tool_use(context.tool_name, arguments, result, **call)
        else:
            send = functools.partial(self.client.post_tool_use, context.tool_name, arguments, result, **call)
            await asyncio.to_thread(send)

    def needs_approval(self, tool_name: str) -> NeedsApproval:
        """A ``function_tool(needs_approval=...)`` policy for ``tool_name``.

        Submits the call at once; returns ``False`` (run it) only when Signoff allows it
        without changes, ``True`` (interrupt, then :meth:`resolve`) otherwise.
        """

        async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            try:
                decision = await self._ask(tool_name, params, call_id, wait=False)
            except Exception:
                return True
            return not (decision.allowed and decision.modified_arguments is None)

        return needs_approval

    async def decide(self, item: ToolApprovalItem) -> GateDecision:
        """Signoff's decision on one interruption (waits for a person; never raises)."""
        try:
            raw = item.arguments or "{}"
            try:
                arguments = json.loads(raw)
            except ValueError:
                return _refused("its arguments are not valid JSON")
            if not isinstance(arguments, dict):
                return _refused("its arguments are not a JSON object")
            name = item.name or ""
            tools = getattr(item.agent, "tools", ())
            tool = next((t for t in tools if isinstance(t, FunctionTool) and t.name == name), None)
            ran = run_arguments(tool, name, arguments)
            if isinstance(ran, str):
                return _refused(ran)
            arguments = ran
            call_id = item.call_id or uuid.uuid4().hex
            decision = await self._ask(name, arguments, call_id, wait=True)
            approved = decision.modified_arguments
            if decision.allowed and approved not in (None, arguments):
                assert approved is not None
                return decision._replace(
                    allowed=False,
                    reason=(
                        f"Signoff approved {item.name} only with changed arguments "
                        f"({describe_changes(arguments, approved)}), and this runtime cannot run a "
                        "call with other arguments than it asked with; the call was not run"
                    ),
                )
            return decision
        except Exception as exc:
            return _refused(f"Signoff gate error ({type(exc).__name__}: {exc})")

    def covers(self, item: ToolApprovalItem) -> bool:
        """Whether this interruption is Signoff's to resolve."""
        return self.tools is None or item.name in self.tools

    async def resolve(self, result: RunResult | RunResultStreaming | RunState[Any]) -> RunState[Any]:
        """Approve or reject the run's interruptions through Signoff; return the state to resume."""
        state = result if isinstance(result, RunState) else result.to_state()
        items = [item for item in state.get_interruptions() if self.covers(item)]
        decisions = await asyncio.gather(*(self.decide(item) for item in items))
        for item, decision in zip(items, decisions, strict=True):
            if decision.allowed:
                state.approve(item)
            else:
                state.reject(item, rejection_message=_rejection(decision))
        return state

    async def run(
        self,
        agent: Agent[Any],
        input: str | list[Any],
        *,
        context: Any = None,
        max_rounds: int = 16,
        **options: Any,
    ) -> RunResult:
        """``Runner.run`` that resolves interruptions through Signoff and resumes, until none is left.

        ``options`` go to every ``Runner.run`` call (``max_turns``, ``run_config``…); the
        ``context`` to the first only (the resumed state carries it). Stops after
        ``max_rounds`` resumptions or when the remaining interruptions are not covered,
        returning the last result with those interruptions still pending. Executed calls
        are reported through :attr:`hooks`; run hooks of your own must subclass
        :class:`SignoffRunHooks` (and call its ``on_tool_end``).
        """
        hooks = options.setdefault("hooks", self.hooks)
        if not isinstance(hooks, SignoffRunHooks):
            raise TypeError("hooks= must be a SignoffRunHooks, which reports executed calls to Signoff")
        result = await Runner.run(agent, input, context=context, **options)
        for _ in range(max_rounds):
            if not any(self.covers(item) for item in result.interruptions):
                break
            state = await self.resolve(result)
            result = await Runner.run(agent, state, **options)
        return result


class SignoffRunHooks(RunHooks[Any]):
    """Run hooks that report each executed call of a tool Signoff was asked about.

    Subclass it for run hooks of your own, and call ``super().on_tool_end(...)``.
    """

    def __init__(self, approvals: SignoffApprovals) -> None:
        self.approvals = approvals

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object
    ) -> None:
        if isinstance(context, ToolContext) and context.tool_name in self.approvals.asked_tools:
            await self.approvals.report(context, result, tool)
