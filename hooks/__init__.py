"""Signoff hooks: the hook contract, the built-in hooks, and the registry that runs them."""

from hooks._contract import (
    ApprovalBroker,
    Decision,
    HookContext,
    HookPoint,
    HookResult,
    PostToolUseHook,
    PreToolUseHook,
    SessionStartHook,
)
from hooks.registry import HookRegistry

__all__ = [
    "ApprovalBroker",
    "Decision",
    "HookContext",
    "HookPoint",
    "HookRegistry",
    "HookResult",
    "PostToolUseHook",
    "PreToolUseHook",
    "SessionStartHook",
]
