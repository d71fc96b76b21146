"""``shown_ids``: the one rule by which votes and audit events are shown outside the database.
Whatever mix of votes and events, an id of a channel type whose ids are secrets (an ntfy topic)
is shown as its voter's directory key or ``(not shown)``, never as itself, and every other id
is shown as it is."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from signoff.app.channel_types import CHANNEL_TYPES
from signoff.app.models import AuditEvent, Vote
from signoff.app.requests.eligibility import NOT_SHOWN, shown_ids
from signoff.channels import Assurance

SECRET = {
    k.identity.assurance.value
    for k in CHANNEL_TYPES.values()
    if k.identity.secret_ids and k.identity.assurance
}
TOPICS = st.text("ABCXYZ0123456789-_", min_size=8, max_size=20)
KEYS = st.text("abcdefgh", min_size=1, max_size=8)
LEVELS = st.sampled_from([None, *(a.value for a in Assurance)])


@st.composite
def _votes(draw: st.DrawFn) -> Vote:
    user_id, assurance = draw(TOPICS), draw(LEVELS)
    voter = draw(st.one_of(KEYS, st.just(f"phone:{user_id}")))
    return Vote(
        request_id="r",
        gate=0,
        voter=voter,
        channel="phone",
        user_id=user_id,
        verdict="approve",
        assurance=assurance,
    )


@st.composite
def _events(draw: st.DrawFn) -> AuditEvent:
    detail: dict[str, object] = {"assurance": draw(LEVELS)}
    if draw(st.booleans()):
        detail["person"] = draw(st.one_of(KEYS, TOPICS.map(lambda t: f"phone:{t}")))
    return AuditEvent(action="vote_refused", actor_channel="phone", actor_id=draw(TOPICS), detail=detail)


def test_ntfy_ids_are_secret() -> None:
    assert Assurance.NTFY_LINK.value in SECRET


@given(st.lists(_votes(), max_size=6), st.lists(_events(), max_size=6))
def test_a_secret_id_is_shown_as_its_person_or_not_at_all(
    votes: list[Vote], events: list[AuditEvent]
) -> None:
    shown = shown_ids(votes, events)
    secret = {v.user_id for v in votes if v.assurance in SECRET}
    secret |= {e.actor_id for e in events if e.detail.get("assurance") in SECRET and e.actor_id}
    assert set(shown) == secret
    for value in shown.values():
        assert value == NOT_SHOWN or (":" not in value and value not in secret)
    for v in votes:
        if v.assurance in SECRET:
            assert shown[v.user_id] in {w.voter for w in votes if w.user_id == v.user_id} | {NOT_SHOWN}
        elif v.user_id not in secret:
            assert v.user_id not in shown  # an id nobody keeps secret is shown as it is
