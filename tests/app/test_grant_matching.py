"""The rules a grant matches calls by, over generated calls (hypothesis): never wider than given."""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from signoff.app.builtin_hooks._names import tool_key
from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import parse_config
from signoff.app.models import Grant, utcnow
from signoff.app.requests.grants import covers, field_digest, meet
from signoff.channels import GrantChoice
from signoff.hooks import HookContext
from tests.conftest import DEFAULT_CONFIG

CONFIG = parse_config(DEFAULT_CONFIG, source="test.yaml")
GATE = ConfirmationGate.model_validate(
    {"tools": ["*"], "channel": "chat", "grants": [{"scope": "session", "for": "1h", "same": ["to"]}]}
)
AGENT_GATE = ConfirmationGate.model_validate(
    {"tools": ["*"], "channel": "chat", "grants": [{"scope": "agent", "for": "1h"}]}
)

GRANTOR = {
    "voter": "alice",
    "person": "alice",
    "channel": "web",
    "user_id": "alice",
    "assurance": "admin_token",
}
"""An operator through the operator API, whom any gate without approvers takes."""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
names = st.text(min_size=1, max_size=30)


def grant(
    *,
    tool: str = "transfer_funds",
    session: str | None = "s-1",
    scope: str = "session",
    arguments: dict[str, Any] | None = None,
    same: tuple[str, ...] = ("to",),
) -> Grant:
    args = arguments if arguments is not None else {"to": "acme"}
    now = utcnow()
    return Grant(
        id="g1",
        request_id="r1",
        agent_id="finance-bot",
        scope=scope,
        session_id=session if scope == "session" else None,
        tool_name=tool,
        gate="gate",
        same={name: field_digest(args, name) for name in same},
        same_shown={},
        granted_by="Alice",
        grantors=[GRANTOR],
        created_at=now,
        expires_at=now + timedelta(hours=1),
    )


def call(
    *,
    tool: str = "transfer_funds",
    session: str | None = "s-1",
    agent: str = "finance-bot",
    arguments: dict[str, Any] | None = None,
) -> HookContext:
    return HookContext(
        agent_id=agent,
        tool_name=tool,
        arguments=arguments if arguments is not None else {"to": "acme"},
        session_id=session,
    )


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@given(approved=json_values, later=json_values)
@settings(max_examples=300, deadline=None)
def test_a_same_field_matches_exactly_when_its_canonical_json_is_equal(approved: Any, later: Any) -> None:
    g = grant(arguments={"to": approved})
    matched = covers(g, GATE, call(arguments={"to": later, "other": 1}), CONFIG)
    assert matched == (canonical(approved) == canonical(later))


@given(value=st.integers(min_value=-(10**6), max_value=10**6))
def test_numbers_text_and_booleans_never_stand_for_each_other(value: int) -> None:
    g = grant(arguments={"to": value})
    assert covers(g, GATE, call(arguments={"to": value}), CONFIG)
    for other in (str(value), float(value), value != 0, [value]):
        assert not covers(g, GATE, call(arguments={"to": other}), CONFIG), other


@given(text=st.text(min_size=1))
def test_text_is_compared_as_sent(text: str) -> None:
    for form in ("NFC", "NFD", "NFKC"):
        other = unicodedata.normalize(form, text)
        g = grant(arguments={"to": text})
        assert covers(g, GATE, call(arguments={"to": other}), CONFIG) == (other == text)


@given(tool=names, other=names)
@settings(max_examples=300)
def test_a_grant_covers_its_tool_as_named_and_no_other(tool: str, other: str) -> None:
    assume(other != tool)
    g = grant(tool=tool)
    assert covers(g, GATE, call(tool=tool), CONFIG)
    assert not covers(g, GATE, call(tool=other), CONFIG)


@given(tool=st.sampled_from(["transfer_funds", "pay_invoice", "Bash"]), variant=st.sampled_from(range(5)))
def test_look_alike_spellings_that_one_gate_catches_are_still_other_tools_to_a_grant(
    tool: str, variant: int
) -> None:
    spelled = [
        tool.upper(),
        tool[:1] + "\u200b" + tool[1:],  # a zero-width space
        tool.replace("a", "\u0430"),  # Cyrillic a
        " " + tool,
        unicodedata.normalize("NFKC", tool).replace("s", "\uff53"),  # full-width s
    ][variant]
    assume(spelled != tool)
    assert tool_key(spelled) == tool_key(tool), "the gate sees one tool"
    assert not covers(grant(tool=tool), GATE, call(tool=spelled), CONFIG), (
        "the grant allows only the one named"
    )


@given(session=names, other=st.none() | names)
def test_a_session_grant_covers_its_session_only(session: str, other: str | None) -> None:
    g = grant(session=session)
    assert covers(g, GATE, call(session=session), CONFIG)
    assert covers(g, GATE, call(session=other), CONFIG) == (other == session)


@given(session=st.none() | names, agent=names)
def test_an_agent_grant_covers_every_session_of_its_agent_and_no_other_agent(
    session: str | None, agent: str
) -> None:
    g = grant(scope="agent", same=())
    assert covers(g, AGENT_GATE, call(session=session), CONFIG)
    assert covers(g, AGENT_GATE, call(session=session, agent=agent), CONFIG) == (agent == "finance-bot")


def test_a_grant_wider_than_every_offer_of_its_gate_covers_nothing() -> None:
    assert not covers(grant(scope="agent", same=("to",)), GATE, call(), CONFIG), "scope wider"
    assert not covers(grant(same=()), GATE, call(), CONFIG), "fewer fields held equal"
    assert covers(grant(same=("to", "memo")), GATE, call(), CONFIG), "narrower is fine"


def _gate(**fields: Any) -> ConfirmationGate:
    offer = {"scope": "session", "for": "1h", "same": ["to"]}
    return ConfirmationGate.model_validate({"tools": ["*"], "channel": "chat", "grants": [offer], **fields})


def _by(*grantors: dict[str, Any]) -> Grant:
    g = grant()
    g.grantors = list(grantors)
    return g


CLICK = {"voter": "bob", "person": "bob", "channel": "chat", "user_id": "U_BOB", "assurance": "slack_signed"}
SIGNED_IN = {
    "voter": "web:oidc:1",
    "person": None,
    "channel": "web",
    "user_id": "dana",
    "assurance": "oidc",
    "identity": {"via": "console", "issuer": "https://id.example", "subject": "s-9", "groups": ["payments"]},
    "aliases": ["s-9"],
}


def test_a_grant_holds_while_the_gate_would_take_its_grantors_approval() -> None:
    """Each rule a vote is taken by, applied to the grantors against the gate as it is now."""
    assert covers(_by(CLICK), _gate(), call(), CONFIG), "anyone who sees the card"
    assert covers(_by(CLICK), _gate(approvers=["bob"]), call(), CONFIG)
    assert not covers(_by(CLICK), _gate(approvers=["alice"]), call(), CONFIG), "no longer an approver"
    assert not covers(_by(CLICK), _gate(channel="elsewhere"), call(), CONFIG), "its cards go elsewhere now"
    assert covers(_by(GRANTOR), _gate(channel="elsewhere"), call(), CONFIG), "operators decide anywhere"
    assert not covers(_by(CLICK), _gate(quorum=2), call(), CONFIG), "one grantor for a quorum of two"
    assert covers(_by(CLICK, GRANTOR), _gate(quorum=2), call(), CONFIG)
    assert covers(_by(CLICK), _gate(min_assurance="slack_signed"), call(), CONFIG)
    assert not covers(_by(CLICK), _gate(min_assurance="oidc"), call(), CONFIG), "identified less surely"
    assert covers(_by(SIGNED_IN), _gate(approvers=["group:payments"]), call(), CONFIG)
    assert not covers(_by(SIGNED_IN), _gate(approvers=["group:treasury"]), call(), CONFIG)
    assert not covers(_by(SIGNED_IN), _gate(approvers=["dana"]), call(), CONFIG), (
        "a username is no channel id"
    )
    escalated = [{"after": "10m", "channel": "chat", "approvers": ["bob"]}]
    assert covers(_by(CLICK), _gate(approvers=["alice"], escalate=escalated), call(), CONFIG)


def test_a_grant_stored_without_its_grantors_level_is_below_every_level() -> None:
    old = {k: v for k, v in CLICK.items() if k != "assurance"}
    assert covers(_by(old), _gate(), call(), CONFIG)
    assert not covers(_by(old), _gate(min_assurance="email_link"), call(), CONFIG)


def test_a_grantor_never_counts_for_their_own_call_where_the_gate_forbids_it() -> None:
    mine = HookContext(
        agent_id="finance-bot",
        tool_name="transfer_funds",
        arguments={"to": "acme"},
        session_id="s-1",
        user_id="U_BOB",
    )
    assert not covers(_by(CLICK), _gate(), mine, CONFIG)
    assert covers(_by(CLICK, GRANTOR), _gate(), mine, CONFIG), "the other grantor makes the quorum"
    assert covers(_by(CLICK), _gate(allow_self_approval=True), mine, CONFIG)


def test_a_grant_ends_when_its_offer_is_shortened_below_its_age() -> None:
    g = grant()
    g.created_at -= timedelta(minutes=40)
    assert covers(g, _gate(), call(), CONFIG)
    shorter = _gate(grants=[{"scope": "session", "for": "30m", "same": ["to"]}])
    assert not covers(g, shorter, call(), CONFIG)
    assert covers(g, shorter, call(), CONFIG, now=g.created_at + timedelta(minutes=29))


def test_an_unknown_scope_covers_nothing() -> None:
    assert not covers(grant(scope="everyone", same=()), GATE, call(), CONFIG)


choices = st.builds(
    GrantChoice,
    scope=st.sampled_from(["session", "agent"]),
    seconds=st.integers(min_value=1, max_value=10**6),
    same=st.lists(st.sampled_from(["to", "amount", "memo", "account"]), max_size=4).map(tuple),
)


@given(picked=st.lists(choices, min_size=1, max_size=4))
def test_the_grant_of_a_quorum_is_within_every_approvers_choice(picked: list[GrantChoice]) -> None:
    narrowest = meet(picked)
    for choice in picked:
        assert narrowest.seconds <= choice.seconds
        assert set(narrowest.same) >= set(choice.same)
        assert choice.scope == "agent" or narrowest.scope == "session"
    assert narrowest in picked or len({(c.scope, c.seconds, c.same) for c in picked}) > 1
    assert meet(list(reversed(picked))) == narrowest
    assert meet([narrowest]) == narrowest
