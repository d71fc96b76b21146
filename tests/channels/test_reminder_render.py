"""Reminders and expired cards as each channel draws them (pure functions)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from signoff.channels import Person
from signoff.channels.feishu._card import render_card as feishu_card
from signoff.channels.feishu._card import render_reminder as feishu_reminder
from signoff.channels.slack import render_card as slack_card
from signoff.channels.slack._blocks import render_reminder as slack_reminder
from tests.channels.slack_support import CREATED, card

EXPIRED = "nobody decided within 30m; asked Ana, Bo"


def test_slack_expired_card_says_nobody_decided_and_whom_it_asked() -> None:
    text, blocks = slack_card(replace(card(), status="expired", reason=EXPIRED, decided_at=CREATED))
    outcome = next(b for b in blocks if b["block_id"].startswith("signoff_outcome"))
    assert outcome["text"]["text"].startswith(f"⌛ *Expired:* {EXPIRED}")
    assert "Reason" not in outcome["text"]["text"]
    assert not any(b["type"] == "actions" for b in blocks)
    assert text.startswith("Expired")


def test_feishu_expired_card_says_nobody_decided_and_whom_it_asked() -> None:
    drawn = json.dumps(feishu_card(replace(card(), status="expired", reason=EXPIRED, decided_at=CREATED)))
    assert f"Expired: {EXPIRED}" in drawn
    assert "Reason:" not in drawn


def test_slack_reminder_mentions_who_has_an_id_and_names_the_rest() -> None:
    text = slack_reminder(card(), (Person("Ana", "U0ANA"), Person("Dee")))
    assert text.startswith("<@U0ANA> Dee your decision is still needed: deploy-bot wants to run shell.exec")
    assert "req-1" in text
    assert "2023-11-14 22:43 UTC" in text  # the deadline
    assert slack_reminder(card(), ()).startswith("A decision is still needed")


def test_feishu_reminder_is_a_post_with_at_elements() -> None:
    content = feishu_reminder(card(), (Person("Ana", "ou_ana"), Person("Dee")))
    [paragraph] = content["zh_cn"]["content"]
    assert paragraph[0] == {"tag": "at", "user_id": "ou_ana"}
    assert paragraph[1] == {"tag": "text", "text": "Dee "}
    assert paragraph[2]["text"].startswith(
        " your decision is still needed: deploy-bot wants to run shell.exec"
    )


@given(agent=st.text(max_size=60), tool=st.text(max_size=60))
def test_what_an_agent_names_never_mentions_anyone(agent: str, tool: str) -> None:
    """An agent's id or tool name cannot @ a user, a channel or everyone in a reminder."""
    shown = replace(card(), agent_id=agent, tool_name=tool)
    text = slack_reminder(shown, (Person("Ana", "U0ANA"),))
    assert re.findall(r"<[@!#]", text) == ["<@"]
    content = feishu_reminder(shown, (Person("Ana", "ou_ana"),))
    [paragraph] = content["zh_cn"]["content"]
    assert [e for e in paragraph if e["tag"] == "at"] == [{"tag": "at", "user_id": "ou_ana"}]
