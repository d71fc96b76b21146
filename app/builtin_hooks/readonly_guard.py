"""``readonly_guard``: deny matching tools while an operator's read-only switch is on."""

from __future__ import annotations

from typing import Literal

from signoff.app.builtin_hooks._filter import ToolFilter
from signoff.hooks import HookContext, HookResult

__all__ = ["ReadOnlyGuard"]


class ReadOnlyGuard(ToolFilter):
    type: Literal["readonly_guard"] = "readonly_guard"
    switch: str = "read_only"
    """The switch to watch (``signoff readonly on|off --switch NAME``; ``read_only`` by default)."""
    reason: str = "Signoff is in read-only mode: {tool} is blocked until an operator turns it off."
    priority: int = 10

    async def before_tool_use(self, ctx: HookContext) -> HookResult:
        if ctx.services is None:
            return HookResult.deny(f"{self.label} cannot read the {self.switch!r} switch")
        if await ctx.services.is_switch_on(self.switch):
            return HookResult.deny(self.reason.format(tool=ctx.tool_name))
        return HookResult.allow()
