"""The input rule (hypothesis): repeated keys at any depth and unstorable text are refused,
everything else reads as the standard library reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from signoff.app.bodies import Refused, parse_json, read_json, storable

ESCAPED = "(k:, its colon escaped)"
"""A key written ``"k\\u003a"``: the same key as ``"k:"``, without a colon in the text."""


def key_text(key: str) -> str:
    return '"k\\u003a"' if key == ESCAPED else json.dumps(key)


def key_name(key: str) -> str:
    return "k:" if key == ESCAPED else key


keys = st.sampled_from(["a", "b", "amount", "to", 'q":', "x y", "k:", ESCAPED, ""])
scalars = st.one_of(
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.text(st.sampled_from(["a", ":", '"', " ", "\\", "é", "\U0001f600", "{", "}"]), max_size=8),
)
# An object is a list of (key, value) pairs, so that it may repeat a key.
trees = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda v: ("list", v))
        | st.lists(st.tuples(keys, inner), max_size=4).map(lambda v: ("object", v))
    ),
    max_leaves=16,
)
spaces = st.sampled_from(["", " ", "\n", "\t ", "  "])


def encode(tree: Any, draw: st.DrawFn) -> str:
    gap = draw(spaces)
    if isinstance(tree, tuple) and tree[0] == "list":
        return "[" + ",".join(gap + encode(v, draw) for v in tree[1]) + "]"
    if isinstance(tree, tuple) and tree[0] == "object":
        return (
            "{"
            + ",".join(f"{gap}{key_text(k)}{draw(spaces)}:{gap}{encode(v, draw)}" for k, v in tree[1])
            + "}"
        )
    return json.dumps(tree)


def repeats(tree: Any) -> bool:
    if isinstance(tree, tuple) and tree[0] == "list":
        return any(repeats(v) for v in tree[1])
    if isinstance(tree, tuple) and tree[0] == "object":
        names = [key_name(k) for k, _ in tree[1]]
        return len(set(names)) != len(names) or any(repeats(v) for _, v in tree[1])
    return False


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bool]:
    tree = draw(trees)
    return encode(tree, draw), repeats(tree)


@settings(max_examples=1500, deadline=None)
@given(bodies())
def test_repeated_keys_are_refused_at_any_depth_and_nothing_else(body: tuple[str, bool]) -> None:
    text, repeated = body
    if repeated:
        with pytest.raises(Refused, match="repeats the key"):
            parse_json(text.encode())
    else:
        assert parse_json(text.encode()) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12), st.sampled_from(["\\u0000", "\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d"]))
def test_unstorable_text_is_refused_wherever_it_is(text: str, bad: str) -> None:
    escaped = json.dumps(text)[1:-1]
    for body in (f'{{"k": "{escaped}{bad}"}}', f'{{"{bad}{escaped}": 1}}', f'[[{{"k": ["{bad}"]}}]]'):
        try:
            parse_json(body.encode())
        except Refused:
            continue
        raise AssertionError(f"accepted {body!r}")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_stored_json_always_reads_as_showable_text(text: str) -> None:
    for stored in (json.dumps({"k": text}), text):
        value = read_json(stored)
        assert all(storable(s) for s in _strings(value)), stored


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@st.composite
def number_literals(draw: st.DrawFn) -> str:
    """JSON number literals around the largest float: long mantissas, big and small exponents."""
    sign = draw(st.sampled_from(["", "-"]))
    digits = draw(st.integers(0, 330))
    rest = draw(st.text("0123456789", min_size=digits, max_size=digits))
    whole = draw(st.sampled_from(["0", *"123456789"])) + rest
    if whole.startswith("0"):
        whole = "0"
    decimals = st.text("0123456789", min_size=1, max_size=20).map(lambda d: "." + d)
    fraction = draw(st.one_of(st.just(""), decimals))
    exponent = draw(
        st.one_of(
            st.just(""),
            st.builds(
                "{}{}{}".format,
                st.sampled_from(["e", "E"]),
                st.sampled_from(["", "+", "-"]),
                st.integers(0, 420).map(str) | st.integers(0, 420).map("0{}".format),
            ),
        )
    )
    return f"{sign}{whole}{fraction}{exponent}"


@settings(max_examples=1500, deadline=None)
@given(number_literals(), st.sampled_from(['{{"amount": {}}}', '{{"a": [1, {}]}}', '{{"a":{{"b":{}}}}}']))
@example("1" + "0" * 250 + "e60", '{{"amount": {}}}')  # a two-digit exponent on a long mantissa
@example("9" * 309 + ".5", '{{"amount": {}}}')
@example("1.8e308", '{{"amount": {}}}')
@example("1.7976931348623157e308", '{{"amount": {}}}')  # the largest float: held
def test_a_number_is_refused_exactly_when_no_float_can_hold_it(literal: str, shape: str) -> None:
    body = shape.format(literal).encode()
    too_large = ("." in literal or "e" in literal.lower()) and float(literal) in (float("inf"), float("-inf"))
    if too_large:
        with pytest.raises(Refused, match="too large"):
            parse_json(body)
    else:
        parse_json(body)


def test_text_that_only_looks_like_an_exponent_is_no_number() -> None:
    assert parse_json(b'{"iban": "DE02120300000000202051", "note": "x 1e400"}')["note"] == "x 1e400"
