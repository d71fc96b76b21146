"""Block Kit for approval cards and the rejection-reason modal (pure functions)."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from signoff.channels._contract import (
    MAX_REASON_CHARS,
    ArgumentsView,
    Card,
    GateProgress,
    GrantChoice,
    Person,
    changes_text,
    edit_input,
    lay_out_arguments,
    reminder_text,
    safe_url,
)

__all__ = [
    "ACTION_APPROVE",
    "ACTION_EDIT",
    "ACTION_GRANT",
    "ACTION_REJECT",
    "EDIT_ACTION_ID",
    "EDIT_MODAL_CALLBACK_ID",
    "MAX_REASON_CHARS",
    "REASON_ACTION_ID",
    "REASON_BLOCK_ID",
    "REJECT_MODAL_CALLBACK_ID",
    "argument_view",
    "edit_block_id",
    "escape_mrkdwn",
    "grant_value",
    "reason_required_by",
    "render_card",
    "render_edit_modal",
    "render_reject_modal",
    "render_reminder",
]

ACTION_APPROVE = "signoff_approve"
ACTION_GRANT = "signoff_grant"
"""Prefix of the action ids of the grant buttons (``signoff_grant.0``, …): an approval that
gives the grant named in the button's value."""
ACTION_REJECT = "signoff_reject"
ACTION_EDIT = "signoff_edit"
"""The "Edit and approve" button: opens a modal with the fields the approver may change."""
EDIT_MODAL_CALLBACK_ID = "signoff_edit_approve"
EDIT_ACTION_ID = "value"
_EDIT_BLOCK_PREFIX = "signoff_edit."
_INPUT_LIMIT = 3000
"""The longest text a ``plain_text_input`` holds (and its ``initial_value``)."""
REJECT_MODAL_CALLBACK_ID = "signoff_reject_reason"
REASON_BLOCK_ID = "signoff_reason"
REASON_ACTION_ID = "reason"

# Block Kit limits (docs.slack.dev/reference/block-kit); Slack refuses the whole
# message with ``invalid_blocks`` when one is exceeded.
_TEXT_LIMIT = 4000
_HEADER_LIMIT = 150
_SECTION_TEXT_LIMIT = 3000
_FIELD_LIMIT = 2000
_CONTEXT_TEXT_LIMIT = 3000
_CONFIRM_TEXT_LIMIT = 300
_CONFIRM_TITLE_LIMIT = 100
_BUTTON_TEXT_LIMIT = 75
_VALUE_LIMIT = 2000
_NAME_LIMIT = 200

# Arguments: a line per field in code blocks, packed into at most _ARGUMENT_SECTIONS
# sections. No line takes more than _ARGUMENT_LINE_LIMIT, so a section closes only once it
# holds more than _ARGUMENT_BODY - _ARGUMENT_LINE_LIMIT: a budget of that much per section
# always packs into them.
_ARGUMENTS_TITLE = "*Arguments*\n"
_FENCE_OPEN, _FENCE_CLOSE = "```\n", "\n```"
_ARGUMENT_BODY = _SECTION_TEXT_LIMIT - len(_ARGUMENTS_TITLE) - len(_FENCE_OPEN) - len(_FENCE_CLOSE)
_ARGUMENT_SECTIONS = 6
_ARGUMENT_LINE_LIMIT = 1200
_ARGUMENTS_BUDGET = _ARGUMENT_SECTIONS * (_ARGUMENT_BODY - _ARGUMENT_LINE_LIMIT)

# The actions block id carries whether a rejection needs a reason, so the modal
# can mark its input required at click time, before the server is asked.
_ACTIONS_PREFIX = "signoff_actions."
_ACTIONS_REASON_PREFIX = "signoff_actions_reason."

_STATUS_WORDS = {
    "approved": ("✅", "Approved"),
    "rejected": ("❌", "Rejected"),
    "expired": ("⌛", "Expired"),
    "cancelled": ("🚫", "Cancelled"),
}
_SLACK_ID = re.compile(r"[A-Z][A-Z0-9]{1,40}")
_ENTITY_TAIL = 5  # len("&amp;"), the longest escape _escape emits


