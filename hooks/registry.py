"""Runs an agent's hooks in priority order, each under a timeout, failing closed.

A hook's timeout is its ``time_limit`` (seconds) when it has one, else the registry's
``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

from signoff.hooks._contract import (
    Decision,
    HookContext,
    HookResult,
    PostToolUseHook,
    PreToolUseHook,
    ServiceUnavailable,
    SessionStartHook,
)
from signoff.hooks._gate import seconds_text

__all__ = ["DEFAULT_HOOK_TIMEOUT", "HookRegistry"]

log = logging.getLogger("signoff.hooks")

DEFAULT_HOOK_TIMEOUT = 5.0


def _time_limit(hook: object, default: float) -> float:
    """The seconds ``hook`` may take: its own ``time_limit`` if it sets a positive one."""
    limit = getattr(hook, "time_limit", None)
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit > 0:
        return float(limit)
    return default


def _label(hook: object) -> str:
    """How answers name a hook: its ``label`` when it has one (the built-in hooks: their
    ``name``, or their type and tools), else its ``name``, else its class. Never empty."""
    for attribute in ("label", "name"):
        value = getattr(hook, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(hook).__name__


async def _guarded(name: str, call: Callable[[], Awaitable[HookResult]], timeout: float) -> HookResult:
    """Run one hook; any failure (raising, even before awaiting; timing out) denies, naming the hook.

    :class:`ServiceUnavailable` is let through: the call is to be retried, not denied.
    """
    try:
        async with asyncio.timeout(timeout):  # in this task: no task of its own per hook
            result = await call()
    except TimeoutError:
        return HookResult.deny(f"hook {name!r} did not answer within {seconds_text(timeout)}")
    except ServiceUnavailable:
        raise
    except Exception as exc:
        log.exception("hook %s raised", name)
        return HookResult.deny(f"hook {name!r} failed: {type(exc).__name__}")
    if not isinstance(result, HookResult):
        return HookResult.deny(f"hook {name!r} returned {type(result).__name__}, not a HookResult")
    return result


@dataclass(slots=True)
class HookRegistry:
    """One agent's hooks, sorted by priority (lower first, then configuration order)."""

    pre_tool_use: Sequence[PreToolUseHook] = ()
    post_tool_use: Sequence[PostToolUseHook] = ()
    session_start: Sequence[SessionStartHook] = ()
    timeout: float = DEFAULT_HOOK_TIMEOUT
    """Seconds for each hook that sets no ``time_limit`` of its own."""

    def __post_init__(self) -> None:
        self.pre_tool_use = sorted(self.pre_tool_use, key=lambda h: h.priority)
        self.post_tool_use = sorted(self.post_tool_use, key=lambda h: h.priority)
        self.session_start = sorted(self.session_start, key=lambda h: h.priority)

    async def run_pre_tool_use(self, ctx: HookContext) -> HookResult:
        """Run every matching PreToolUse hook, in order, until one denies.

        The call is denied if any hook denies, else pending if any asks a human, else allowed:
        an allow never ends the chain, nor does a pending answer (a later hook may still deny).
        Rewritten arguments pass on to later hooks and are returned in
        ``modified_arguments``. A hook that raises, times out or returns anything but a
        :class:`HookResult` denies the call.
        """
        rewritten = False
        approved: HookResult | None = None  # a human's earlier approval, named in the answer
        pending: HookResult | None = None
        for hook in self.pre_tool_use:
            name = _label(hook)
            try:
                applies = hook.matches(ctx)
            except Exception as exc:
                return HookResult.deny(f"hook {name!r} failed to match: {type(exc).__name__}")
            if not applies:
                continue
            result = await _guarded(name, partial(hook.before_tool_use, ctx), _time_limit(hook, self.timeout))
            if result.decision is Decision.DENY:
                return HookResult(
                    decision=result.decision,
                    reason=result.reason,
                    request_id=result.request_id,
                    modified_arguments=ctx.arguments if rewritten else None,
                )
            if result.decision is Decision.PENDING:
                pending = pending or result
                continue
            if result.modified_arguments is not None:
                ctx = ctx.with_arguments(result.modified_arguments)
                rewritten = True
            if result.request_id is not None:
                approved = result
        answer = pending or approved
        return HookResult(
            decision=pending.decision if pending else Decision.ALLOW,
            reason=answer.reason if answer else None,
            request_id=answer.request_id if answer else None,
            modified_arguments=ctx.arguments if rewritten else None,
        )

    async def run_post_tool_use(self, ctx: HookContext) -> HookResult:
        """Run matching PostToolUse hooks, each seeing the previous one's result."""
        rewritten = False
        for hook in self.post_tool_use:
            name = _label(hook)
            try:
                applies = hook.matches(ctx)
            except Exception:
                log.exception("post hook %s failed to match", name)
                continue
            if not applies:
                continue
            result = await _guarded(name, partial(hook.after_tool_use, ctx), _time_limit(hook, self.timeout))
            if result.decision is Decision.DENY:
                return HookResult.deny(result.reason or f"hook {name!r} denied")
            if result.modified_result is not None:
                ctx = ctx.with_result(result.modified_result)
                rewritten = True
        return HookResult(modified_result=ctx.result if rewritten else None)

    async def run_session_start(self, ctx: HookContext) -> HookResult:
        """Run SessionStart hooks and join the context they add."""
        parts: list[str] = []
        for hook in self.session_start:
            name = _label(hook)
            result = await _guarded(
                name, partial(hook.on_session_start, ctx), _time_limit(hook, self.timeout)
            )
            if result.decision is Decision.DENY:
                return HookResult.deny(result.reason or f"hook {name!r} denied")
            if result.additional_context:
                parts.append(result.additional_context)
        return HookResult(additional_context="\n\n".join(parts) or None)
