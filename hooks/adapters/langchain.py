"""LangChain v1 / LangGraph: an agent middleware that gates tool calls through Signoff.

```python
from langchain.agents import create_agent
from signoff.hooks.adapters.langchain import SignoffMiddleware
from signoff.hooks.client import GateClient

agent = create_agent(model, tools, middleware=[SignoffMiddleware(GateClient(), tools=["pay_invoice"])])
```

It wraps each tool call (``wrap_tool_call`` / ``awrap_tool_call``) and waits for
Signoff *inline*, so no checkpointer is needed: allowed → the tool runs (with the
arguments Signoff approved, ``modified_arguments``, if any: LangChain's edit);
anything else — denied, the deadline, Signoff unreachable, an error — → the tool
does not run and the model gets a ``ToolMessage(status="error")`` with the reason.
Once the tool has run (or raised), the call is reported to Signoff under the same
idempotency key with the arguments it ran with, which uses up its approval.

Signoff is asked about the arguments the tool runs with: the model's, validated by the
tool's schema (defaults filled in, ``"true"`` made ``True``, ``"5000"`` made ``5000``) — so
a gate on ``args.force == true`` or ``has(args.amount) && args.amount >= 50000`` sees the
call the tool makes. Arguments an approver changed are run only if, validated, they come
out as approved.

The idempotency key is ``langchain:<thread_id>:<tool_call_id>`` (``thread_id`` from
``config["configurable"]``), so a graph that re-executes the node on resume
re-attaches to the same Signoff request instead of creating a second one.
Without a ``thread_id`` each call gets a fresh key.

Use a :class:`GateClient` for ``invoke``/``stream``; for ``ainvoke``/``astream`` an
:class:`AsyncGateClient` (a sync client also works there, in a worker thread).
Requires the ``langchain`` extra: ``pip install '<signoff checkout>/hooks[langchain]'``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ToolCallRequest
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command
    from pydantic import BaseModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from signoff.hooks._install import install_hint

    raise ImportError(
        f"signoff.hooks.adapters.langchain needs LangChain: {install_hint('langchain')}"
    ) from exc

from signoff.hooks._gate import canonical_json, describe_changes, json_safe
from signoff.hooks.client import AsyncGateClient, GateClient, GateDecision, GateFailure, make_idempotency_key

__all__ = ["RUNTIME", "SignoffMiddleware"]

RUNTIME = "langchain"

_Result = ToolMessage | Command[Any]

_ASYNC_IN_SYNC = GateDecision(
    False,
    "SignoffMiddleware got an AsyncGateClient but the agent runs synchronously; use GateClient",
    failure=GateFailure.UNAVAILABLE,
)


def _thread_id(request: ToolCallRequest) -> str | None:
    config = getattr(request.runtime, "config", None)
    configurable = config.get("configurable") if isinstance(config, dict) else None
    thread = configurable.get("thread_id") if isinstance(configurable, dict) else None
    return str(thread) if thread is not None else None


def _as_run(request: ToolCallRequest, args: Any) -> dict[str, Any] | None:
    """``args`` as the request's tool runs them, as JSON (as Signoff is asked about them).

    Validated by the tool's schema as the tool itself validates them (defaults of fields left
    out filled in, values coerced: ``"true"`` → ``True``); as they are when the schema refuses
    them (the tool refuses them too); None when they cannot be sent as JSON (the call is
    denied). The tool is handed the model's arguments, not these: validating twice would apply
    a validator that changes a value twice.
    """
    schema = getattr(request.tool, "tool_call_schema", None)
    if isinstance(args, Mapping) and isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            model = schema.model_validate(args)
        except Exception:
            pass
        else:
            # As BaseTool._parse_input passes them on: the fields given, and those with a default
            # (not the synthetic fields of *args and **kwargs).
            given = model.model_fields_set
            args = {
                name: getattr(model, name)
                for name, field in type(model).model_fields.items()
                if name in given or (not field.is_required() and name not in ("args", "kwargs"))
            }
    return json_safe(args) if isinstance(args, Mapping) else None


def _not_json(name: str) -> GateDecision:
    return GateDecision(
        False, f"the arguments of {name} cannot be sent to Signoff as JSON", failure=GateFailure.UNAVAILABLE
    )


def _crashed(exc: Exception) -> GateDecision:
    return GateDecision(
        False, f"Signoff gate error ({type(exc).__name__}: {exc})", failure=GateFailure.UNAVAILABLE
    )


class SignoffMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Ask Signoff before each covered tool call; run it only when allowed.

    Args:
        client: A :class:`GateClient` (sync and async agents) or an
            :class:`AsyncGateClient` (async agents only).
        tools: Names of the tools to gate; ``None`` gates every tool.
        deadline: Seconds to wait per call; default the client's.
        user_id: Sent as the requester (approvers cannot approve their own calls).
    """

    def __init__(
        self,
        client: GateClient | AsyncGateClient,
        *,
        tools: Collection[str] | None = None,
        deadline: float | None = None,
        user_id: str | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.gated_tools = None if tools is None else frozenset(tools)
        self.deadline = deadline
        self.user_id = user_id

    def covers(self, tool_name: str) -> bool:
        """Whether calls of ``tool_name`` go through Signoff."""
        return self.gated_tools is None or tool_name in self.gated_tools

    def _call(self, request: ToolCallRequest) -> dict[str, Any]:
        """What the ask and the report of one call both send."""
        thread = _thread_id(request)
        call_id = request.tool_call.get("id")
        key = make_idempotency_key(RUNTIME, thread, call_id) or f"{RUNTIME}:auto:{uuid.uuid4().hex}"
        return {
            "session_id": thread,
            "tool_call_id": call_id,
            "user_id": self.user_id,
            "metadata": {"runtime": RUNTIME},
            "idempotency_key": key,
        }

    @staticmethod
    def _denied(request: ToolCallRequest, decision: GateDecision) -> ToolMessage:
        if decision.failure is not None:
            text = f"The tool call was not run: Signoff could not confirm it ({decision.reason})."
        else:
            text = f"The tool call was denied: {decision.reason or 'denied by Signoff'}."
        return ToolMessage(
            content=text,
            name=request.tool_call["name"],
            tool_call_id=request.tool_call.get("id") or "",
            status="error",
        )

    @staticmethod
    def _approved(
        request: ToolCallRequest, decision: GateDecision, asked: dict[str, Any]
    ) -> tuple[ToolCallRequest, dict[str, Any]] | GateDecision:
        """The request to run and the arguments it runs with: the model's (which the tool runs
        as ``asked``), or the approved changes, which the tool must run as they are (validated,
        they come out the same), else the call is denied."""
        if decision.modified_arguments is None:
            return request, asked
        changed = dict(decision.modified_arguments)
        ran = _as_run(request, changed)
        if ran is None or canonical_json(ran) != canonical_json(changed):
            name = request.tool_call["name"]
            return GateDecision(
                False,
                f"the tool call was not run: validated, the approved arguments of {name} would change "
                f"({describe_changes(changed, ran or {})})",
                decision.request_id,
                failure=GateFailure.UNAVAILABLE,
            )
        return request.override(tool_call={**request.tool_call, "args": changed}), changed

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], _Result]
    ) -> _Result:
        """Synchronous agents (``invoke``/``stream``)."""
        name = request.tool_call["name"]
        if not self.covers(name):
            return handler(request)
        if isinstance(self.client, AsyncGateClient):
            return self._denied(request, _ASYNC_IN_SYNC)
        call = self._call(request)
        asked = None
        try:
            asked = _as_run(request, request.tool_call["args"])
            if asked is None:
                decision = _not_json(name)
            else:
                decision = self.client.pre_tool_use(name, asked, **call, deadline=self.deadline)
        except Exception as exc:
            decision = _crashed(exc)
        if not decision.allowed or asked is None:
            return self._denied(request, decision)
        approved = self._approved(request, decision, asked)
        if isinstance(approved, GateDecision):
            return self._denied(request, approved)
        run, args = approved
        try:
            result = handler(run)
        except Exception as exc:
            self.client.post_tool_use(name, args, None, error=f"{type(exc).__name__}: {exc}", **call)
            raise
        content, error = _outcome(result)
        self.client.post_tool_use(name, args, content, error=error, **call)
        return result

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[_Result]]
    ) -> _Result:
        """Asynchronous agents (``ainvoke``/``astream``)."""
        name = request.tool_call["name"]
        if not self.covers(name):
            return await handler(request)
        call = self._call(request)
        asked = None
        try:
            asked = _as_run(request, request.tool_call["args"])
            if asked is None:
                decision = _not_json(name)
            else:
                decision = await self._run(
                    self.client.pre_tool_use, name, asked, **call, deadline=self.deadline
                )
        except Exception as exc:
            decision = _crashed(exc)
        if not decision.allowed or asked is None:
            return self._denied(request, decision)
        approved = self._approved(request, decision, asked)
        if isinstance(approved, GateDecision):
            return self._denied(request, approved)
        run, args = approved
        try:
            result = await handler(run)
        except Exception as exc:
            await self._run(
                self.client.post_tool_use, name, args, None, error=f"{type(exc).__name__}: {exc}", **call
            )
            raise
        content, error = _outcome(result)
        await self._run(self.client.post_tool_use, name, args, content, error=error, **call)
        return result

    @staticmethod
    async def _run(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Await an :class:`AsyncGateClient` method, or run a :class:`GateClient` one in a thread."""
        if inspect.iscoroutinefunction(method):
            return await method(*args, **kwargs)
        return await asyncio.to_thread(functools.partial(method, *args, **kwargs))


def _outcome(result: _Result) -> tuple[Any, str | None]:
    """What a tool's answer reports: its content, and the error when it failed."""
    if isinstance(result, ToolMessage):
        failed = result.status == "error"
        return result.content, (str(result.content) or "the tool failed") if failed else None
    return repr(result), None
