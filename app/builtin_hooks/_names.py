"""Tool names as gates compare them: one key for every spelling of a name.

A tool name and a gate's glob are compared twice: as written (``fnmatch`` rules, case
sensitive), and by their *keys*, so that no spelling of a gated tool slips past its gate.
A key is the text with whitespace and invisible characters (zero-width, bidi controls,
format characters, the other default-ignorable code points) removed, NFKC-normalised and
case folded, and each character that looks like a Latin letter, digit, ``_``, ``-`` or
``.`` replaced by it (Unicode TR39 confusables; see ``_confusables``). Like TR39, keys do
not tell ``i``, ``l``, ``1`` and ``|`` apart, nor ``o`` and ``0``: names that differ only
there are one name to a gate.

Keys only decide whether a gate applies; the request keeps the name as sent.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import unicodedata

from signoff.app.builtin_hooks._confusables import ASCII_FOLD, IGNORABLE, LOOKALIKES

__all__ = ["glob_patterns", "tool_key"]

_IGNORABLE = re.compile(
    "[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in IGNORABLE) + "]+"
)
_FOLD = str.maketrans({**LOOKALIKES, **ASCII_FOLD})
_MAX_CLASS = 1024
"""Characters a ``[…]`` class may span and still be folded member by member."""


def _key(text: str) -> str:
    # Look-alikes before and after folding case: a capital may look like another letter
    # than its small form (Greek capital upsilon is a Y, upsilon a u).
    text = unicodedata.normalize("NFKC", _IGNORABLE.sub("", text)).translate(_FOLD)
    # Folding case can undo NFKC (and NFKC can make spaces), so both once more.
    text = _IGNORABLE.sub("", unicodedata.normalize("NFKC", text.casefold()))
    return text.translate(_FOLD)


@functools.lru_cache(maxsize=8192)
def tool_key(tool_name: str) -> str:
    """The key of ``tool_name`` (cached: agents call the same few tools again and again)."""
    return _key(tool_name)


def _class(body: str) -> str:
    """A ``[…]`` class (without brackets or ``!``) over keys: each member and its key."""
    members: set[str] = set()
    i = 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            lo, hi = ord(body[i]), ord(body[i + 2])
            if 0 <= hi - lo < _MAX_CLASS:
                members.update(chr(c) for c in range(lo, hi + 1))
            else:
                members.update((body[i], body[i + 2]))
            i += 3
        else:
            members.add(body[i])
            i += 1
    keyed = {k for m in members if len(k := _key(m)) == 1}
    return "".join(re.escape(c) for c in sorted(members | keyed))


def _keyed_regex(glob: str) -> str:
    """``glob`` as a regular expression over keys: its literal parts keyed, its ``*``, ``?``
    and ``[…]`` kept (the same reading of a glob as :func:`fnmatch.translate`)."""
    out: list[str] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            out.append(re.escape(_key("".join(literal))))
            literal.clear()

    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            flush()
            out.append(".*")
        elif c == "?":
            flush()
            out.append(".")
        elif c == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                literal.append(c)  # no closing bracket: a literal "["
                continue
            negated = glob[i] == "!"
            body = glob[i + 1 if negated else i : j]
            i = j + 1
            flush()
            members = _class(body)
            out.append(f"[{'^' if negated else ''}{members}]" if members else ("." if negated else "(?!)"))
        else:
            literal.append(c)
    flush()
    return "".join(out)


def glob_patterns(globs: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The globs as two expressions: over names as written, and over their keys."""
    exact = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))
    keyed = re.compile("|".join(f"(?:{_keyed_regex(g)})" for g in globs), re.DOTALL)
    return exact, keyed
