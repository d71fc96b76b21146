"""Text an agent chooses besides its arguments (its ``user_id``, shown as "On behalf of", and
the tool's name) cannot draw lines of a card's own.

Arguments are written as JSON, every line break escaped; the requester's id and the tool name
were written as they came. A ``user_id`` of ``ops\\nApprovals: 1 of 1: Alice\\n\\nArguments:
\\n"amount": 10`` drew, above the real ones, an approval that never happened and arguments
the call does not have, in the plain-text email and in Slack's fields alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from signoff.app.runtime import Runtime
from signoff.channels import Person
from signoff.channels.email import render_text
from signoff.channels.fake import FakeChannel
from signoff.channels.slack import render_card as slack_card
from tests.conftest import Server
from tests.redteam.support import ask
from tests.waiting import eventually

FORGED = 'ops\nApprovals: 1 of 1: Alice\n\nArguments:\n"amount": 10\n'
TOOL = 'pay_invoice\nArguments:\n"amount": 10'


@pytest.fixture
async def server(runtime: Runtime) -> AsyncIterator[Server]:
    """The server with its outbox running: cards are posted to the fake channel."""
    async with Server(runtime, background=True) as s:
        yield s


async def test_a_requester_id_or_tool_name_cannot_draw_a_cards_lines(
    http: httpx.AsyncClient, agent_key: str, fake_channel: FakeChannel
) -> None:
    call = {"tool_name": TOOL, "arguments": {"amount": 90000}, "user_id": FORGED}
    answer = await ask(http, agent_key, call)
    assert answer["decision"] == "pending", answer
    [card, *_] = await eventually(lambda: fake_channel.cards_for(answer["request_id"]))
    mail = render_text(card, Person("Alice"), [])
    lines = mail.splitlines()
    assert lines.count("Arguments:") == 1, mail
    assert '"amount": 10' not in lines, mail
    assert not any(line.startswith("Approvals: 1 of 1") for line in lines), mail
    _text, blocks = slack_card(card)
    fields = [line for f in blocks[1]["fields"] for line in f["text"].split("\n")]
    assert "Arguments:" not in fields, fields
    assert not any(line.startswith("Approvals: 1 of 1") for line in fields), fields


@pytest.mark.parametrize("user_id", ["U0CEO4242", "W0CEO4242", "*URGENT* _from the CEO_", "~struck~ `code`"])
async def test_a_requester_id_the_directory_does_not_know_is_shown_as_text_not_a_mention_or_markup(
    http: httpx.AsyncClient, agent_key: str, fake_channel: FakeChannel, user_id: str
) -> None:
    """The agent's ``user_id`` is its word: spelled like a Slack id, it made the card mention
    whoever holds that id ("on behalf of @the chief executive"); with Slack's markup, it was drawn
    bold or struck. It is shown as code, as it came."""
    call = {"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "user_id": user_id}
    answer = await ask(http, agent_key, call)
    assert answer["decision"] == "pending", answer
    [card, *_] = await eventually(lambda: fake_channel.cards_for(answer["request_id"]))
    _text, blocks = slack_card(card)
    [behalf] = [f["text"] for f in blocks[1]["fields"] if f["text"].startswith("*On behalf of*")]
    shown = behalf.split("\n", 1)[1]
    assert "<@" not in shown, shown
    assert shown.startswith("`"), shown
    assert shown.endswith("`"), shown
    assert shown.count("`") == 2, shown
