"""``audit_log``: record every call of matching tools, and its outcome, in the audit log."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from signoff.app.audit import Action
from signoff.app.builtin_hooks._filter import ToolFilter, result_text
from signoff.hooks import HookContext, HookResult

__all__ = ["AuditLog"]


class AuditLog(ToolFilter):
    type: Literal["audit_log"] = "audit_log"
    result_chars: int = Field(default=500, ge=0)
    """How much of the result to keep in the event (0: only its size)."""
    priority: int = 0
    """Runs first, so it records the result as the tool returned it."""

    async def after_tool_use(self, ctx: HookContext) -> HookResult:
        if ctx.services is None:
            return HookResult.deny(f"{self.label} has no audit log to write to")
        # Redacted before it is turned into text and cut: a secret under a key in the
        # result is lost to key-based redaction once stringified, and half a token cut off
        # no longer looks like one.
        text = result_text(ctx.services.redact(ctx.result))
        await ctx.services.record(
            ctx,
            Action.TOOL_CALL,
            {
                "tool": ctx.tool_name,
                "arguments": dict(ctx.arguments),
                "user_id": ctx.user_id,
                "session_id": ctx.session_id,
                "tool_call_id": ctx.tool_call_id,
                "error": ctx.metadata.get("error"),
                "result_chars": len(text),
                "result": text[: self.result_chars],
            },
        )
        return HookResult.allow()
