"""What every configurable hook shares: a type, a priority and the tools it applies to."""

from __future__ import annotations

import fnmatch
import re
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ToolFilter"]


class ToolFilter(BaseModel):
    """Base of the built-in hooks' configuration: tool-name globs and a priority."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    tools: tuple[str, ...] = Field(default=("*",), min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool."""
    priority: int = 100
    """Lower runs earlier."""

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        """The globs as one regular expression (a plain attribute once computed)."""
        return re.compile("|".join(f"(?:{fnmatch.translate(t)})" for t in self.tools))

    def matches_tool(self, tool_name: str) -> bool:
        return self._pattern.match(tool_name) is not None

    @property
    def label(self) -> str:
        kind = str(getattr(self, "type", type(self).__name__))
        return self.name or f"{kind}[{','.join(self.tools)}]"
