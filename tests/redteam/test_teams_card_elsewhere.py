"""A Teams click never decides a request whose card is not in Teams, through POST
/callbacks/teams/{channel}: the request's gate posts to another channel (a chat), and an
approver of that gate who is also in the Teams conversation names it in a signed invoke, and
a gate that escalates to the Teams channel takes no Teams click before its time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from signoff.app.config import parse_config
from signoff.app.db import transaction
from signoff.app.models import utcnow
from signoff.app.requests.eligibility import NOT_HERE
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request
from tests.channels.teams_fake import PASSWORD, FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    BOB,
    CAROL,
    CHANNEL,
    fake,
    teams_config,
    votes_and_audit,
)
from tests.conftest import Server

URL = f"/callbacks/teams/{CHANNEL}"


@pytest.fixture
async def server(
    fake: FakeBotFramework,  # noqa: F811
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    monkeypatch.setenv("TEAMS_APP_PASSWORD", PASSWORD)
    raw: dict[str, Any] = teams_config(fake)
    payments = raw["agents"]["finance-bot"]["hooks"][0]
    payments["channel"] = "chat"  # the card goes to the chat, not to Teams
    payments["escalate"] = [{"after": "10m", "channel": CHANNEL, "approvers": ["carol"]}]
    raw["agents"]["finance-bot"]["hooks"][1]["channel"] = "chat"  # wires: no escalation
    runtime = Runtime.create(settings, parse_config(raw), channels={"chat": FakeChannel("chat")})
    try:
        async with Server(runtime) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            yield srv, http
    finally:
        await runtime.aclose()


async def _request(server: Server, *, tool: str, minutes_ago: float) -> str:
    async with transaction(server.runtime.sessions) as s:
        req = await make_request(
            s,
            server.runtime.config,
            tool=tool,
            arguments={"amount": 90000},
            now=utcnow() - timedelta(minutes=minutes_ago),
        )
    return req.id


async def _click(bot: FakeBotFramework, http: httpx.AsyncClient, rid: str, aad: str) -> str:
    body, headers = bot.invoke(bot.activity(rid, "approve", aad=aad, reply_to="1700000000999"))
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.text


async def test_an_approver_of_a_card_elsewhere_decides_nothing_from_teams(
    fake: FakeBotFramework,  # noqa: F811
    server: tuple[Server, httpx.AsyncClient],
) -> None:
    srv, http = server
    # The wire gate's card is in the chat for good; the payment gate's reaches Teams at 10 min.
    wire = await _request(srv, tool="wire_funds", minutes_ago=11)
    payment = await _request(srv, tool="pay_invoice", minutes_ago=1)
    for rid in (wire, payment):
        for aad in (ALICE, BOB, CAROL):
            await _click(fake, http, rid, aad)
        votes, events = await votes_and_audit(srv, rid)
        assert votes == [], rid
        assert len([e for e in events if e.action == "vote_refused"]) == 3
    _, events = await votes_and_audit(srv, wire)
    assert {e.detail["why"] for e in events if e.action == "vote_refused"} == {NOT_HERE}
