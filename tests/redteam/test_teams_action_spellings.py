"""A Teams invoke carrying a validly signed token counts only as the card's own Approve from
the card's own conversation, through POST /callbacks/teams/{channel}: any other spelling of
the verb, the request id, the conversation or the action's data, and an edit on a gate that
lets no argument change, records no vote and never answers 5xx. Alice is an approver of the
payments gate (quorum 1): any spelling that slipped through would decide the request."""

from __future__ import annotations

from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from tests.channels.teams_fake import CONVERSATION, TENANT, FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    CHANNEL,
    ask,
    fake,
    posted,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server
from tests.redteam.support import property_test

URL = f"/callbacks/teams/{CHANNEL}"
PROPERTY = property_test(30)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _spellings(word: str) -> st.SearchStrategy[Any]:
    """Other spellings of ``word``: its case, surrounding and inner blanks, look-alike letters,
    full-width forms, it wrapped in a list or an object, and any other JSON."""
    return st.one_of(
        st.sampled_from(
            [
                word.upper(),
                word.capitalize(),
                f" {word}",
                f"{word} ",
                f"{word}\n",
                f"{word}\u200b",
                word.replace("a", "\u0430").replace("e", "\u0435").replace("o", "\u043e"),
                "".join(chr(ord(c) + 0xFEE0) for c in word),
                [word],
                {"verb": word},
                f"{word}_all",
            ]
        ),
        JSON_VALUES,
    ).filter(lambda v: v != word)


async def _pending(http: httpx.AsyncClient, agent_key: str, bot: FakeBotFramework) -> tuple[str, str]:
    rid = await ask(http, agent_key)
    cards = await posted(bot)
    return rid, cards[-1]


async def _nothing_counted(server: Server, rid: str, answer: httpx.Response) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == [], [(v.user_id, v.verdict) for v in votes]


@PROPERTY
@given(verb=_spellings("approve"))
async def test_another_spelling_of_the_verb_counts_for_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    verb: Any,
) -> None:
    server, http = teams_server
    rid, card_id = await _pending(http, agent_key, fake)
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    activity["value"]["action"]["verb"] = verb
    answer = await http.post(URL, content=fake.invoke(activity)[0], headers=fake.invoke(activity)[1])
    await _nothing_counted(server, rid, answer)


@PROPERTY
@given(
    spell=st.sampled_from(
        [
            str.upper,
            lambda r: f" {r}",
            lambda r: f"{r}\n",
            lambda r: f"{r}\u200b",
            lambda r: r.replace("a", "\u0430"),
            lambda r: [r],
            lambda r: {"request_id": r},
            lambda r: r[:-1],
        ]
    )
)
async def test_another_spelling_of_the_request_id_counts_for_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    spell: Any,
) -> None:
    server, http = teams_server
    rid, card_id = await _pending(http, agent_key, fake)
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    spelt = spell(rid)
    if spelt == rid:
        return  # a request id without the letter the spelling changes
    activity["value"]["action"]["data"]["request_id"] = spelt
    answer = await http.post(URL, content=fake.invoke(activity)[0], headers=fake.invoke(activity)[1])
    await _nothing_counted(server, rid, answer)


CONVERSATIONS = st.one_of(
    st.sampled_from(
        [
            CONVERSATION.upper(),
            f" {CONVERSATION}",
            f"{CONVERSATION} ",
            f"{CONVERSATION}\n",
            f"{CONVERSATION}\u200b",
            f"{CONVERSATION};messageid=abc",
            f"{CONVERSATION};messageid=1;x",
            f"{CONVERSATION}x;messageid=1",
            CONVERSATION.replace("@thread.tacv2", "@thread.skype"),
            CONVERSATION.replace("c0ffee", "c0ff\u0435e"),
            f"a:1{CONVERSATION}",
            "19:other@thread.tacv2",
            f"{TENANT}",
        ]
    ),
    st.text(max_size=40),
)


@PROPERTY
@given(conversation=CONVERSATIONS)
async def test_a_card_action_from_another_conversation_counts_for_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    conversation: str,
) -> None:
    server, http = teams_server
    rid, card_id = await _pending(http, agent_key, fake)
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    activity["conversation"]["id"] = conversation
    activity["channelData"]["channel"]["id"] = conversation
    answer = await http.post(URL, content=fake.invoke(activity)[0], headers=fake.invoke(activity)[1])
    await _nothing_counted(server, rid, answer)


@PROPERTY
@given(
    name=st.sampled_from(["amount", "Amount", "amount ", "\u0430mount", "amount\u200b", "memo", "to"]),
    kind=st.sampled_from(["json", "text", "JSON", "", "number"]),
    value=st.sampled_from(["1", '"80000"', "[80000]", "x", "{}"]),
    grant=st.sampled_from([None, "once", '{"scope":"agent","seconds":3600}']),
)
async def test_an_edit_on_a_gate_that_lets_nothing_change_counts_for_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    name: str,
    kind: str,
    value: str,
    grant: str | None,
) -> None:
    server, http = teams_server
    rid, card_id = await _pending(http, agent_key, fake)
    data: dict[str, Any] = {"edit": [[name, kind]], "edit_0": value}
    if grant is not None:
        data["grant"] = grant
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id, data=data)
    answer = await http.post(URL, content=fake.invoke(activity)[0], headers=fake.invoke(activity)[1])
    await _nothing_counted(server, rid, answer)


async def test_the_cards_own_action_from_a_thread_of_its_conversation_counts(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    """The control: the same invoke, as the card sends it, decides."""
    server, http = teams_server
    rid, card_id = await _pending(http, agent_key, fake)
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    assert activity["conversation"]["id"] == f"{CONVERSATION};messageid={card_id}"
    answer = await http.post(URL, content=fake.invoke(activity)[0], headers=fake.invoke(activity)[1])
    assert answer.status_code == 200
    votes, _ = await votes_and_audit(server, rid)
    assert [(v.voter, v.verdict) for v in votes] == [("alice", "approve")]
