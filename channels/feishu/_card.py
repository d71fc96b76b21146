"""Rendering an approval :class:`Card` as Feishu card JSON 2.0.

Text that comes from agents or people (tool names, arguments, names, reasons)
never goes into markdown, where it could fake a heading or a link: it goes into
``plain_text`` elements, and the arguments into a fenced block whose lines (each a
JSON-encoded field name and value) can never start with a backtick fence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from signoff.channels._contract import (
    ArgumentsView,
    Card,
    GrantChoice,
    Person,
    Verdict,
    edit_input,
    lay_out_arguments,
    reminder_text,
    safe_url,
)
from signoff.channels.feishu._parse import MAX_REASON_CHARS, REASON_FIELD, edit_field

__all__ = [
    "MAX_ARGUMENTS_BYTES",
    "MAX_CARD_BYTES",
    "ToastType",
    "callback_body",
    "render_card",
    "render_reminder",
]

MAX_CARD_BYTES = 30_000
"""The largest card Feishu takes: 30 KB of card JSON."""
MAX_ARGUMENTS_BYTES = 8_000
"""The most a card's argument lines take (less when the rest of the card leaves less room
within :data:`MAX_CARD_BYTES`), each at most :data:`_ARGUMENT_LINE_BYTES`."""
_ARGUMENT_LINE_BYTES = 2_000
_NOTE_BYTES = 1_000
"""Room kept for the arguments' frame, the note about values cut short and its link."""
_MAX_URL_CHARS = 500
_MAX_FIELD_CHARS = 200
_MAX_INPUT_CHARS = 1000
"""The longest text a card's ``input`` holds."""
_MAX_NAMES = 20

ToastType = Literal["info", "success", "warning", "error"]

_HEADERS: dict[str, tuple[str, str]] = {
    "pending": ("Approval required", "orange"),
    "approved": ("Approved", "green"),
    "rejected": ("Rejected", "red"),
    "expired": ("Expired", "grey"),
    "cancelled": ("Cancelled", "grey"),
}


