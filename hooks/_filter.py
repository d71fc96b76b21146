"""What every configurable hook shares: a type, a priority and the tools it applies to."""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = ["ToolFilter"]


class ToolFilter(BaseModel):
    """Base of the built-in hooks' configuration: tool-name globs and a priority."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    tools: tuple[str, ...] = Field(default=("*",), min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool."""
    priority: int = 100
    """Lower runs earlier."""

    _patterns: tuple[re.Pattern[str], ...] = PrivateAttr(default=())

    def model_post_init(self, __context: Any) -> None:
        self._patterns = tuple(re.compile(fnmatch.translate(t)) for t in self.tools)

    def matches_tool(self, tool_name: str) -> bool:
        return any(p.match(tool_name) for p in self._patterns)

    @property
    def label(self) -> str:
        kind = str(getattr(self, "type", type(self).__name__))
        return self.name or f"{kind}[{','.join(self.tools)}]"
