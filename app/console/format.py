"""How the console writes times, durations and arguments (Jinja filters and CSV cells)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from signoff.app.redaction import REDACTED
from signoff.channels import argument_json, shown_text

__all__ = ["compact_json", "duration", "iso", "pretty_json", "summarize", "time_left", "when"]


def when(value: datetime | None) -> str:
    """``2026-05-01 12:34:56 UTC``, or an em dash for no time."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat()


def duration(seconds: float) -> str:
    """``45s``, ``4m 05s``, ``30m``, ``2h 10m``, ``3d 4h`` (zero trailing units left out)."""
    s = int(max(seconds, 0))
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes:02d}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"


def time_left(expires_at: datetime, now: datetime) -> str:
    left = (expires_at - now).total_seconds()
    return "overdue" if left <= 0 else duration(left)


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON, every character that does not show as itself (a bidi
    override, a zero-width space, a line separator) written as a ``\\u`` escape, as the cards
    write it: what an approver reads on a page is what runs."""
    return argument_json(value, indent=2)


def _short(value: Any, room: int = 48) -> str:
    if value == REDACTED:
        return REDACTED
    text = argument_json(value)
    return text if len(text) <= room else text[: room - 1] + "…"


def summarize(arguments: Mapping[str, Any], limit: int = 160) -> str:
    """One line a person can read: ``amount=90000, to="ACME", password=[redacted]``."""
    if not arguments:
        return "(no arguments)"
    text = ", ".join(f"{shown_text(k)}={_short(v)}" for k, v in arguments.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"
