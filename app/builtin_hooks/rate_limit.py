"""``rate_limit``: a token bucket per agent / user / tool, held in the server's database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, field_validator

from signoff.app.builtin_hooks._filter import ToolFilter, parse_duration
from signoff.hooks import HookContext, HookResult

__all__ = ["RateLimit"]


class RateLimit(ToolFilter):
    type: Literal["rate_limit"] = "rate_limit"
    limit: int = Field(ge=1)
    """Calls allowed per ``window`` (also the burst size)."""
    window: timedelta = timedelta(minutes=1)
    per: tuple[Literal["agent", "user", "tool"], ...] = ("agent", "tool")
    """What one bucket counts: every combination of these gets its own."""
    priority: int = 20

    @field_validator("window", mode="before")
    @classmethod
    def _parse_window(cls, value: Any) -> timedelta:
        return parse_duration(value)

    def bucket(self, ctx: HookContext) -> str:
        parts = {"agent": ctx.agent_id, "user": ctx.user_id or "-", "tool": ctx.tool_name}
        return f"{self.label}|" + "|".join(f"{p}={parts[p]}" for p in self.per)

    async def before_tool_use(self, ctx: HookContext) -> HookResult:
        if ctx.services is None:
            return HookResult.deny(f"{self.label} has no rate-limit store")
        wait = await ctx.services.take_token(
            self.bucket(ctx),
            capacity=float(self.limit),
            refill_per_second=self.limit / self.window.total_seconds(),
            call=ctx,
        )
        if wait > 0:
            return HookResult.deny(
                f"rate limit: at most {self.limit} calls of {ctx.tool_name} per {self.window}; "
                f"try again in {wait:.0f}s"
            )
        return HookResult.allow()
