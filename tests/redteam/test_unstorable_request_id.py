"""A signed press that names a request by text no database can hold (a lone surrogate, a NUL)
is answered like a press on a request that does not exist, never a 500: the Slack "Edit and
approve" press (which reads the request to open its form before any vote) and a Teams edit
that cannot be approved (answered with the card as it stands); through the real endpoints."""

from __future__ import annotations

import httpx
import pytest

from tests.channels.conftest import (  # noqa: F401  (fixtures)
    _no_proxy,
    fake_slack,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack
from tests.channels.teams_fake import FakeBotFramework
from tests.channels.test_edit_choices import (
    SLACK,
    posted_buttons,
    pre,
    press_edit,
    slack_gates,  # noqa: F401  (fixture: the edit gates slack_server runs)
    state,
)
from tests.channels.test_teams_flow import CHANNEL as TEAMS
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    MALLORY,
    ask,
    fake,
    posted,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server

UNSTORABLE = ["\ud800", "req\x00"]


@pytest.mark.parametrize("request_id", UNSTORABLE)
async def test_a_slack_edit_press_naming_an_unstorable_request_is_not_a_500(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    request_id: str,
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    body, headers = press_edit(request_id, "W0ALICE", "t.trigger")
    answer = await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)
    assert answer.status_code < 500, (answer.status_code, answer.text)
    assert fake_slack.calls_to("views.open") == []
    assert (await state(http, agent_key, rid))["status"] == "pending"


@pytest.mark.parametrize("request_id", UNSTORABLE)
async def test_a_teams_edit_naming_an_unstorable_request_is_not_a_500(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    request_id: str,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    # An edited value no approval can carry: the invoke is answered with the card as it stands.
    data = {"edit": [["amount", "json"]], "edit_0": "[" * 40 + "]" * 40}
    activity = fake.activity(rid, "approve", aad=MALLORY, reply_to=card_id, data=data)
    activity["value"]["action"]["data"]["request_id"] = request_id
    body, headers = fake.invoke(activity)
    answer = await http.post(f"/callbacks/teams/{TEAMS}", content=body, headers=headers)
    assert answer.status_code < 500, (answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == []
