"""The "did you mean …?" of configuration errors: the known name closest to a misspelt one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` that ``word`` most likely misspells (letter case aside), or None
    when none is close (:func:`difflib.get_close_matches`' measure)."""
    by_fold: dict[str, str] = {}
    for name in known:
        by_fold.setdefault(name.casefold(), name)
    found = difflib.get_close_matches(word.casefold(), list(by_fold), n=1)
    return by_fold[found[0]] if found else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"did you mean 'alice'?"`` for the name of ``known`` closest to ``word``; ``""`` when
    none is close."""
    match = closest(word, known)
    return f"did you mean {match!r}?" if match is not None else ""
