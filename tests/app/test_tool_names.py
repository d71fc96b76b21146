"""Gate globs match every spelling of a gated tool name (hypothesis)."""
# ruff: noqa: RUF001  (look-alike letters are what this file is about)

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signoff.app.builtin_hooks._filter import ToolFilter
from signoff.app.builtin_hooks._names import tool_key

GLOBS = ["pay_*", "oa__purchase_*", "mcp__github__*", "wire_transfer", "delete_?ser", "svc_[a-c]*_x"]
NAME_CHARS = string.ascii_lowercase + string.digits + "_"

# Look-alikes written out by hand (Cyrillic, Greek, Armenian, Latin), not taken from the
# table the code uses.
LOOKALIKES = {
    "a": "аɑα",
    "c": "сϲ",
    "d": "ԁ",
    "e": "еҽ",
    "h": "һ",
    "i": "іı",
    "j": "ј",
    "k": "κк",
    "o": "оοօ",
    "p": "рρ",
    "s": "ѕ",
    "u": "υս",
    "x": "хχ",
    "y": "уү",
    "A": "АΑ",
    "B": "ВΒ",
    "C": "С",
    "E": "ЕΕ",
    "H": "НΗ",
    "I": "ІΙ",
    "J": "Ј",
    "K": "КΚ",
    "M": "МΜ",
    "N": "Ν",
    "O": "ОΟ",
    "P": "РΡ",
    "S": "Ѕ",
    "T": "ТΤ",
    "X": "ХΧ",
    "Y": "ҮΥ",
    "Z": "Ζ",
}
INVISIBLE = (
    "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2069\u034f\ufe0f"
)
SPACES = " \t\n\u00a0\u2003\u3000"


@st.composite
def gated_names(draw: st.DrawFn) -> tuple[str, str]:
    """A glob and a plain name it matches as written."""
    glob = draw(st.sampled_from(GLOBS))
    name = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            name.append(draw(st.text(NAME_CHARS, max_size=12)))
        elif c == "?":
            name.append(draw(st.sampled_from(NAME_CHARS)))
        elif c == "[":
            end = glob.index("]", i)
            lo, hi = glob[i + 1], glob[end - 1]
            name.append(draw(st.sampled_from([chr(x) for x in range(ord(lo), ord(hi) + 1)])))
            i = end
        else:
            name.append(c)
        i += 1
    return glob, "".join(name)


Op = tuple[str, int, int]


def respell(text: str, ops: list[Op], *, editable: set[int] | None = None) -> str:
    """``text`` after each of ``ops`` in turn (only at positions in ``editable``, if given):
    a change of case, a full-width form, a look-alike letter, an invisible character or a
    space slipped in. Positions refer to the text as it stands when the op applies."""
    chars = list(text)
    keep = [editable is None or i in editable for i in range(len(chars))]
    for kind, at, pick in ops:
        if not chars:
            break
        i = at % len(chars)
        if not keep[i]:
            continue
        c = chars[i]
        if kind == "case" and c.isascii() and c.isalpha():
            chars[i] = c.swapcase()
        elif kind == "fullwidth" and "!" <= c <= "~":
            chars[i] = chr(ord(c) + 0xFEE0)
        elif kind == "lookalike" and c in LOOKALIKES:
            chars[i] = LOOKALIKES[c][pick % len(LOOKALIKES[c])]
        elif kind in ("invisible", "space"):
            pool = INVISIBLE if kind == "invisible" else SPACES
            chars.insert(i + pick % 2, pool[pick % len(pool)])
            keep.insert(i + pick % 2, True)
    return "".join(chars)


ops = st.lists(
    st.tuples(
        st.sampled_from(["case", "fullwidth", "lookalike", "invisible", "space"]),
        st.integers(0, 200),
        st.integers(0, 50),
    ),
    max_size=30,
)


@settings(max_examples=400, deadline=None)
@given(gated_names(), ops)
def test_every_spelling_of_a_gated_name_matches_its_glob(gated: tuple[str, str], edits: list[Op]) -> None:
    glob, name = gated
    gate = ToolFilter(tools=(glob,))
    assert gate.matches_tool(name)
    spelled = respell(name, edits)
    assert gate.matches_tool(spelled), (glob, spelled, tool_key(spelled))


@settings(max_examples=300, deadline=None)
@given(gated_names(), ops)
def test_globs_are_read_the_same_way(gated: tuple[str, str], edits: list[Op]) -> None:
    glob, name = gated
    # Only the glob's literal characters are respelled (``*``, ``?`` and ``[…]`` stay).
    literal: set[int] = set()
    depth = 0
    for i, c in enumerate(glob):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and c not in "*?":
            literal.add(i)
    spelled = respell(glob, edits, editable=literal)
    assert ToolFilter(tools=(spelled,)).matches_tool(name), (spelled, name)


@pytest.mark.parametrize(
    "name",
    [
        "Pay_invoice",
        "PAY_INVOICE",
        " pay_invoice",
        "pay_invoice\n",
        "\u0440ay_invoice",  # Cyrillic er
        "\uff50\uff41\uff59\uff3f\uff49\uff4e\uff56\uff4f\uff49\uff43\uff45",  # full width
        "pay\u200b_invoice",  # zero-width space
        "\u202epay_invoice",  # right-to-left override
        "\u03a1\u0391\u03a5_\u0399NVOICE",  # Greek capitals
    ],
)
def test_known_dodges_match(name: str) -> None:
    assert ToolFilter(tools=("pay_*",)).matches_tool(name)
    assert ToolFilter(tools=("pay_invoice",)).matches_tool(name)


@pytest.mark.parametrize(
    ("glob", "name"), [("pay_*", "read_file"), ("pay_*", "pa"), ("wire_transfer", "wire")]
)
def test_other_tools_do_not_match(glob: str, name: str) -> None:
    assert not ToolFilter(tools=(glob,)).matches_tool(name)
