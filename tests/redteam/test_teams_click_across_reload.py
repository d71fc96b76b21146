"""A Teams click on its way while a reload removes its channel does not count from another
conversation, through POST /callbacks/teams/{channel} and Runtime.reload: with the channel gone
nothing can say where its card was, so the click is refused rather than let through
unchecked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from signoff.channels import Click, ClickOutcome
from tests.channels.teams_fake import FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    CHANNEL,
    ask,
    fake,
    posted,
    teams_config,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server


@pytest.mark.parametrize("conversation", ["19:elsewhere@thread.tacv2", None])
async def test_a_click_whose_channel_is_removed_meanwhile_does_not_count_from_elsewhere(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    conversation: str | None,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    await posted(fake)
    handler = server.runtime.clicks
    real = handler.click
    arrived, release, applied = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def held(name: str, click: Click) -> ClickOutcome:
        arrived.set()
        await release.wait()  # the click waits (on the request's lock, a member look-up) …
        try:
            return await real(name, click)
        finally:
            applied.set()

    monkeypatch.setattr(handler, "click", held)
    # Alice, an approver, presses a copy of the card forwarded to another chat.
    activity = fake.activity(rid, "approve", aad=ALICE, conversation="19:elsewhere@thread.tacv2")
    if conversation is None:
        del activity["conversation"]["id"]
    body, headers = fake.invoke(activity)
    answer = asyncio.create_task(http.post(f"/callbacks/teams/{CHANNEL}", content=body, headers=headers))
    await asyncio.wait_for(arrived.wait(), 5)
    # … while the configuration is reloaded without the Teams channel.
    raw: dict[str, Any] = teams_config(fake)
    del raw["channels"][CHANNEL]
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = "chat"
    path = tmp_path / "signoff.yaml"
    path.write_text(yaml.safe_dump(raw))
    reload = asyncio.create_task(server.runtime.reload(path))
    while CHANNEL in server.runtime.channels and not reload.done():
        await asyncio.sleep(0)  # the swap; then the old channel waits for its clicks to finish
    release.set()
    await asyncio.wait_for(applied.wait(), 5)
    reloaded = await reload
    assert reloaded.ok, reloaded.problems
    assert (await answer).status_code == 200
    votes, events = await votes_and_audit(server, rid)
    assert votes == [], [(v.voter, v.verdict) for v in votes]
    assert [e for e in events if e.action == "vote_refused"]
