"""Characters no renderer draws are written as escapes on every card, not only format characters.

Cards write controls, format characters (bidi overrides, zero-width spaces) and line
separators as ``\\u`` escapes, chosen by general category. Unicode's default-ignorable code
points are not all in those categories: the combining grapheme joiner (U+034F) and the
variation selectors are marks, the Hangul fillers letters, U+2065 unassigned, and a text
renderer draws none of them. In an argument they made two fields read alike
(``"to"`` and ``"to\\u034f"``) or a value read as another, on Slack, Feishu, Teams, ntfy,
email and the console alike.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from signoff.app.console.format import pretty_json
from signoff.channels import Card, Person, argument_json
from signoff.channels.email import render_html, render_text
from signoff.channels.feishu import render_card as feishu_card
from signoff.channels.ntfy._message import render_notification
from signoff.channels.slack import render_card as slack_card
from signoff.channels.teams._card import render_card as teams_card

INVISIBLE = [
    "\u034f",  # combining grapheme joiner (Mn)
    "\u115f",  # Hangul choseong filler (Lo)
    "\u1160",  # Hangul jungseong filler (Lo)
    "\u17b4",  # Khmer vowel inherent aq (Mn)
    "\u180b",  # Mongolian free variation selector one (Mn)
    "\u2065",  # unassigned, default ignorable (Cn)
    "\u3164",  # Hangul filler (Lo)
    "\ufe0f",  # variation selector-16 (Mn)
    "\uffa0",  # halfwidth Hangul filler (Lo)
    "\U000e0100",  # variation selector-17 (Mn)
]
NOW = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)


def _card(char: str) -> Card:
    return Card(
        request_id="req-1",
        agent_id="finance-bot",
        tool_name="transfer_funds",
        arguments={"to": "acme", f"to{char}": f"mallory{char}"},
        status="pending",
        created_at=NOW,
        expires_at=NOW + timedelta(minutes=30),
        quorum=1,
        approvers=(Person("Alice", "U0ALICE"),),
    )


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_every_card_writes_an_invisible_character_as_an_escape(char: str) -> None:
    card = _card(char)
    assert char not in argument_json(card.arguments)
    assert char not in pretty_json(card.arguments)
    _text, blocks = slack_card(card)
    rendered = {
        "slack": json.dumps(blocks, ensure_ascii=False),
        "feishu": json.dumps(feishu_card(card), ensure_ascii=False),
        "teams": json.dumps(teams_card(card), ensure_ascii=False),
        "email text": render_text(card, Person("Alice"), []),
        "email html": render_html(card, Person("Alice"), []),
        "ntfy": render_notification(
            card,
            topic="alice-Hk3vQ9xT2m",
            callback_url="https://signoff.test/callbacks/ntfy/phone",
            approve_token="A.a",
            reject_token="R.r",
            reject_page="https://signoff.test/approve/R.r",
            now=NOW,
        ).message,
    }
    for channel, text in rendered.items():
        assert char not in text, channel
