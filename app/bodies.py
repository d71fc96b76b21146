"""What the server accepts as input, and how it reads back what it stored.

One rule for every body and every field, applied before anything is written:

- a JSON object may not repeat a key, at any depth: parsers disagree on which of two
  values counts, so a gate could read one amount and the tool run with the other;
- text may not hold NUL or lone surrogates: PostgreSQL cannot store NUL, and no UTF-8
  encoder (no database, no JSON response, no chat card) can carry a lone surrogate;
- numbers are JSON numbers (no ``NaN`` or ``Infinity``, which PostgreSQL's json refuses),
  and none too large for a float (``1e400`` would be read as infinity).

Rows stored before the rule are read leniently (:func:`read_json`), so one unreadable
row never takes down a listing.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pydantic_core

__all__ = [
    "REPLACEMENT",
    "UNREADABLE",
    "Refused",
    "parse_json",
    "read_json",
    "scrubbed",
    "storable",
    "unstorable_in",
    "without_unstorable",
]

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""Characters no column, response or card can carry faithfully."""
REPLACEMENT = "\ufffd"
UNREADABLE = "(unreadable)"
"""The key of the value read in place of stored JSON that does not parse."""

# In stored JSON, NUL and surrogates can only be escapes (\u0000, \ud83d…).
_ESCAPED = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# A number too large for a float (1.8e308 or more) has an exponent of three digits, or else
# (an exponent of at most 99) 210 digits or more before its point; a body holding neither
# needs no look for infinities. A JSON number starts the body or follows ``:``, ``[`` or
# ``,``, so text such as an IBAN's "DE021…" is no reason to look.
_HUGE_NUMBER = re.compile(rb"(?:^|[:\[,])\s*-?\d+(?:\.\d+)?[eE]\+?\d{3}|\d{210}")


class Refused(ValueError):
    """The input breaks the rule; the message says where and why, for a 422."""


def storable(text: str) -> bool:
    """Whether ``text`` can be stored and shown as it is (no NUL, no lone surrogate)."""
    return UNSTORABLE.search(text) is None


def without_unstorable(text: str) -> str:
    """``text`` with the characters it cannot be stored with removed (free text typed by
    a person, such as a reason, where refusing would help nobody)."""
    return UNSTORABLE.sub("", text)


def _describe(text: str) -> str:
    bad = UNSTORABLE.search(text)
    assert bad is not None
    char = bad.group()
    return "a NUL character" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"


def unstorable_in(value: Any, where: str = "") -> str | None:
    """Why ``value`` (JSON-like) cannot be stored — naming the first key or string that
    holds a NUL or a lone surrogate — or None if it can."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            if not storable(node):
                return f"{at or 'the body'} holds {_describe(node)}, which cannot be stored"
        elif isinstance(node, dict):
            for k, v in node.items():
                key = str(k)
                if not storable(key):
                    return f"a key in {at or 'the body'} holds {_describe(key)}, which cannot be stored"
                stack.append((v, f"{at}.{key}" if at else key))
        elif isinstance(node, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(node))
    return None


def _infinite_at(value: Any) -> str | None:
    """Where in ``value`` (parsed JSON) a number was read as infinity, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, at = stack.pop()
        if type(node) is float and not math.isfinite(node):
            return at or "the body"
        if type(node) is dict:
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in node.items())
        elif type(node) is list:
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(node))
    return None


def _count_keys(value: Any) -> int:
    """Keys in all the objects of a parsed body (depth is bounded by the parser)."""
    count = 0
    if type(value) is dict:
        count = len(value)
        value = value.values()
    elif type(value) is not list:
        return 0
    for v in value:
        if type(v) is dict or type(v) is list:
            count += _count_keys(v)
    return count


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Refused(f"the JSON body repeats the key {key!r} in one object; send each key once")
            seen.add(key)
    return out


_WHITESPACE_COLON = re.compile(rb'"\s+:')


def _may_repeat_keys(raw: bytes, keys: int) -> bool:
    """False when the body's text proves that no object repeats a key, without a second parse.

    ``keys`` is how many keys the parsed body holds (at most as many as its text has). Every
    key is followed by a colon, so a body whose parsed objects hold as many keys in all as
    the text has colons cannot have lost one to a repeat (colons in strings only add to
    the count). When strings hold colons, count the colons that close a quoted key
    (``":``) instead, provided no key leaves a space before its colon.
    """
    if raw.count(b":") == keys:
        return False
    return raw.count(b'":') != keys or _WHITESPACE_COLON.search(raw) is not None


def parse_json(raw: bytes) -> Any:
    """The JSON body ``raw`` as Python values, or :class:`Refused` saying what is wrong."""
    try:
        value = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise Refused(_why_not_json(raw, exc)) from None
    if b"\\u0000" in raw and (why := unstorable_in(value)) is not None:
        raise Refused(why)
    if _HUGE_NUMBER.search(raw) and (where := _infinite_at(value)) is not None:
        # The parser reads 1e400 as infinity: no JSON number, and what approvers would be
        # shown (null) is not what the tool would be given.
        raise Refused(f"{where} is a number too large to be stored (over 1.8e308); send it as text")
    if _may_repeat_keys(raw, _count_keys(value)):
        json.loads(raw, object_pairs_hook=_no_repeats)
    return value


def _why_not_json(raw: bytes, exc: ValueError) -> str:
    """The reason a body is refused: text it cannot store, or what breaks JSON."""
    try:
        # The standard library reads lone surrogates and NaN; what it reads shows which.
        lenient = json.loads(raw)
    except (ValueError, RecursionError):
        return f"the body is not valid JSON: {exc}"
    why = unstorable_in(lenient)
    if why is not None:
        return why
    if _infinite_at(lenient) is not None:
        return "NaN and Infinity are not JSON numbers"
    # Read by the standard library only for what it allows beyond the rule: a byte order
    # mark, UTF-16 or UTF-32, nesting deeper than the parser's limit.
    return f"the body is not valid JSON (send it as UTF-8, without a byte order mark): {exc}"


def scrubbed(value: Any) -> Any:
    """``value`` with every character that cannot be shown replaced by U+FFFD."""
    if isinstance(value, str):
        return UNSTORABLE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {scrubbed(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


def read_json(text: str) -> Any:
    """Stored JSON as Python values, for the engine: a row written before the rule (or
    edited by hand) reads as what can be shown, never as an error."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return {UNREADABLE: UNSTORABLE.sub(REPLACEMENT, str(text)[:200])}
    return scrubbed(value) if _ESCAPED.search(text) else value
