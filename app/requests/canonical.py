"""Canonical JSON: the one text a value is compared, digested and stored by.

Keys sorted, no spaces, the value's own types (``1``, ``1.0``, ``"1"`` and ``true`` all
differ), text as sent (no Unicode normalisation); values JSON cannot hold are written as
their ``str``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["call_digest", "canonical", "same"]


def canonical(value: Any, *, ascii_only: bool = False) -> str:
    """``value`` as canonical JSON; ``ascii_only`` escapes every character beyond ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, default=str)


def same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value (type counts: ``1`` is not ``"1"``)."""
    return canonical(a) == canonical(b)


def call_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """The SHA-256 of a call (tool and arguments as sent): which call an approval covers.

    Stored with every request, so it keeps the ASCII form the first requests were stored with.
    """
    return hashlib.sha256(canonical([tool_name, arguments], ascii_only=True).encode()).hexdigest()