def render_card(card: Card) -> tuple[str, list[dict[str, Any]]]:
    """Draw ``card`` as ``(text, blocks)`` for ``chat.postMessage`` / ``chat.update``.

    ``text`` is the notification and screen-reader fallback. A pending card ends
    with Approve / Reject buttons whose ``value`` is the request id, and, when the
    gate offers grants, a button per grant beside "Approve once" (its ``value``
    names the request and the grant; a confirmation dialog says what it allows);
    any other status shows the outcome (approved once, or with which grant until
    when), who decided, when and why, and has no buttons.
    Every user-supplied string is escaped, so arguments cannot mention
    ``@channel`` or forge links, and clipped to Block Kit's limits.

    The arguments show as :func:`argument_view` lays them out: every field's name and the
    start of its value, long values cut short with a link to the request in Signoff. A call
    whose fields do not fit offers Reject only (no approval of any kind).
    """
    version = _version(card)
    view = argument_view(card)
    icon, word = _status(card.status)
    agent = _clip(escape_mrkdwn(card.agent_id), _NAME_LIMIT)
    tool = _clip(escape_mrkdwn(card.tool_name), _NAME_LIMIT)

    if card.is_pending:
        text = f"Approval needed: {agent} wants to run {tool}"
        header = f"Approval needed: {card.tool_name}"
    else:
        text = f"{word}: {agent} wanted to run {tool}"
        if card.decided_by is not None:
            text += f" (by {_clip(escape_mrkdwn(card.decided_by.name), _NAME_LIMIT)})"
        header = f"{icon} {word}: {card.tool_name}"

    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "block_id": f"signoff_header.{version}",
            "text": {"type": "plain_text", "text": _clip(header, _HEADER_LIMIT), "emoji": True},
        },
        {
            "type": "section",
            "block_id": f"signoff_summary.{version}",
            "fields": [{"type": "mrkdwn", "text": f} for f in _fields(card)],
        },
        *_argument_sections(card, view, version),
    ]
    if not card.is_pending:
        blocks.append(
            {
                "type": "section",
                "block_id": f"signoff_outcome.{version}",
                "text": {"type": "mrkdwn", "text": _outcome(card, icon, word)},
            }
        )
    blocks.append(
        {
            "type": "context",
            "block_id": f"signoff_context.{version}",
            "elements": [{"type": "mrkdwn", "text": _context(card)}],
        }
    )
    if card.is_pending:
        blocks.append(_actions(card, version, agent, tool, approvable=view.complete))
    return _clip(text, _TEXT_LIMIT), blocks


def render_reminder(card: Card, waiting_on: tuple[Person, ...]) -> str:
    """The text of a reminder posted in the card's thread: ``<@U…>`` for each approver still
    to vote who has a Slack id (Slack notifies them), the name of anyone else."""
    return _clip(reminder_text(card, waiting_on, mention=_person, escape=escape_mrkdwn), _TEXT_LIMIT)


def render_reject_modal(request_id: str, *, reason_required: bool, channel_id: str | None) -> dict[str, Any]:
    """The ``views.open`` view asking why a request is rejected.

    ``private_metadata`` carries the request id (and the card's channel) to the
    ``view_submission``; the reason is at ``state.values[REASON_BLOCK_ID][REASON_ACTION_ID]``.
    """
    metadata = json.dumps({"request_id": request_id, "channel_id": channel_id}, separators=(",", ":"))
    return {
        "type": "modal",
        "callback_id": REJECT_MODAL_CALLBACK_ID,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": "Reject request"},
        "submit": {"type": "plain_text", "text": "Reject"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": f"Request {_code(request_id, _NAME_LIMIT)}"}],
            },
            {
                "type": "input",
                "block_id": REASON_BLOCK_ID,
                "optional": not reason_required,
                "label": {"type": "plain_text", "text": "Reason"},
                "hint": {"type": "plain_text", "text": "The agent is told this reason."},
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_ACTION_ID,
                    "multiline": True,
                    "max_length": MAX_REASON_CHARS,
                },
            },
        ],
    }


def edit_block_id(index: int) -> str:
    """The block id of the edit modal's input for the ``index``-th field."""
    return f"{_EDIT_BLOCK_PREFIX}{index}"


