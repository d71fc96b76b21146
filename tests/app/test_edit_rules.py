"""The rules an approver's changes must pass (:mod:`signoff.app.requests.edits`), as properties: whatever
is tried, a field the gates do not list, a redacted field, an oversized or non-JSON value, or a
change that would carry the call past a stricter gate is refused."""

from __future__ import annotations

import copy
import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import ConfirmationRequest, Status, from_row, utcnow
from signoff.app.redaction import redactor
from signoff.app.requests.edits import changed_fields, edit_refusal
from signoff.app.requests.eligibility import GateSnapshot
from signoff.channels import (
    MAX_EDIT_BYTES,
    MAX_EDIT_VALUE_BYTES,
    CallbackRejected,
    Click,
    Verdict,
    edit_problem,
)
from signoff.channels._contract import GrantChoice
from tests.conftest import DEFAULT_CONFIG

EDITABLE = ("amount", "memo", "to")
RAW: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
RAW["agents"]["finance-bot"]["hooks"] = [
    {
        "type": "confirmation_gate",
        "name": "sends",
        "tools": ["send_*"],
        "when": "args.amount >= 1000",
        "channel": "chat",
        "approvers": ["alice"],
        "editable": list(EDITABLE),
    },
    {
        "type": "confirmation_gate",
        "name": "treasury",
        "tools": ["send_*"],
        "when": "args.amount >= 1000000",
        "channel": "chat",
        "approvers": ["carol"],
    },
    {
        "type": "confirmation_gate",
        "name": "by key",
        "tools": ["send_*"],
        "when": "args.api_token == 'root-key'",
        "channel": "chat",
        "approvers": ["carol"],
    },
]
CONFIG: SignoffConfig = parse_config(RAW)
WITHOUT_KEY_GATE: SignoffConfig = parse_config(
    {**RAW, "agents": {"finance-bot": {"hooks": RAW["agents"]["finance-bot"]["hooks"][:2]}}}
)
GATE = GateSnapshot(key="sends", name="sends", channel="chat", approvers=("alice",), editable=EDITABLE)
ARGUMENTS = {"to": "acme", "amount": 90000, "memo": "invoice 7", "api_token": "[redacted]"}
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def request(arguments: dict[str, Any] = ARGUMENTS, gate: GateSnapshot = GATE) -> ConfirmationRequest:
    now = utcnow()
    return from_row(
        ConfirmationRequest,
        {
            "id": "r1",
            "agent_id": "finance-bot",
            "tool_name": "send_payment",
            "arguments": arguments,
            "user_id": None,
            "session_id": "s-1",
            "tool_call_id": None,
            "request_metadata": {},
            "gate": gate.stored(),
            "gates": [gate.stored()],
            "channel": "chat",
            "status": Status.PENDING,
            "created_at": now,
            "expires_at": now + timedelta(minutes=30),
            "approved_arguments": None,
        },
    )


def refusal(
    changes: dict[str, Any],
    *,
    req: ConfirmationRequest | None = None,
    config: SignoffConfig = WITHOUT_KEY_GATE,
    grant: GrantChoice | None = None,
) -> str | None:
    req = req or request()
    return edit_refusal(req, [GATE], [0], changed_fields(req.arguments, changes), config, grant=grant)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
plain_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)


@FAST
@given(name=st.text(min_size=1, max_size=40).filter(lambda n: n not in EDITABLE), value=json_values)
def test_a_field_the_gate_does_not_list_is_refused(name: str, value: Any) -> None:
    changes = {name: value}
    if name in ARGUMENTS and changed_fields(ARGUMENTS, changes) == {}:
        return  # its proposed value: no change
    why = refusal(changes)
    assert why is not None
    assert "cannot be changed" in why or "is not an argument field name" in why or "new value" in why


@FAST
@given(
    word=st.sampled_from(["password", "secret", "token", "api_key", "credential", "cookie"]),
    prefix=st.sampled_from(["", "x_", "my-", "Stripe "]),
    upper=st.booleans(),
    value=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=10),
)
def test_a_redacted_field_is_refused_even_when_a_gate_lists_it(
    word: str, prefix: str, upper: bool, value: str
) -> None:
    field = prefix + (word.upper() if upper else word)
    gate = GATE.model_copy(update={"editable": (*EDITABLE, field)})
    req = request(gate=gate)
    why = edit_refusal(req, [gate], [0], {field: value}, WITHOUT_KEY_GATE)
    assert why == f"{field} is redacted, so it cannot be changed."


