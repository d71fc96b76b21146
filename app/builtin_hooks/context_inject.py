"""``context_inject``: add configured text to an agent's context when a session starts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from signoff.app.builtin_hooks._filter import HookEntry
from signoff.hooks import HookContext, HookResult

__all__ = ["ContextInject"]


class ContextInject(HookEntry):
    type: Literal["context_inject"] = "context_inject"
    name: str = "context_inject"
    text: str = Field(min_length=1, max_length=20_000)

    async def on_session_start(self, ctx: HookContext) -> HookResult:
        return HookResult.allow(additional_context=self.text)