def render_edit_modal(card: Card, *, channel_id: str | None) -> dict[str, Any]:
    """The ``views.open`` view of "Edit and approve": one text input per field the approver
    may change, holding its current value (text as it is, anything else as JSON).

    ``private_metadata`` carries the request id, the card's channel and each field with
    whether it held text (what is typed there stays text) to the ``view_submission``; the
    values are at ``state.values[edit_block_id(i)][EDIT_ACTION_ID]``. A field whose value is
    too long for an input is left out.
    """
    fields: list[list[str]] = []
    blocks: list[dict[str, Any]] = [
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": _clip(
                        f"{_code(card.agent_id, _NAME_LIMIT)} wants to run "
                        f"{_code(card.tool_name, _NAME_LIMIT)} "
                        f"· request {_code(card.request_id, _NAME_LIMIT)}",
                        _CONTEXT_TEXT_LIMIT,
                    ),
                }
            ],
        }
    ]
    for name in card.editable:
        current = card.arguments.get(name)
        shown = edit_input(current) if name in card.arguments else ""
        if len(shown) > _INPUT_LIMIT:
            continue
        element: dict[str, Any] = {
            "type": "plain_text_input",
            "action_id": EDIT_ACTION_ID,
            "multiline": len(shown) > 80 or "\n" in shown,
            "max_length": _INPUT_LIMIT,
        }
        if shown:
            element["initial_value"] = shown
        blocks.append(
            {
                "type": "input",
                "block_id": edit_block_id(len(fields)),
                "optional": True,
                "label": {"type": "plain_text", "text": _clip(name, _NAME_LIMIT)},
                "hint": {
                    "type": "plain_text",
                    "text": "Text as typed."
                    if isinstance(current, str)
                    else 'JSON (40000, true, ["a"]) or text.',
                },
                "element": element,
            }
        )
        fields.append([name, "text" if isinstance(current, str) else "json"])
    metadata = json.dumps(
        {"request_id": card.request_id, "channel_id": channel_id, "fields": fields},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return {
        "type": "modal",
        "callback_id": EDIT_MODAL_CALLBACK_ID,
        "private_metadata": metadata,
        "title": {"type": "plain_text", "text": "Edit and approve"},
        "submit": {"type": "plain_text", "text": "Approve"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": blocks,
    }


def reason_required_by(block_id: str) -> bool:
    """Whether the actions block a Reject click came from asked for a reason."""
    return block_id.startswith(_ACTIONS_REASON_PREFIX)


def _version(card: Card) -> str:
    # Slack wants fresh block ids each time a message is updated.
    seed = "\x00".join(
        (
            card.request_id,
            card.status,
            str(len(card.approvals)),
            ",".join(str(len(g.approvals)) for g in card.gates),
            card.decided_at.isoformat() if card.decided_at else "",
        )
    )
    return hashlib.sha256(seed.encode()).hexdigest()[:12]


def _status(status: str) -> tuple[str, str]:
    return _STATUS_WORDS.get(status, ("🔹", status.capitalize() or "Unknown"))


def _fields(card: Card) -> list[str]:
    fields = [
        f"*Agent*\n{_code(card.agent_id, _NAME_LIMIT)}",
        f"*Tool*\n{_code(card.tool_name, _NAME_LIMIT)}",
    ]
    if card.requester is not None:
        # No Slack id to mention (the agent's word as it came, or a person without one): code.
        requester = card.requester
        shown = _person(requester) if requester.user_id else _code(requester.name, _NAME_LIMIT)
        fields.append(_clip(f"*On behalf of*\n{shown}", _FIELD_LIMIT))
    if card.is_pending:
        fields.append(f"*Expires*\n{_date(card.expires_at)}")
    approvers = _join_fitting(
        [_person(p) for p in card.approvers], _FIELD_LIMIT - 20, empty="Anyone in this channel"
    )
    fields.append(f"*Approvers*\n{approvers}")
    if card.gates:
        # Several gates must approve: how each stands, this channel's and the others'.
        budget = (_FIELD_LIMIT - 40) // len(card.gates)
        lines = [_gate_line(gate, budget) for gate in card.gates]
        fields.append(_clip("*Reviews* (every one must approve)\n" + "\n".join(lines), _FIELD_LIMIT))
        return fields
    count = f"{len(card.approvals)} of {card.quorum}"
    if card.approvals:
        count += ": " + _join_fitting([_person(p) for p in card.approvals], _FIELD_LIMIT - 40, empty="")
    fields.append(f"*Approvals*\n{count}")
    return fields


def _gate_line(gate: GateProgress, budget: int) -> str:
    line = f"{_clip(escape_mrkdwn(gate.name), _NAME_LIMIT)}: {len(gate.approvals)} of {gate.quorum}"
    if gate.approvals:
        line += ": " + _join_fitting(
            [_person(p) for p in gate.approvals], max(budget - len(line), 20), empty=""
        )
    if not gate.here:
        line += " _(in another channel)_"
    return line + (" ✓" if gate.approved else "")


def argument_view(card: Card) -> ArgumentsView:
    """The card's arguments as its message lays them out (incomplete: the card offers no approval)."""
    return lay_out_arguments(
        card.arguments,
        budget=_ARGUMENTS_BUDGET,
        line_limit=_ARGUMENT_LINE_LIMIT,
        size=lambda text: len(_argument_line(text)) + 1,
    )


def _argument_line(text: str) -> str:
    # A run of backticks inside the block would close it early.
    return escape_mrkdwn(re.sub(r"`(?=`)", "`\u200b", text))


def _argument_sections(card: Card, view: ArgumentsView, version: str) -> list[dict[str, Any]]:
    def section(index: int, text: str) -> dict[str, Any]:
        block_id = f"signoff_arguments{index or ''}.{version}"
        return {"type": "section", "block_id": block_id, "text": {"type": "mrkdwn", "text": text}}

    if not view.fields:
        return [section(0, _ARGUMENTS_TITLE + "_none_")]
    if not view.complete:
        return [section(0, _ARGUMENTS_TITLE + _console_note(card, view.notice or ""))]
    chunks: list[list[str]] = [[]]
    used = 0
    for line in view.lines:
        shown = _argument_line(line.text)
        if chunks[-1] and used + len(shown) + 1 > _ARGUMENT_BODY:
            chunks.append([])
            used = 0
        chunks[-1].append(shown)
        used += len(shown) + 1
    sections = [
        section(i, (_ARGUMENTS_TITLE if i == 0 else "") + _FENCE_OPEN + "\n".join(chunk) + _FENCE_CLOSE)
        for i, chunk in enumerate(chunks)
    ]
    if view.notice is not None:
        sections.append(section(len(sections), _console_note(card, view.notice)))
    return sections


def _console_note(card: Card, notice: str) -> str:
    url = safe_url(card.console_url) if card.console_url else ""
    if url and len(url) <= _SECTION_TEXT_LIMIT // 2:
        return f"_{notice}_ <{url}|Open in Signoff>"
    return f"_{notice}_ (request {_code(card.request_id, _NAME_LIMIT)})"


def _outcome(card: Card, icon: str, word: str) -> str:
    approved = card.status == "approved"
    once = approved and card.granted is None and not card.changes
    line = f"{icon} *{word}{' once' if once else ''}*"
    if card.decided_by is not None:
        line += f" by {_person(card.decided_by)}"
    if approved and card.granted is not None:
        line += f" *for {card.granted.where}*"
        if card.granted_until is not None:
            line += f" until {_date(card.granted_until)}"
    if approved and card.changes:
        line += " *with changes:* " + _clip(
            escape_mrkdwn(changes_text(card.changes)), _SECTION_TEXT_LIMIT // 2
        )
    if card.decided_at is not None:
        line += f" · {_date(card.decided_at)}"
    if card.reason and card.status == "expired":
        # Nobody refused: say so, and whom it asked, instead of giving a "reason".
        head = f"{icon} *{word}:* "
        line = head + _clip(escape_mrkdwn(card.reason), _SECTION_TEXT_LIMIT - len(head))
        if card.decided_at is not None:
            line += f" · {_date(card.decided_at)}"
    elif card.reason:
        head = f"{line}\n*Reason:* "
        line = head + _clip(escape_mrkdwn(card.reason), _SECTION_TEXT_LIMIT - len(head))
    return line


def _context(card: Card) -> str:
    text = f"Request {_code(card.request_id, _NAME_LIMIT)} · created {_date(card.created_at)}"
    if card.is_pending and card.require_reject_reason:
        text += " · a rejection needs a reason"
    return text


def _actions(card: Card, version: str, agent: str, tool: str, *, approvable: bool) -> dict[str, Any]:
    """The buttons: approving (once, with a grant, with changes) only when ``approvable``."""
    prefix = _ACTIONS_REASON_PREFIX if card.require_reject_reason else _ACTIONS_PREFIX
    confirm_text = f"{agent} will not be allowed to run {tool}. You can give a reason next."
    grants = [
        (offer, value)
        for offer in card.grants
        if len(value := grant_value(card.request_id, offer)) <= _VALUE_LIMIT
    ]
    approve: list[dict[str, Any]] = [
        {
            "type": "button",
            "action_id": ACTION_APPROVE,
            "style": "primary",
            "value": card.request_id,
            "text": {"type": "plain_text", "text": "Approve once" if grants else "Approve", "emoji": True},
        },
        *(_grant_button(card, i, offer, value) for i, (offer, value) in enumerate(grants)),
    ]
    if card.editable:
        approve.append(
            {
                "type": "button",
                "action_id": ACTION_EDIT,
                "value": card.request_id,
                "text": {"type": "plain_text", "text": "Edit and approve", "emoji": True},
            }
        )
    reject = {
        "type": "button",
        "action_id": ACTION_REJECT,
        "style": "danger",
        "value": card.request_id,
        "text": {"type": "plain_text", "text": "Reject", "emoji": True},
        "confirm": {
            "title": {"type": "plain_text", "text": "Reject this request?"},
            "text": {"type": "mrkdwn", "text": _clip(confirm_text, _CONFIRM_TEXT_LIMIT)},
            "confirm": {"type": "plain_text", "text": "Reject"},
            "deny": {"type": "plain_text", "text": "Cancel"},
            "style": "danger",
        },
    }
    return {
        "type": "actions",
        "block_id": prefix + version,
        "elements": [*(approve if approvable else []), reject],
    }


def grant_value(request_id: str, offer: GrantChoice) -> str:
    """A grant button's ``value``: the request and the grant, as compact JSON."""
    return json.dumps({"request_id": request_id, "grant": offer.as_dict()}, separators=(",", ":"))


def _grant_button(card: Card, index: int, offer: GrantChoice, value: str) -> dict[str, Any]:
    explained = escape_mrkdwn(offer.explain(card.agent_id, card.tool_name))
    return {
        "type": "button",
        "action_id": f"{ACTION_GRANT}.{index}",
        "value": value,
        "text": {"type": "plain_text", "text": _clip(offer.label(), _BUTTON_TEXT_LIMIT), "emoji": True},
        "confirm": {
            "title": {
                "type": "plain_text",
                "text": _clip(f"Approve for {offer.where}?", _CONFIRM_TITLE_LIMIT),
            },
            "text": {"type": "mrkdwn", "text": _clip(explained, _CONFIRM_TEXT_LIMIT)},
            "confirm": {"type": "plain_text", "text": "Approve"},
            "deny": {"type": "plain_text", "text": "Cancel"},
        },
    }


def _date(moment: datetime) -> str:
    """Slack date formatting: shown in the reader's time zone, with a UTC fallback."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    fallback = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(moment.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _person(person: Person) -> str:
    if person.user_id is not None and _SLACK_ID.fullmatch(person.user_id):
        return f"<@{person.user_id}>"
    return _clip(escape_mrkdwn(person.name), _NAME_LIMIT)


def _code(text: str, limit: int) -> str:
    return "`" + _clip(escape_mrkdwn(text.replace("`", "'")), limit) + "`"


def escape_mrkdwn(text: str) -> str:
    """Escape Slack's three control characters (``&``, ``<``, ``>``); everything else is literal."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    """Cut escaped text to ``limit`` characters with an ellipsis, never inside an ``&…;`` entity."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp = cut.rfind("&", len(cut) - _ENTITY_TAIL)
    if amp != -1 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"


def _join_fitting(items: list[str], limit: int, *, empty: str) -> str:
    """Join whole items (mentions must not be cut) and count the ones that did not fit."""
    if not items:
        return empty
    shown: list[str] = []
    length = 0
    for index, item in enumerate(items):
        rest = len(items) - index - 1
        tail = len(f" and {rest} more") if rest else 0
        cost = len(item) + (2 if shown else 0)
        if length + cost + tail > limit:
            break
        shown.append(item)
        length += cost
    hidden = len(items) - len(shown)
    joined = ", ".join(shown)
    if hidden:
        joined = f"{joined} and {hidden} more" if shown else f"{hidden} people"
    return joined
