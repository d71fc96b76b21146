"""Who may vote, as properties: recognition by any spelling, and no approving one's own call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from signoff.app.config import ConfigError, SignoffConfig, identity_key, parse_config
from signoff.app.models import Vote
from signoff.app.requests.eligibility import (
    NOT_AN_APPROVER,
    NOT_HERE,
    OWN_CALL,
    GateSnapshot,
    Voter,
    eligible_gates,
    gate_refusal,
    is_requester,
    same_voter,
)

KEYS = st.from_regex(r"[a-z][a-z0-9_.-]{0,11}", fullmatch=True)
SPACE = st.text(alphabet=" \t\n\u00a0\u2003\u3000", max_size=3)
SLACK_SAFE = str.maketrans(".-_", "XYZ")
INVISIBLE = st.sampled_from(["", "\u200b", "\u200d", "\u2060", "\ufeff", "\u200e"])


@dataclass(frozen=True)
class Entry:
    key: str
    slack: str
    feishu: str
    email: str


@st.composite
def directories(draw: st.DrawFn) -> list[Entry]:
    keys = draw(st.lists(KEYS, min_size=1, max_size=5, unique_by=identity_key))
    entries = [
        Entry(key, f"U0{i}{key.upper().translate(SLACK_SAFE)}", f"ou_{i}{key}", f"{key}@corp{i}.example")
        for i, key in enumerate(keys)
    ]
    names = [identity_key(n) for e in entries for n in (e.key, e.slack, e.feishu, e.email)]
    assume(len(set(names)) == len(names))  # a directory where one spelling names two people is refused
    return entries


def config_of(entries: list[Entry]) -> SignoffConfig:
    people = {
        e.key: {"name": e.key.title(), "email": e.email, "slack": e.slack, "feishu": e.feishu}
        for e in entries
    }
    return parse_config({"people": people}, source="test.yaml")


@st.composite
def spellings(draw: st.DrawFn, text: str) -> str:
    """``text`` as someone might type it: any letter case, full-width forms, invisible
    characters inside, whitespace around."""
    out = []
    for ch in text:
        ch = draw(st.sampled_from([ch.lower(), ch.upper()]))
        if draw(st.booleans()) and "!" <= ch <= "~":
            ch = chr(ord(ch) + 0xFEE0)  # the full-width form, which NFKC maps back
        out.append(ch + draw(INVISIBLE))
    return draw(SPACE) + "".join(out) + draw(SPACE)


@st.composite
def someone_spelled(draw: st.DrawFn) -> tuple[list[Entry], Entry, str]:
    entries = draw(directories())
    who = draw(st.sampled_from(entries))
    name = draw(st.sampled_from([who.key, who.slack, who.feishu, who.email]))
    return entries, who, draw(spellings(name))


@given(someone_spelled())
def test_any_spelling_of_a_key_channel_id_or_email_recognises_that_person(
    case: tuple[list[Entry], Entry, str],
) -> None:
    entries, who, spelled = case
    assert config_of(entries).recognise(spelled) == who.key


@given(someone_spelled())
def test_a_clicker_is_recognised_by_their_channel_id_in_any_spelling(
    case: tuple[list[Entry], Entry, str],
) -> None:
    entries, who, _ = case
    config = config_of(entries)
    assert config.person_for("slack", f" {who.slack.lower()}\u200b") == who.key
    assert config.person_for("feishu", who.feishu.upper()) == who.key
    assert config.person_for("web", who.key.upper()) == who.key
    # An id is recognised on its own channel type only.
    assert config.person_for("feishu", who.slack) is None


def voters(config: SignoffConfig, who: Entry, email_spelling: str) -> list[Voter]:
    """``who`` voting every way there is: a Slack or Feishu click, an operator decision, and a
    second account unknown to the directory whose looked-up email is theirs."""
    return [
        Voter("ops-slack", who.slack, person=config.person_for("slack", who.slack)),
        Voter("ops-feishu", who.feishu, person=config.person_for("feishu", who.feishu)),
        Voter("web", who.key, person=config.person_for("web", who.key), operator=True),
        Voter("ops-slack", "U0SECONDACCOUNT", email=email_spelling),
    ]


@given(
    someone_spelled(),
    st.data(),
    st.booleans(),
    st.booleans(),
)
def test_the_requester_so_recognised_never_approves_their_own_call(
    case: tuple[list[Entry], Entry, str], data: st.DataObject, listed: bool, allow_self: bool
) -> None:
    entries, who, spelled = case
    config = config_of(entries)
    # The request records the requester as intake does: the directory key it recognises.
    requesters = (config.recognise(spelled) or spelled, spelled)
    gate = GateSnapshot(
        approvers=tuple(e.key for e in entries) if listed else (), allow_self_approval=allow_self
    )
    email = data.draw(spellings(who.email))
    for voter in voters(config, who, email):
        assert is_requester(requesters, voter, config)
        why = gate_refusal(gate, channel=voter.channel, requesters=requesters, voter=voter, config=config)
        if not allow_self:
            assert why is not None, voter
        elif voter.person is not None:
            assert why is None, voter  # a listed approver, allowed to approve their own call
        else:
            # Unknown to the directory: an approver only where the gate lists nobody.
            assert why == (NOT_AN_APPROVER if listed else None)


@given(directories(), st.data())
def test_someone_else_is_never_taken_for_the_requester(entries: list[Entry], data: st.DataObject) -> None:
    config = config_of(entries)
    requester = data.draw(st.sampled_from(entries))
    others = [e for e in entries if e is not requester]
    spelled = data.draw(spellings(data.draw(st.sampled_from([requester.key, requester.email]))))
    requesters = (config.recognise(spelled), spelled)
    gate = GateSnapshot(approvers=tuple(e.key for e in entries))
    for other in others:
        for voter in voters(config, other, other.email)[:3]:
            assert not is_requester(requesters, voter, config)
            why = gate_refusal(gate, channel=voter.channel, requesters=requesters, voter=voter, config=config)
            assert why is None


def test_one_identifier_may_name_only_one_person() -> None:
    people = {
        "dana": {"email": "dana@example.com", "slack": "U0DANA"},
        "eve": {"email": "DANA@example.com "},
        "U0dana": {},
    }
    with pytest.raises(ConfigError) as err:
        parse_config({"people": people}, source="test.yaml")
    assert err.value.problems == [
        "test.yaml: people.eve.email: 'DANA@example.com ' also names people.dana; every key, "
        "channel id and email (in any letter case) must belong to one person",
        "test.yaml: people.U0dana: 'U0dana' also names people.dana; every key, "
        "channel id and email (in any letter case) must belong to one person",
    ]


def test_an_unknown_requester_is_still_compared_in_any_spelling() -> None:
    config = parse_config({}, source="test.yaml")
    stranger = Voter("ops-slack", "U0STRANGER", email="s@example.com")
    gate = GateSnapshot()
    for spelled in ("u0stranger", " U0STRANGER ", "S@Example.com"):
        why = gate_refusal(
            gate, channel="ops-slack", requesters=(spelled, spelled), voter=stranger, config=config
        )
        assert why == OWN_CALL
    assert (
        gate_refusal(gate, channel="ops-slack", requesters=(None, None), voter=stranger, config=config)
        is None
    )


@given(directories(), st.data(), st.booleans())
def test_a_click_counts_only_on_the_channel_its_card_was_posted_to(
    entries: list[Entry], data: st.DataObject, listed: bool
) -> None:
    config = config_of(entries)
    who = data.draw(st.sampled_from(entries))
    gate = GateSnapshot(approvers=tuple(e.key for e in entries) if listed else ())
    for voter in voters(config, who, who.email):
        elsewhere = gate_refusal(gate, channel="finance-chat", requesters=(), voter=voter, config=config)
        # Operators, authenticated, decide wherever the card went; nobody else does.
        assert elsewhere == (None if voter.operator else NOT_HERE), voter


@given(directories(), st.data())
def test_a_vote_counts_for_exactly_the_gates_of_its_card_the_voter_may_approve(
    entries: list[Entry], data: st.DataObject
) -> None:
    config = config_of(entries)
    keys = [e.key for e in entries]
    channels = ["ops-slack", "ops-feishu", "finance-slack"]
    gates = data.draw(
        st.lists(
            st.builds(
                GateSnapshot,
                name=st.text(min_size=1, max_size=5),
                channel=st.sampled_from(channels),
                approvers=st.lists(st.sampled_from(keys), unique=True).map(tuple),
                allow_self_approval=st.booleans(),
            ),
            min_size=1,
            max_size=4,
        )
    )
    requester = data.draw(st.sampled_from([*entries, None]))
    requesters = (requester.key, requester.email) if requester else (None, None)
    who = data.draw(st.sampled_from(entries))
    for voter in voters(config, who, who.email):
        eligible, why = eligible_gates(gates, requesters=requesters, voter=voter, config=config)
        expected = [
            i
            for i, g in enumerate(gates)
            if (voter.operator or g.channel == voter.channel)
            and (not g.approvers or (voter.person is not None and voter.person in g.approvers))
            and (g.allow_self_approval or requester is not who)
        ]
        assert eligible == expected, (voter, gates)
        assert (why is None) == bool(expected)


_TWO_WORKSPACE_CHANNELS = {
    "channels": {
        "ops": {"type": "slack", "bot_token": "xoxb-1", "signing_secret": "s", "channel": "C0OPS"},
        "pager": {"type": "slack", "bot_token": "xoxb-1", "signing_secret": "s", "channel": "C0PAGER"},
        "mail": {"type": "email", "smtp_url": "smtp://127.0.0.1:25?starttls=false", "from": "s@example.com"},
    }
}


def _vote(voter: Voter) -> Vote:
    """The row ``voter``'s vote is recorded as."""
    return Vote(
        request_id="r",
        gate=0,
        voter=voter.key,
        verdict="approve",
        channel=voter.channel,
        user_id=voter.user_id,
        identity=dict(voter.identity or {}),
        created_at=datetime.now(UTC),
    )


