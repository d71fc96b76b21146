"""``result_truncate``: cut oversized tool results before the model sees them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from signoff.app.builtin_hooks._filter import ToolFilter, result_text
from signoff.hooks import HookContext, HookResult

__all__ = ["ResultTruncate"]


class ResultTruncate(ToolFilter):
    type: Literal["result_truncate"] = "result_truncate"
    max_chars: int = Field(default=8000, ge=1)
    marker: str = "\n…[truncated {dropped} of {total} characters]"

    async def after_tool_use(self, ctx: HookContext) -> HookResult:
        text = result_text(ctx.result)
        if len(text) <= self.max_chars:
            return HookResult.allow()
        kept = text[: self.max_chars]
        marker = self.marker.format(dropped=len(text) - self.max_chars, total=len(text))
        return HookResult.allow(modified_result=kept + marker)
