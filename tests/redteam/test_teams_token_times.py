"""A Bot Framework token whose time claims are no finite number of seconds is refused, through
POST /callbacks/teams/{channel}: ``exp`` or ``nbf`` NaN (which no comparison finds past or
future), infinite, text or a boolean, and no vote is recorded."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from tests.channels.teams_fake import FakeBotFramework
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

TIMES: list[dict[str, Any]] = [
    {"exp": math.nan},
    {"exp": math.inf},
    {"exp": True},
    {"exp": "9999999999"},
    {"nbf": math.nan},
    {"nbf": -math.inf},
    {"nbf": "0"},
]


async def test_time_claims_that_are_no_finite_number_are_refused(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    for changes in TIMES:
        token = fake.sign(fake.claims(**changes))
        body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id), token=token)
        answer = await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)
        assert answer.status_code == 401, (changes, answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == []
    # The control: a token valid for years (a whole number far off) still verifies.
    token = fake.sign(fake.claims(exp=10**12))
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id), token=token)
    assert (await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)).status_code == 200
    votes, _ = await votes_and_audit(server, rid)
    assert [v.voter for v in votes] == ["alice"]


@pytest.mark.parametrize("exp", [10**400])
async def test_a_whole_number_beyond_a_float_is_no_500(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    exp: int,
) -> None:
    _, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    token = fake.sign(fake.claims(exp=exp))
    body, headers = fake.invoke(fake.activity(rid, "reject", aad=ALICE, reply_to=card_id), token=token)
    answer = await http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers)
    assert answer.status_code < 500, answer.text
