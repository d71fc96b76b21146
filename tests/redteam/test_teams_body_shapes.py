"""Bodies of every size and shape to the Teams messaging endpoint, with a valid token or none,
through POST /callbacks/teams/{channel}: too large is 413 before the token is looked at,
nested past the JSON parser's depth or not JSON is 400 after it, a JSON value that is not an
activity is 400, and nothing ever counts or answers 5xx."""

from __future__ import annotations

import json

import httpx
import pytest

from signoff.channels.teams._channel import MAX_BODY_BYTES
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

URL = f"/callbacks/teams/{CHANNEL}"


@pytest.mark.parametrize("signed", [True, False])
async def test_bodies_that_are_no_activity_count_for_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    signed: bool,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    real, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
    if not signed:
        del headers["authorization"]
    activity = json.loads(real)
    padded = {**activity, "padding": "x" * MAX_BODY_BYTES}
    bodies = {
        "too large": (json.dumps(padded).encode(), 413),
        "nested past the parser": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 413),
        "nested, within the size": (b"[" * 20_000 + b"]" * 20_000, 400),
        "not JSON": (b"\xff\xfe{", 400),
        "a list": (b"[" + real + b"]", 400),
        "a string": (json.dumps(real.decode()).encode(), 400),
        "empty": (b"", 400),
    }
    for what, (body, status) in bodies.items():
        answer = await http.post(URL, content=body, headers=headers)
        expected = status if signed or status == 413 else 401
        assert answer.status_code == expected, (what, answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == []
