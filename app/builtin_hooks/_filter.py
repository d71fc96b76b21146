"""What every configurable hook shares: a type, a priority and the tools it applies to."""

from __future__ import annotations

import re
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from signoff.app.builtin_hooks._names import glob_patterns, tool_key

__all__ = ["ToolFilter"]


class ToolFilter(BaseModel):
    """Base of the built-in hooks' configuration: tool-name globs and a priority."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    tools: tuple[str, ...] = Field(default=("*",), min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool. A name
    matches as written or by its key, whatever its case, spaces, invisible characters or
    look-alike letters (see ``_names``)."""
    priority: int = 100
    """Lower runs earlier."""

    @cached_property
    def _patterns(self) -> tuple[re.Pattern[str], re.Pattern[str]]:
        """The globs over names as written and over keys (a plain attribute once computed)."""
        return glob_patterns(self.tools)

    def matches_tool(self, tool_name: str) -> bool:
        exact, keyed = self._patterns
        return exact.match(tool_name) is not None or keyed.fullmatch(tool_key(tool_name)) is not None

    @property
    def label(self) -> str:
        kind = str(getattr(self, "type", type(self).__name__))
        return self.name or f"{kind}[{','.join(self.tools)}]"
