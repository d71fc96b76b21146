"""The hook contract: context in, typed result out, three hook points.

A hook runs outside the model's reasoning at a fixed point of an agent's loop:
``PreToolUse`` (may deny or rewrite arguments), ``PostToolUse`` (may rewrite the
result) and ``SessionStart`` (may add context). Hooks see a snapshot of the call
and return a :class:`HookResult`; they never mutate what they were given. A hook
may say how long it may take with a ``time_limit`` attribute (seconds); without one the
:class:`~signoff.hooks.HookRegistry` gives it its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from signoff.hooks._decision import Decision

__all__ = [
    "Decision",
    "HookContext",
    "HookResult",
    "HookServices",
    "PostToolUseHook",
    "PreToolUseHook",
    "ServiceUnavailable",
    "SessionStartHook",
]


@dataclass(frozen=True, slots=True)
class HookContext:
    """A snapshot of one tool call (or session start) as the agent reported it."""

    agent_id: str
    tool_name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    user_id: str | None = None
    session_id: str | None = None
    tool_call_id: str | None = None
    idempotency_key: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    result: Any = None
    """The tool's result (PostToolUse only)."""
    services: HookServices | None = field(default=None, compare=False, repr=False)
    """What the server offers hooks for this call (approvals, switches, rate limits, audit)."""

    def with_arguments(self, arguments: Mapping[str, Any]) -> HookContext:
        return replace(self, arguments=arguments)

    def with_result(self, result: Any) -> HookContext:
        return replace(self, result=result)


@dataclass(frozen=True, slots=True)
class HookResult:
    """What a hook decided. The default allows and changes nothing."""

    decision: Decision = Decision.ALLOW
    reason: str | None = None
    modified_arguments: Mapping[str, Any] | None = None
    """PreToolUse: replaces the arguments for later hooks and for the tool."""
    modified_result: Any = None
    """PostToolUse: replaces the result the model sees (``None`` keeps it)."""
    additional_context: str | None = None
    """SessionStart: text to add to the agent's context."""
    request_id: str | None = None

    @classmethod
    def allow(cls, **kwargs: Any) -> HookResult:
        return cls(decision=Decision.ALLOW, **kwargs)

    @classmethod
    def deny(cls, reason: str, **kwargs: Any) -> HookResult:
        return cls(decision=Decision.DENY, reason=reason, **kwargs)


@runtime_checkable
class PreToolUseHook(Protocol):
    """Runs before a tool; may deny, ask a human, or rewrite the arguments."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int:
        """Lower runs earlier."""
        ...

    def matches(self, ctx: HookContext) -> bool: ...

    async def before_tool_use(self, ctx: HookContext) -> HookResult: ...


@runtime_checkable
class PostToolUseHook(Protocol):
    """Runs after a tool; may rewrite its result."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...

    def matches(self, ctx: HookContext) -> bool: ...

    async def after_tool_use(self, ctx: HookContext) -> HookResult: ...


@runtime_checkable
class SessionStartHook(Protocol):
    """Runs before a session's first model call; may add context."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...

    async def on_session_start(self, ctx: HookContext) -> HookResult: ...


class ServiceUnavailable(Exception):
    """Raised by :class:`HookServices` when what it needs (the server's database) cannot be
    reached. The registry lets it through instead of denying, so the server answers with a
    retryable error: the call may well pass once the service is back."""


class HookServices(Protocol):
    """The server side of the built-in hooks, bound to the call's transaction."""

    async def request_approval(self, ctx: HookContext, gate: Any) -> HookResult:
        """The decision for the call ``gate`` is one of: allow, deny, or pending (people must
        decide; the server writes the request once every hook has run)."""
        ...

    async def is_switch_on(self, name: str) -> bool:
        """Whether an operator switch (such as ``read_only``) is on."""
        ...

    async def take_token(
        self, bucket: str, *, capacity: float, refill_per_second: float, call: HookContext | None = None
    ) -> float:
        """Take one token from a shared bucket: 0 if taken, else seconds until one is free.
        ``call``: the call the token is for; sent again under the idempotency key of a request
        made for that same call (re-attaching to it, or running it once approved), it takes none."""
        ...

    def redact(self, value: Any) -> Any:
        """``value`` with secrets masked, as it would be stored (redact before you summarise)."""
        ...

    async def record(self, ctx: HookContext, action: str, detail: Mapping[str, Any]) -> None:
        """Append an event to the audit log (``detail`` is redacted before it is stored).

        ``action`` must be one the server's audit log knows (``tool_call``); any other
        raises, and the hook fails."""
        ...
