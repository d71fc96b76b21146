"""render_card and the rejection modal: content, Block Kit limits, escaping."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from signoff.channels import GrantChoice, Person, Verdict
from signoff.channels.slack import (
    ACTION_APPROVE,
    ACTION_REJECT,
    REASON_BLOCK_ID,
    click_from_block_actions,
    render_card,
    render_reject_modal,
)
from signoff.channels.slack._blocks import reason_required_by
from tests.channels.slack_support import CREATED, NOW, button_payload, card, decided


def valid(blocks: list[dict[str, Any]]) -> None:
    """slack-sdk's models enforce Block Kit's documented limits."""
    for block in blocks:
        parsed = Block.parse(block)
        assert parsed is not None, block
        parsed.validate_json()


def of_type(blocks: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [b for b in blocks if b["type"] == kind]


def all_text(blocks: list[dict[str, Any]]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def test_pending_card_shows_the_request_and_two_buttons() -> None:
    text, blocks = render_card(replace(card(quorum=2), approvals=(Person("Ana", "U0ANA"),)))

    valid(blocks)
    assert text == "Approval needed: deploy-bot wants to run shell.exec"
    fields = [f["text"] for f in of_type(blocks, "section")[0]["fields"]]
    assert fields[:3] == ["*Agent*\n`deploy-bot`", "*Tool*\n`shell.exec`", "*On behalf of*\n<@U0CY>"]
    expires = NOW + 30 * 60
    assert f"*Expires*\n<!date^{expires}^{{date_short_pretty}} at {{time}}|2023-11-14 22:43 UTC>" in fields
    assert "*Approvers*\n<@U0ANA>, <@U0BO>" in fields
    assert "*Approvals*\n1 of 2: <@U0ANA>" in fields
    assert '"cmd": "systemctl restart api"' in of_type(blocks, "section")[1]["text"]["text"]

    [actions] = of_type(blocks, "actions")
    approve, reject = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["value"]) == (ACTION_APPROVE, "primary", "req-1")
    assert (reject["action_id"], reject["style"], reject["value"]) == (ACTION_REJECT, "danger", "req-1")
    assert "confirm" not in approve
    assert reject["confirm"]["style"] == "danger"
    assert reject["confirm"]["confirm"]["text"] == "Reject"


def test_empty_approver_list_means_anyone() -> None:
    _, blocks = render_card(replace(card(), approvers=()))

    assert "*Approvers*\nAnyone in this channel" in all_text(blocks).replace("\\n", "\n")


@pytest.mark.parametrize(
    ("status", "icon", "word"),
    [("approved", "✅", "Approved"), ("rejected", "❌", "Rejected"), ("cancelled", "🚫", "Cancelled")],
)
def test_decided_card_has_outcome_and_no_buttons(status: str, icon: str, word: str) -> None:
    pending_blocks = render_card(card())[1]
    text, blocks = render_card(decided(card(), status, reason="too risky on a Friday"))

    valid(blocks)
    assert not of_type(blocks, "actions")
    assert text == f"{word}: deploy-bot wanted to run shell.exec (by Ana)"
    outcome = of_type(blocks, "section")[2]["text"]["text"]
    decided_at = NOW + 5 * 60
    how = " once" if status == "approved" else ""  # what an approval authorized
    assert outcome.startswith(f"{icon} *{word}{how}* by <@U0ANA> · <!date^{decided_at}^")
    assert outcome.endswith("\n*Reason:* too risky on a Friday")
    assert blocks[0]["text"]["text"] == f"{icon} {word}: shell.exec"
    # Slack asks for fresh block ids each time a message is updated.
    assert not {b["block_id"] for b in blocks} & {b["block_id"] for b in pending_blocks}


def test_expired_card_without_a_decider() -> None:
    expired = replace(card(), status="expired", decided_at=card().expires_at)
    text, blocks = render_card(expired)

    valid(blocks)
    assert not of_type(blocks, "actions")
    assert of_type(blocks, "section")[2]["text"]["text"].startswith("⌛ *Expired* · <!date^")
    assert "*Expires*" not in all_text(blocks)
    assert text.startswith("Expired:")


def test_user_text_cannot_ping_or_link() -> None:
    hostile = replace(
        card(arguments={"msg": "<!channel> see <https://evil.example|docs> & <@U0BOSS>"}),
        agent_id="<!here>",
        tool_name="a&b",
        requester=Person("<!everyone>"),
    )
    text, blocks = render_card(hostile)

    rendered = text + all_text(blocks)
    for raw in ("<!channel>", "<!here>", "<!everyone>", "<https://", "<@U0BOSS>"):
        assert raw not in rendered
    assert "&lt;!channel&gt;" in rendered
    assert "a&amp;b" in rendered
    # Mentions we render ourselves survive.
    assert "<@U0ANA>" in rendered


def test_person_id_that_is_not_a_slack_id_is_shown_as_a_name() -> None:
    _, blocks = render_card(replace(card(), requester=Person("Eve", "U1>|<!channel")))

    assert "*On behalf of*\\nEve" in all_text(blocks)


def test_huge_arguments_are_clipped_per_field_within_section_limit() -> None:
    _, blocks = render_card(card(arguments={"blob": "x" * 100_000, "tail": "shown too"}))

    valid(blocks)
    args = of_type(blocks, "section")[1]["text"]["text"]
    assert len(args) <= 3000
    assert re.search(r'"blob": "x+… 9\d,\d{3} more characters\n', args)
    assert args.endswith('"tail": "shown too"\n```')


def test_clipping_never_splits_an_escape() -> None:
    _, blocks = render_card(card(arguments={"amp": "&" * 5000}))

    args = of_type(blocks, "section")[1]["text"]["text"]
    assert len(args) <= 3000
    assert re.search(r"&(?!amp;|lt;|gt;)", args) is None


def test_backticks_in_arguments_do_not_close_the_code_block() -> None:
    _, blocks = render_card(card(arguments={"cmd": "echo ```; echo ``` done"}))

    assert of_type(blocks, "section")[1]["text"]["text"].count("```") == 2


def test_non_json_values_are_shown_as_text() -> None:
    moment = datetime(2024, 1, 2, 3, 4, 5)
    _, blocks = render_card(card(arguments={"when": moment}))

    assert '"when": "2024-01-02 03:04:05"' in of_type(blocks, "section")[1]["text"]["text"]


def test_no_arguments() -> None:
    _, blocks = render_card(card(arguments={}))

    assert of_type(blocks, "section")[1]["text"]["text"] == "*Arguments*\n_none_"


def test_long_names_and_many_people_stay_within_limits() -> None:
    crowd = tuple(Person(f"P{i}", f"U{i:08d}") for i in range(500))
    big = replace(
        card(quorum=400),
        tool_name="t" * 1000,
        agent_id="a" * 1000,
        approvers=crowd,
        approvals=crowd[:300],
    )
    text, blocks = render_card(big)

    valid(blocks)
    assert len(text) <= 4000
    assert len(blocks[0]["text"]["text"]) <= 150
    fields = [f["text"] for f in of_type(blocks, "section")[0]["fields"]]
    approvers = next(f for f in fields if f.startswith("*Approvers*"))
    assert len(approvers) <= 2000
    assert re.search(r"<@U\d{8}> and \d+ more$", approvers)
    assert all(len(f) <= 2000 for f in fields)


def test_naive_datetimes_are_read_as_utc() -> None:
    aware = render_card(card())[1]
    naive_card = replace(
        card(),
        created_at=card().created_at.replace(tzinfo=None),
        expires_at=card().expires_at.replace(tzinfo=None),
    )

    assert render_card(naive_card)[1] == aware


def test_reason_requirement_travels_in_the_actions_block_id() -> None:
    optional = of_type(render_card(card())[1], "actions")[0]["block_id"]
    required = of_type(render_card(card(require_reject_reason=True))[1], "actions")[0]["block_id"]

    assert not reason_required_by(optional)
    assert reason_required_by(required)


@pytest.mark.parametrize("required", [False, True])
def test_reject_modal(required: bool) -> None:
    view = render_reject_modal("req-1", reason_required=required, channel_id="C0SIGNOFF")

    View(**view).validate_json()
    assert json.loads(view["private_metadata"]) == {"request_id": "req-1", "channel_id": "C0SIGNOFF"}
    [reason] = [b for b in view["blocks"] if b.get("block_id") == REASON_BLOCK_ID]
    assert reason["optional"] is not required
    assert reason["element"]["type"] == "plain_text_input"


GRANTS = (GrantChoice("session", 3600, ("to",)), GrantChoice("agent", 1800))


def test_grants_are_buttons_beside_approve_once_each_with_a_confirmation() -> None:
    _, blocks = render_card(replace(card(), grants=GRANTS))

    valid(blocks)
    [actions] = of_type(blocks, "actions")
    labels = [e["text"]["text"] for e in actions["elements"]]
    assert labels == [
        "Approve once",
        "Approve for this session (1h)",
        "Approve for this agent (30m)",
        "Reject",
    ]
    session, agent = actions["elements"][1:3]
    assert session["action_id"] != agent["action_id"]
    assert json.loads(session["value"]) == {"request_id": "req-1", "grant": GRANTS[0].as_dict()}
    assert session["confirm"]["title"]["text"] == "Approve for this session?"
    assert session["confirm"]["text"]["text"] == (
        "For 1h, deploy-bot in this session may run shell.exec again without asking"
        ' while the argument "to" stays the same.'
    )
    # A press of each button parses back into the approval with that grant.
    for element, grant in zip((session, agent), GRANTS, strict=True):
        payload = button_payload(element["action_id"], request_id=element["value"])
        click = click_from_block_actions(payload)
        assert click is not None
        assert (click.request_id, click.verdict, click.grant) == ("req-1", Verdict.APPROVE, grant)


@pytest.mark.parametrize(
    ("same", "sentence"),
    [
        (("to",), 'while the argument "to" stays the same.'),
        (("to", "amount"), 'while the arguments "amount" and "to" stay the same.'),
        (("c", "a", "b"), 'while the arguments "a", "b" and "c" stay the same.'),
    ],
)
def test_a_grant_names_the_fields_it_holds_equal_in_one_sentence(
    same: tuple[str, ...], sentence: str
) -> None:
    explained = GrantChoice("agent", 60, same).explain("bot", "pay")
    assert explained == f"For 1m, bot may run pay again without asking {sentence}"


def test_grant_text_cannot_ping_and_an_oversized_grant_is_left_off() -> None:
    hostile = GrantChoice("session", 60, ("<!channel>", "x" * 100))
    huge = GrantChoice("agent", 60, tuple(f"{i:03d}" + "f" * 96 for i in range(20)))
    _, blocks = render_card(replace(card(), agent_id="<!here>", grants=(hostile, huge)))

    valid(blocks)
    [actions] = of_type(blocks, "actions")
    assert len(actions["elements"]) == 3  # the grant whose value would pass 2000 characters is not offered
    text = actions["elements"][1]["confirm"]["text"]["text"]
    assert "<!" not in text
    assert "&lt;!here&gt;" in text


def test_a_card_approved_with_a_grant_says_for_what_until_when() -> None:
    approved = replace(
        decided(card(), "approved"), granted=GRANTS[0], granted_until=CREATED + timedelta(minutes=65)
    )
    _, blocks = render_card(approved)

    valid(blocks)
    outcome = of_type(blocks, "section")[2]["text"]["text"]
    until = NOW + 65 * 60
    assert outcome.startswith(f"✅ *Approved* by <@U0ANA> *for this session* until <!date^{until}^")
    assert "once" not in outcome
