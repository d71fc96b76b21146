"""What a Teams invoke is answered when the click's outcome is not known in time, or reading it
back failed, through POST /callbacks/teams/{channel}: the answer never claims an outcome the
click did not have (that a refused click is being recorded, or that a counted one was not)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import signoff.app.requests.clicks as clicks_module
from signoff.app.requests.eligibility import NOT_AN_APPROVER
from signoff.channels import Click, ClickOutcome
from tests.channels.teams_fake import FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    CHANNEL,
    MALLORY,
    ask,
    fake,
    posted,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server

URL = f"/callbacks/teams/{CHANNEL}"


def _text(answer: httpx.Response) -> str:
    body: dict[str, Any] = answer.json()
    return json.dumps(body.get("value"), ensure_ascii=False).lower()


async def test_a_slow_click_that_is_refused_was_never_said_to_be_recorded(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    channel = server.runtime.channels[CHANNEL]
    monkeypatch.setattr(channel, "_reply_budget", 0.05)
    handler = server.runtime.clicks
    real = handler.click
    release, applied = asyncio.Event(), asyncio.Event()

    async def slow(name: str, click: Click) -> ClickOutcome:
        await release.wait()  # another click holds the request, say
        try:
            return await real(name, click)
        finally:
            applied.set()

    monkeypatch.setattr(handler, "click", slow)
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=MALLORY, reply_to=card_id))
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 200
    release.set()
    await asyncio.wait_for(applied.wait(), 5)
    votes, events = await votes_and_audit(server, rid)
    assert votes == []
    [refusal] = [e for e in events if e.action == "vote_refused"]
    assert refusal.detail["why"] == NOT_AN_APPROVER
    # Mallory was told before the outcome was known: nothing in it may say it counts.
    text = _text(answer)
    assert "recording your decision" not in text, text


async def test_a_counted_click_whose_card_could_not_be_read_back_is_not_called_unrecorded(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)

    async def unavailable(*_: object, **__: object) -> list[Any]:
        raise ConnectionResetError("database connection lost after the commit")

    # The vote commits; reading the votes back for the card fails.
    monkeypatch.setattr(clicks_module, "votes_for", unavailable)
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 200
    votes, _ = await votes_and_audit(server, rid)
    assert [(v.voter, v.verdict) for v in votes] == [("alice", "approve")]
    state = await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})
    assert state.json()["status"] == "approved"
    text = _text(answer)
    assert "could not be recorded" not in text, text