@given(st.from_regex(r"[UW][A-Z0-9]{2,10}", fullmatch=True), st.data())
def test_one_account_is_one_voter_on_every_channel_of_its_type_in_any_spelling(
    account: str, data: st.DataObject
) -> None:
    """A card and its escalation in another conversation of one workspace: two clicks of one
    person are one vote, however the platform spells the id."""
    config = parse_config(_TWO_WORKSPACE_CHANNELS, source="test.yaml")
    first = Voter(channel=data.draw(st.sampled_from(["ops", "pager"])), user_id=account)
    again = Voter(channel=data.draw(st.sampled_from(["ops", "pager"])), user_id=data.draw(spellings(account)))
    assert same_voter(_vote(first), again, config)
    other = data.draw(st.from_regex(r"[UW][A-Z0-9]{2,10}", fullmatch=True))
    assume(identity_key(other) != identity_key(account))
    assert not same_voter(_vote(first), Voter(channel=again.channel, user_id=other), config)
    # An id of another platform is another account, whatever its spelling.
    assert not same_voter(_vote(first), Voter(channel="mail", user_id=account), config)


@given(st.emails(), st.emails())
def test_one_subject_of_the_identity_provider_is_one_voter_whatever_their_email(
    before: str, after: str
) -> None:
    config = parse_config({}, source="test.yaml")

    def signed_in(email: str, subject: str) -> Voter:
        identity = {"via": "console", "issuer": "https://idp.example", "subject": subject}
        return Voter(channel="web", user_id=email, identity=identity, aliases=(subject,))

    assert same_voter(_vote(signed_in(before, "sub-dana")), signed_in(after, "sub-dana"), config)
    assume(identity_key(before) != identity_key(after))
    assert not same_voter(_vote(signed_in(before, "sub-dana")), signed_in(after, "sub-erin"), config)