@FAST
@given(size=st.integers(MAX_EDIT_VALUE_BYTES - 1, MAX_EDIT_VALUE_BYTES * 3), wide=st.booleans())
def test_an_oversized_value_is_refused(size: int, wide: bool) -> None:
    text = ("é" if wide else "a") * (size // (2 if wide else 1))
    changes = {"memo": text}
    problem = edit_problem(changes)
    if len(text.encode()) + 2 > MAX_EDIT_VALUE_BYTES:
        assert problem is not None
        assert "bytes" in problem
        assert refusal(changes) == problem
        with pytest.raises(CallbackRejected):
            Click("r1", Verdict.APPROVE, "U1", arguments=changes)
    else:
        assert problem is None


@FAST
@given(parts=st.integers(5, 10))
def test_values_over_the_total_limit_are_refused(parts: int) -> None:
    changes = {f"f{i}": "a" * (MAX_EDIT_VALUE_BYTES - 10) for i in range(parts)}
    assert parts * (MAX_EDIT_VALUE_BYTES - 8) > MAX_EDIT_BYTES
    problem = edit_problem(changes)
    assert problem is not None
    assert "together" in problem


@FAST
@given(
    bad=st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.binary(max_size=5),
        st.sets(st.integers(), max_size=3),
        st.tuples(st.integers()),
        st.builds(object),
        st.text(min_size=1).map(lambda t: t + "\x00"),
        st.just("\ud800"),
    ),
    nest=st.integers(0, 3),
)
def test_a_value_that_is_not_storable_json_is_refused(bad: Any, nest: int) -> None:
    value: Any = bad
    for _ in range(nest):
        value = {"inner": [value]}
    problem = edit_problem({"memo": value})
    assert problem is not None
    assert problem.startswith("The new value of memo")
    assert refusal({"memo": value}) == problem
    with pytest.raises(CallbackRejected):
        Click("r1", Verdict.APPROVE, "U1", arguments={"memo": value})


@FAST
@given(amount=st.integers(-(10**9), 10**9) | st.floats(allow_nan=False, allow_infinity=False))
def test_an_edit_never_carries_the_call_past_the_stricter_gate_unseen(amount: float) -> None:
    why = refusal({"amount": amount})
    if amount >= 1_000_000:
        assert why is not None
        assert "'treasury'" in why
    else:
        assert why is None, "lowering the amount out of this gate's own reach is the approver's call"


not_numbers = st.none() | st.booleans() | plain_text | st.lists(st.integers(), max_size=3)
SECRETS = redactor(WITHOUT_KEY_GATE.redact_words("finance-bot"))
"""A value that looks like a secret (``{"TOKEN": 0}``) is refused first, for that reason."""


@FAST
@given(
    amount=(not_numbers | st.dictionaries(plain_text, st.integers(), max_size=2)).filter(
        lambda v: SECRETS.value(v) == v
    )
)
def test_an_edit_leaving_a_gates_condition_unevaluable_counts_as_reaching_it(amount: Any) -> None:
    why = refusal({"amount": amount})
    assert why is not None, "the treasury gate cannot tell: fail closed"
    assert "'treasury'" in why


words = st.text(st.characters(codec="ascii", categories=["L"]), min_size=1, max_size=12)


@FAST
@given(field=st.sampled_from(["memo", "to"]), value=words)
def test_a_condition_reading_a_redacted_field_counts_as_reaching_the_call(field: str, value: str) -> None:
    if ARGUMENTS[field] == value:
        return
    assert refusal({field: value}, config=WITHOUT_KEY_GATE) is None
    why = refusal({field: value}, config=CONFIG)
    assert why is not None, "its value is not known here: fail closed"
    assert "'by key'" in why


@FAST
@given(value=words, held=st.sampled_from([(), ("memo",), ("to",), ("memo", "to")]))
def test_no_grant_goes_with_a_change(value: str, held: tuple[str, ...]) -> None:
    grant = GrantChoice("agent", 600, held)
    if ARGUMENTS["memo"] == value:
        assert refusal({"memo": value}, grant=grant) is None  # no change: an approval as asked
        return
    why = refusal({"memo": value}, grant=grant)
    assert why is not None
    assert "a grant cannot be given with them" in why


def test_an_edit_with_a_vote_that_does_not_decide_alone_is_refused() -> None:
    other = GateSnapshot(key="other", name="other", channel="elsewhere", editable=EDITABLE)
    req = request()
    why = edit_refusal(req, [GATE, other], [0], {"amount": 5000}, WITHOUT_KEY_GATE)
    assert why is not None
    assert "decides the request alone" in why
    quorum = GATE.model_copy(update={"quorum": 2})
    assert "decides the request alone" in (
        edit_refusal(req, [quorum], [0], {"amount": 5}, WITHOUT_KEY_GATE) or ""
    )
