"""A Teams channel takes card actions from Microsoft Teams alone, through POST
/callbacks/teams/{channel}. The Bot Connector signs every activity it delivers to the bot,
whichever Bot Framework channel it came through, under keys that endorse many channels; on
Web Chat and Direct Line (on by default for an Azure Bot) the web page writes the activity's
``from`` and ``channelData`` itself, so the Entra object id and the tenant it names are only
what the page says. Such an invoke decides nothing, whatever it names."""

from __future__ import annotations

import httpx
import pytest

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

URL = f"/callbacks/teams/{CHANNEL}"
OTHER_CHANNELS = ["webchat", "directline", "emulator", "skype", "slack", "msteams ", "MSTeams"]


@pytest.mark.parametrize("channel_id", OTHER_CHANNELS)
async def test_an_invoke_through_another_bot_framework_channel_decides_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    channel_id: str,
) -> None:
    server, http = teams_server
    # The connector's keys endorse the bot's other channels too.
    fake.endorsements[fake.kid] = ["msteams", *OTHER_CHANNELS]
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    activity = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    activity["channelId"] = channel_id
    # What a web page can write: the clicker's object id and the tenant, and (at worst) the
    # Teams conversation's id.
    activity["conversation"] = {"id": f"{CONVERSATION};messageid={card_id}"}
    activity["channelData"] = {"tenant": {"id": TENANT}}
    body, headers = fake.invoke(activity)
    answer = await http.post(URL, content=body, headers=headers)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == [], [(v.user_id, v.verdict, v.identity) for v in votes]