def _cut(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(content: str) -> dict[str, Any]:
    return {"tag": "plain_text", "content": content}


def _when(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _names(people: Iterable[Person]) -> str:
    names = [_cut(person.name, 60) for person in people]
    shown = ", ".join(names[:_MAX_NAMES])
    return shown if len(names) <= _MAX_NAMES else f"{shown} and {len(names) - _MAX_NAMES} more"


def _card_bytes(data: Any) -> int:
    return len(json.dumps(data, ensure_ascii=False).encode())


def _arguments_element(card: Card, view: ArgumentsView) -> dict[str, Any]:
    """The arguments as :func:`~signoff.channels.lay_out_arguments` lays them out, a line per
    field, and a link to the request in Signoff when they are not all there whole."""
    if not view.fields:
        return {"tag": "markdown", "content": "**Arguments**: none"}
    parts = ["**Arguments**"]
    if view.complete:
        parts.append("```json\n" + "\n".join(line.text for line in view.lines) + "\n```")
    if view.notice is not None:
        url = safe_url(card.console_url) if card.console_url else ""
        if url and len(url) <= _MAX_URL_CHARS:
            parts.append(f"{view.notice} [Open in Signoff]({url})")
        else:
            parts.append(f"{view.notice} (request {_cut(card.request_id, 100)})")
    return {"tag": "markdown", "content": "\n".join(parts)}


def _details(card: Card) -> str:
    lines = [f"Agent: {_cut(card.agent_id)}", f"Tool: {_cut(card.tool_name)}"]
    if card.requester is not None:
        lines.append(f"On behalf of: {_cut(card.requester.name)}")
    lines.append(f"Requested: {_when(card.created_at)}")
    if card.is_pending:
        lines.append(f"Expires: {_when(card.expires_at)}")
    lines.append(f"Approvers: {_names(card.approvers) if card.approvers else 'anyone in this chat'}")
    if card.gates:
        # Several gates must approve: how each stands, this chat's and the others'.
        lines.append("Reviews (every one must approve):")
        for gate in card.gates:
            line = f"- {_cut(gate.name, 100)}: {len(gate.approvals)} of {gate.quorum}"
            if gate.approvals:
                line += f" ({_names(gate.approvals)})"
            if not gate.here:
                line += ", in another channel"
            lines.append(line + (" ✓" if gate.approved else ""))
        return "\n".join(lines)
    approvals = f"Approvals: {len(card.approvals)} of {card.quorum}"
    if card.approvals:
        approvals += f" ({_names(card.approvals)})"
    lines.append(approvals)
    return "\n".join(lines)


def _outcome(card: Card) -> str:
    lines = []
    if card.status == "approved":
        by = f" by {_cut(card.decided_by.name)}" if card.decided_by is not None else ""
        lines.append(
            f"Approved{by} {card.approved_how}" if card.changes else f"Approved {card.approved_how}{by}"
        )
    if card.status == "expired" and card.reason:
        # Nobody refused: say so, and whom it asked, instead of giving a "reason".
        lines.append(f"Expired: {_cut(card.reason, MAX_REASON_CHARS)}")
    if card.decided_by is not None:
        lines.append(f"Decided by: {_cut(card.decided_by.name)}")
    if card.decided_at is not None:
        lines.append(f"{'Expired' if card.status == 'expired' else 'Decided'} at: {_when(card.decided_at)}")
    elif card.status == "expired":
        lines.append(f"Expired at: {_when(card.expires_at)}")
    if card.reason and card.status != "expired":
        lines.append(f"Reason: {_cut(card.reason, MAX_REASON_CHARS)}")
    return "\n".join(lines)


def _value(card: Card, verdict: Verdict, grant: GrantChoice | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"request_id": card.request_id, "verdict": verdict.value}
    if grant is not None:
        value["grant"] = grant.as_dict()
    return value


def _grant_button(card: Card, index: int, grant: GrantChoice) -> dict[str, Any]:
    return {
        "tag": "button",
        "name": f"grant_{index}",
        "text": _plain(_cut(grant.label(), 60)),
        "type": "default",
        "confirm": {
            "title": _plain(f"Approve for {grant.where}?"),
            "text": _plain(_cut(grant.explain(_cut(card.agent_id, 60), _cut(card.tool_name, 60)), 300)),
        },
        "behaviors": [{"type": "callback", "value": _value(card, Verdict.APPROVE, grant)}],
    }


def _buttons(card: Card, *, approvable: bool) -> list[dict[str, Any]]:
    """Approve (with a button per grant and the edit form) when ``approvable``; the rejection form."""
    approve = {
        "tag": "button",
        "name": "approve",
        "text": _plain("Approve once" if card.grants else "Approve"),
        "type": "primary",
        "confirm": {
            "title": _plain("Approve this call?"),
            "text": _plain(f"{_cut(card.agent_id, 60)} will run {_cut(card.tool_name, 60)}."),
        },
        "behaviors": [{"type": "callback", "value": _value(card, Verdict.APPROVE)}],
    }
    hint = "required" if card.require_reject_reason else "optional"
    reject_form = {
        "tag": "form",
        "name": "reject_form",
        "elements": [
            {
                "tag": "input",
                "name": REASON_FIELD,
                "required": card.require_reject_reason,
                "max_length": MAX_REASON_CHARS,
                "placeholder": _plain(f"Reason for rejecting ({hint})"),
            },
            {
                "tag": "button",
                "name": "reject",
                "text": _plain("Reject"),
                "type": "danger",
                "form_action_type": "submit",
                "behaviors": [{"type": "callback", "value": _value(card, Verdict.REJECT)}],
            },
        ],
    }
    if not approvable:
        return [reject_form]
    grants = [_grant_button(card, i, grant) for i, grant in enumerate(card.grants)]
    edit_form = _edit_form(card)
    return [approve, *grants, *([edit_form] if edit_form else []), reject_form]


def _edit_form(card: Card) -> dict[str, Any] | None:
    """ "Edit and approve": an input per field the approver may change, holding its current
    value, and a submit button whose value lists the fields (and whether each held text)."""
    inputs: list[dict[str, Any]] = []
    fields: list[list[str]] = []
    for name in card.editable:
        current = card.arguments.get(name)
        shown = edit_input(current) if name in card.arguments else ""
        if len(shown) > _MAX_INPUT_CHARS:
            continue
        element: dict[str, Any] = {
            "tag": "input",
            "name": edit_field(len(fields)),
            "max_length": _MAX_INPUT_CHARS,
            "label": _plain(_cut(name, 60)),
            "placeholder": _plain("Text as typed" if isinstance(current, str) else "JSON or text"),
        }
        if shown:
            element["default_value"] = shown
        inputs.append(element)
        fields.append([name, "text" if isinstance(current, str) else "json"])
    if not inputs:
        return None
    value = {**_value(card, Verdict.APPROVE), "edit": fields}
    submit = {
        "tag": "button",
        "name": "edit_approve",
        "text": _plain("Edit and approve"),
        "type": "primary",
        "form_action_type": "submit",
        "behaviors": [{"type": "callback", "value": value}],
    }
    return {"tag": "form", "name": "edit_form", "elements": [*inputs, submit]}


def render_card(card: Card) -> dict[str, Any]:
    """The card JSON 2.0 for ``card`` as it stands now, within :data:`MAX_CARD_BYTES`.

    Pending: what the agent wants to do, for whom, until when, who may approve and
    how many approvals are in; an Approve button (with a button per grant the gate
    offers beside it) and a rejection form (reason input + Reject submit). Each
    callback ``value`` is an object naming the request and the verdict (and the
    grant). Decided, expired or cancelled: the outcome (approved once, or with which
    grant until when), who decided, when and why, and no buttons left.

    The arguments show every field's name and the start of its value in the room the rest
    of the card leaves; a call whose fields do not fit offers the rejection form only.
    """
    title, colour = _HEADERS.get(card.status, (card.status.capitalize(), "grey"))

    def build(arguments: dict[str, Any], *, approvable: bool) -> dict[str, Any]:
        elements: list[dict[str, Any]] = [{"tag": "div", "text": _plain(_details(card))}, arguments]
        if card.is_pending:
            elements.append({"tag": "hr"})
            elements.extend(_buttons(card, approvable=approvable))
        else:
            outcome = _outcome(card)
            if outcome:
                elements.append({"tag": "hr"})
                elements.append({"tag": "div", "text": _plain(outcome)})
        return {
            "schema": "2.0",
            "config": {"update_multi": True},
            "header": {
                "title": _plain(title),
                "subtitle": _plain(_cut(f"{card.agent_id} wants to run {card.tool_name}", 100)),
                "template": colour,
            },
            "body": {"elements": elements},
        }

    rest = _card_bytes(build({"tag": "markdown", "content": ""}, approvable=True))
    view = lay_out_arguments(
        card.arguments,
        budget=max(min(MAX_ARGUMENTS_BYTES, MAX_CARD_BYTES - rest - _NOTE_BYTES), 0),
        line_limit=_ARGUMENT_LINE_BYTES,
        # A line's bytes in the card JSON, with the line break after it (both escaped there).
        size=_card_bytes,
    )
    return build(_arguments_element(card, view), approvable=view.complete)


def callback_body(toast: ToastType, message: str, card: Card | None = None) -> dict[str, Any]:
    """The synchronous answer to a card callback: a toast, and the redrawn card when known.

    The card goes back as ``{"type": "raw", "data": <card JSON 2.0 object>}``, the
    same schema as the card that was clicked.
    """
    body: dict[str, Any] = {"toast": {"type": toast, "content": _cut(message, 300)}}
    if card is not None:
        body["card"] = {"type": "raw", "data": render_card(card)}
    return body


def render_reminder(card: Card, waiting_on: tuple[Person, ...]) -> dict[str, Any]:
    """A reminder as the ``content`` of a ``post`` message replying to the card: an ``at``
    element per approver still to vote who has an open_id (Feishu notifies them), their
    name otherwise, and the rest as ``text`` elements, which Feishu never parses for
    mentions (an agent's tool name cannot @ everyone)."""
    elements: list[dict[str, Any]] = []

    def mention(person: Person) -> str:
        if person.user_id:
            elements.append({"tag": "at", "user_id": person.user_id})
        else:
            elements.append({"tag": "text", "text": f"{_cut(person.name, 60)} "})
        return ""

    text = reminder_text(card, waiting_on, mention=mention).lstrip()
    elements.append({"tag": "text", "text": (" " if waiting_on else "") + _cut(text, 2 * _MAX_FIELD_CHARS)})
    return {"zh_cn": {"title": "Reminder: approval still needed", "content": [elements]}}
