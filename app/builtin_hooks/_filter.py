"""What every configurable hook shares: a type, a name, a priority, a timeout, and (for the
tool hooks) the tools it applies to."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from signoff.app.builtin_hooks._names import glob_patterns, tool_key
from signoff.hooks import HookContext

__all__ = ["MAX_HOOK_TIMEOUT", "HookEntry", "ToolFilter", "parse_duration", "result_text"]

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)?\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

MAX_HOOK_TIMEOUT = timedelta(seconds=60)
"""The longest a hook may take: the agent waits for every hook's answer before its tool runs."""


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """``90``, ``"45s"``, ``"30m"``, ``"2h"``, ``"1d"`` → a :class:`timedelta`."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"{value!r} is not a duration; write e.g. 90s, 30m, 2h or 1d")
        seconds = float(int(m.group(1)) * _UNITS[m.group(2)])
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{value!r} is too long a duration") from None


def result_text(result: Any) -> str:
    """A tool's result as text: a string as it is, anything else as JSON."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


class HookEntry(BaseModel):
    """Base of the built-in hooks' configuration: a name, a priority and a timeout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    priority: int = 100
    """Lower runs earlier."""
    timeout: timedelta | None = None
    """How long the hook may take to answer (a hook that takes longer denies the call); by
    default the hook registry's (``DEFAULT_HOOK_TIMEOUT``, 5 s)."""

    @field_validator("timeout", mode="before")
    @classmethod
    def _parse_timeout(cls, value: Any) -> timedelta | None:
        if value is None:
            return None
        timeout = parse_duration(value)
        if timeout > MAX_HOOK_TIMEOUT:
            raise ValueError(f"a hook may take at most {MAX_HOOK_TIMEOUT.total_seconds():g}s")
        return timeout

    @property
    def time_limit(self) -> float | None:
        """Seconds the hook registry gives this hook (None: the registry's default)."""
        return self.timeout.total_seconds() if self.timeout is not None else None


class ToolFilter(HookEntry):
    """Base of the hooks that apply to some tools: tool-name globs."""

    tools: tuple[str, ...] = Field(default=("*",), min_length=1)
    """Tool name globs (``pay_*``, ``mcp__github__*``); ``*`` matches every tool. A name
    matches as written or by its key, whatever its case, spaces, invisible characters or
    look-alike letters (see ``_names``)."""

    @cached_property
    def _patterns(self) -> tuple[re.Pattern[str], re.Pattern[str]]:
        """The globs over names as written and over keys (a plain attribute once computed)."""
        return glob_patterns(self.tools)

    def matches_tool(self, tool_name: str) -> bool:
        exact, keyed = self._patterns
        return exact.match(tool_name) is not None or keyed.fullmatch(tool_key(tool_name)) is not None

    def matches(self, ctx: HookContext) -> bool:
        return self.matches_tool(ctx.tool_name)

    @property
    def label(self) -> str:
        kind = str(getattr(self, "type", type(self).__name__))
        return self.name or f"{kind}[{','.join(self.tools)}]"
