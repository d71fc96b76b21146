"""A gate's ``when`` condition read around by spelling a value as a string.

A tool that takes ``force: bool`` runs ``"force": "true"`` as forced, and one that takes
``amount: int`` runs ``"90000"`` as 90,000 (Pydantic's lax mode, which the frameworks and
Python MCP servers validate arguments with), while to the condition a string is no boolean
and no number: ``args.force == true`` is simply false for ``"true"``, so the call ran with no
one asked. A condition that does not hold for the arguments as sent is evaluated again with
their strings read as booleans and numbers (``"1"`` and ``"0"`` once as each); any reading
that holds catches the call.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import SignoffConfig, parse_config
from signoff.hooks import HookContext
from tests.conftest import DEFAULT_CONFIG
from tests.redteam.support import ask, property_test

CONDITIONS = [
    "args.force == true",
    "args.force",
    "has(args.amount) && args.amount >= 50000",
    "args.amount > 100 && args.to != 'internal'",
    "args.limits.max == 0 || args.dry_run == false",
    "args.count >= 3.5",
    "args.force == true && args.amount >= 50000",
    "args.dry_run == false && args.count > 2",
]


def _gate(when: str) -> ConfirmationGate:
    return ConfirmationGate(type="confirmation_gate", tools=["*"], when=when, channel="chat", approvers=["a"])


def _ctx(args: dict[str, Any]) -> HookContext:
    return HookContext(agent_id="bot", tool_name="tool", arguments=args)


VALUES = st.one_of(
    st.booleans(),
    st.sampled_from([0, 1, 2, 3, 3.5, 100, 101, 49_999, 50_000, 90_000]),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.text(max_size=5),
)
ARGS = st.fixed_dictionaries(
    {},
    optional={
        "force": VALUES,
        "amount": VALUES,
        "to": st.sampled_from(["internal", "acme"]),
        "limits": st.fixed_dictionaries({"max": VALUES}),
        "dry_run": VALUES,
        "count": VALUES,
    },
)


def _spelled(value: Any, how: str) -> Any:
    """``value`` as a model may spell it: booleans and numbers as strings."""
    if isinstance(value, dict):
        return {k: _spelled(v, how) for k, v in value.items()}
    if isinstance(value, bool):
        text = "true" if value else "false"
        return {"lower": text, "upper": text.upper(), "word": "yes" if value else "no"}[how]
    if isinstance(value, int | float):
        return repr(value) if how != "word" else f" {value!r} "
    return value


@pytest.mark.parametrize("when", CONDITIONS)
@given(args=ARGS, how=st.sampled_from(["lower", "upper", "word"]))
@example(args={"force": True, "amount": 90_000}, how="lower")
@example(args={"dry_run": False, "count": 3, "limits": {"max": 1}}, how="word")
def test_a_condition_that_holds_for_the_values_holds_for_them_spelled_as_strings(
    when: str, args: dict[str, Any], how: str
) -> None:
    gate = _gate(when)
    typed = gate.condition(_ctx(args))
    spelled = gate.condition(_ctx(_spelled(args, how)))
    if typed is True:
        assert gate.matches(_ctx(_spelled(args, how))), (when, args, _spelled(args, how), spelled)


@pytest.mark.parametrize(
    ("when", "args"),
    [
        ("args.force == true", {"force": "no"}),
        ("args.force == true", {"force": "truthy"}),
        ("has(args.amount) && args.amount >= 50000", {"amount": 10}),
        ('args.version > "2"', {"version": "1"}),  # read as a number it cannot be compared: as sent
    ],
)
def test_a_reading_adds_no_catch_where_none_holds(when: str, args: dict[str, Any]) -> None:
    assert _gate(when).condition(_ctx(args)) is False


@pytest.fixture
def config() -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "forced deletes",
            "tools": ["delete_*"],
            "when": "args.force == true",
            "channel": "chat",
            "approvers": ["alice"],
            "timeout": "30m",
        }
    )
    return parse_config(body, source="test.yaml")


@property_test(15)
@given(force=st.sampled_from(["true", "True", "TRUE", " yes", "on", "1", "t", "Y"]))
async def test_a_forced_delete_spelled_as_a_string_is_asked_about(
    http: httpx.AsyncClient, agent_key: str, force: str
) -> None:
    answer = await ask(
        http, agent_key, {"tool_name": "delete_tree", "arguments": {"path": "/srv", "force": force}}
    )
    assert answer["decision"] == "pending", answer


async def test_an_unforced_delete_spelled_as_a_string_runs(http: httpx.AsyncClient, agent_key: str) -> None:
    answer = await ask(
        http, agent_key, {"tool_name": "delete_tree", "arguments": {"path": "/srv", "force": "false"}}
    )
    assert answer["decision"] == "allow", answer
