"""Signoff's agent side: the hook contract, the hook registry, the gate client and adapters.

Names are imported on first use, so ``signoff-hook claude-code`` (which needs almost
none of them) starts without loading the registry, asyncio or httpx, nor ``typing`` and
``importlib`` for this module's own use.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from signoff.hooks._contract import (
        Decision,
        HookContext,
        HookResult,
        HookServices,
        PostToolUseHook,
        PreToolUseHook,
        ServiceUnavailable,
        SessionStartHook,
    )
    from signoff.hooks._gate import describe_request
    from signoff.hooks.registry import DEFAULT_HOOK_TIMEOUT, HookRegistry

__all__ = [
    "DEFAULT_HOOK_TIMEOUT",
    "Decision",
    "HookContext",
    "HookRegistry",
    "HookResult",
    "HookServices",
    "PostToolUseHook",
    "PreToolUseHook",
    "ServiceUnavailable",
    "SessionStartHook",
    "describe_request",
]

_HOMES = dict.fromkeys(__all__, "signoff.hooks._contract") | {
    "DEFAULT_HOOK_TIMEOUT": "signoff.hooks.registry",
    "HookRegistry": "signoff.hooks.registry",
    "describe_request": "signoff.hooks._gate",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'signoff.hooks' has no attribute {name!r}")
    __import__(home)
    value = getattr(sys.modules[home], name)
    globals()[name] = value
    return value
