"""``signoff.hooks._records.NamedTuple`` makes what ``typing.NamedTuple`` makes, without ``typing``."""

from __future__ import annotations

import pickle
import typing
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from signoff.hooks import _records
from signoff.hooks._gate import GateDecision, GateFailure, HttpCall, ToolCall


class Typed(typing.NamedTuple):
    """A record."""

    name: str
    count: int = 0
    extra: Mapping[str, Any] | None = None

    @property
    def doubled(self) -> int:
        return self.count * 2

    def describe(self) -> str:
        return f"{self.name}:{self.count}"

    @classmethod
    def build(cls, name: str) -> Typed:
        return cls(name, 1)


class Light(_records.NamedTuple):
    """A record."""

    name: str
    count: int = 0
    extra: Mapping[str, Any] | None = None

    @property
    def doubled(self) -> int:
        return self.count * 2

    def describe(self) -> str:
        return f"{self.name}:{self.count}"

    @classmethod
    def build(cls, name: str) -> Light:
        return cls(name, 1)


def test_the_same_shape_as_typing_makes() -> None:
    assert Light._fields == Typed._fields
    assert Light._field_defaults == Typed._field_defaults
    assert Light.__doc__ == Typed.__doc__
    assert Light.__module__ == Typed.__module__ == __name__
    assert Light.__qualname__ == "Light"
    assert list(Light.__annotations__) == list(Typed.__annotations__)
    assert typing.get_type_hints(Light) == typing.get_type_hints(Typed)
    assert issubclass(Light, tuple)
    assert Light.build("x") == ("x", 1, None)
    assert isinstance(Light.build("x"), Light)


@given(st.text(), st.integers(), st.none() | st.dictionaries(st.text(), st.integers()))
def test_records_behave_as_typing_records(name: str, count: int, extra: dict[str, int] | None) -> None:
    light, typed = Light(name, count, extra), Typed(name, count, extra)
    assert tuple(light) == tuple(typed)
    assert light == typed  # both are tuples
    assert repr(light) == repr(typed).replace("Typed(", "Light(")
    assert light._asdict() == typed._asdict()
    assert light._replace(count=count + 1) == typed._replace(count=count + 1)
    assert (light.doubled, light.describe()) == (typed.doubled, typed.describe())
    assert Light(name) == Typed(name)
    assert pickle.loads(pickle.dumps(light)) == light


def test_a_field_without_a_default_after_one_with_a_default_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default follows one with a default"):

        class Bad(_records.NamedTuple):
            first: int = 0
            second: int


def test_the_tuples_own_methods_are_not_overwritten() -> None:
    with pytest.raises(AttributeError, match="_replace"):

        class Bad(_records.NamedTuple):
            first: int

            def _replace(self) -> None: ...


def test_the_gate_records_are_records() -> None:
    decision = GateDecision(allowed=False, reason="no", failure=GateFailure.UNAVAILABLE)
    assert decision.decision == "deny"
    assert decision.pending is False
    assert repr(decision).startswith("GateDecision(allowed=False, reason='no'")
    assert HttpCall("GET", "/x", 1.0).params == {}
    call = ToolCall.build("t", {"a": 1}, runtime="r", session_id="s", tool_call_id="c")
    assert call.idempotency_key == "r:s:c"
    assert isinstance(call, tuple)
