"""Signoff hooks: the hook contract, the built-in hooks, and the registry that runs them."""

from hooks._contract import (
    Decision,
    HookContext,
    HookPoint,
    HookResult,
    HookServices,
    PostToolUseHook,
    PreToolUseHook,
    SessionStartHook,
)
from hooks.registry import HookRegistry

__all__ = [
    "Decision",
    "HookContext",
    "HookPoint",
    "HookRegistry",
    "HookResult",
    "HookServices",
    "PostToolUseHook",
    "PreToolUseHook",
    "SessionStartHook",
]
