"""Rendering an approval :class:`Card` as an Adaptive Card with ``Action.Execute``.

Text that comes from agents or people (tool names, arguments, names, reasons) goes into
``RichTextBlock`` text runs, which Teams never reads as markdown, so no argument can draw
a link or a heading; only this module's own words are ``TextBlock`` s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from signoff.channels._contract import (
    MAX_REASON_CHARS,
    ArgumentsView,
    Card,
    Person,
    Verdict,
    edit_input,
    lay_out_arguments,
    reminder_text,
)

__all__ = [
    "CARD_CONTENT_TYPE",
    "GRANT_INPUT",
    "MAX_CARD_BYTES",
    "REASON_INPUT",
    "edit_input_id",
    "invoke_response",
    "message_activity",
    "render_card",
    "render_reminder",
]

CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
MAX_CARD_BYTES = 24_000
"""Teams takes messages up to about 28 KB; the card keeps room for the activity around it."""
_MAX_ARGUMENTS_BYTES = 10_000
_ARGUMENT_LINE_BYTES = 2_000
_NOTE_BYTES = 1_500
_MAX_FIELD_CHARS = 200
_MAX_INPUT_CHARS = 1000
_MAX_NAMES = 20
_MAX_URL_CHARS = 1000
REASON_INPUT = "reason"
"""The ``id`` of the rejection form's text input; Teams merges it into the action's data."""
GRANT_INPUT = "grant"
"""The ``id`` of the choice between approving once and a grant."""
ONCE = "once"


def edit_input_id(index: int) -> str:
    """The ``id`` of the edit form's input for the ``index``-th field."""
    return f"edit_{index}"


_HEADERS: dict[str, tuple[str, str]] = {
    "pending": ("Approval required", "Warning"),
    "approved": ("Approved", "Good"),
    "rejected": ("Rejected", "Attention"),
    "expired": ("Expired", "Default"),
    "cancelled": ("Cancelled", "Default"),
}


def _cut(text: str, limit: int = _MAX_FIELD_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _names(people: Iterable[Person]) -> str:
    names = [_cut(person.name, 60) for person in people]
    shown = ", ".join(names[:_MAX_NAMES])
    return shown if len(names) <= _MAX_NAMES else f"{shown} and {len(names) - _MAX_NAMES} more"


def _runs(
    *lines: str, monospace: bool = False, weight: str | None = None, color: str | None = None
) -> dict[str, Any]:
    """A ``RichTextBlock``: each line a text run of its own (plain text, never markdown)."""
    inlines: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        run: dict[str, Any] = {"type": "TextRun", "text": line + ("\n" if i < len(lines) - 1 else "")}
        if monospace:
            run["fontType"] = "Monospace"
        if weight:
            run["weight"] = weight
        if color:
            run["color"] = color
        inlines.append(run)
    return {"type": "RichTextBlock", "inlines": inlines}


def _label(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "TextBlock", "text": text, "wrap": True, **extra}


def _details(card: Card) -> list[str]:
    lines = [f"Agent: {_cut(card.agent_id)}", f"Tool: {_cut(card.tool_name)}"]
    if card.requester is not None:
        lines.append(f"On behalf of: {_cut(card.requester.name)}")
    lines.append(f"Requested: {_when(card.created_at)}")
    if card.is_pending:
        lines.append(f"Expires: {_when(card.expires_at)}")
    lines.append(f"Approvers: {_names(card.approvers) if card.approvers else 'anyone in this conversation'}")
    if card.gates:
        lines.append("Reviews (every one must approve):")
        for gate in card.gates:
            line = f"- {_cut(gate.name, 100)}: {len(gate.approvals)} of {gate.quorum}"
            if gate.approvals:
                line += f" ({_names(gate.approvals)})"
            if not gate.here:
                line += ", in another channel"
            lines.append(line + (" ✓" if gate.approved else ""))
        return lines
    approvals = f"Approvals: {len(card.approvals)} of {card.quorum}"
    if card.approvals:
        approvals += f" ({_names(card.approvals)})"
    lines.append(approvals)
    return lines


def _outcome(card: Card) -> list[str]:
    lines = []
    if card.status == "approved":
        by = f" by {_cut(card.decided_by.name)}" if card.decided_by is not None else ""
        lines.append(
            f"Approved{by} {card.approved_how}" if card.changes else f"Approved {card.approved_how}{by}"
        )
    if card.status == "expired" and card.reason:
        lines.append(f"Expired: {_cut(card.reason, MAX_REASON_CHARS)}")
    if card.decided_by is not None:
        lines.append(f"Decided by: {_cut(card.decided_by.name)}")
    if card.decided_at is not None:
        lines.append(f"{'Expired' if card.status == 'expired' else 'Decided'} at: {_when(card.decided_at)}")
    elif card.status == "expired":
        lines.append(f"Expired at: {_when(card.expires_at)}")
    if card.reason and card.status != "expired":
        lines.append(f"Reason: {_cut(card.reason, MAX_REASON_CHARS)}")
    return lines


def _data(card: Card, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"request_id": card.request_id}
    here = [gate.name for gate in card.gates if gate.here]
    if here:
        data["gates"] = here
    return {**data, **extra}


def _arguments(card: Card, view: ArgumentsView) -> list[dict[str, Any]]:
    if not view.fields:
        return [_label("Arguments: none", weight="Bolder", spacing="Medium")]
    elements: list[dict[str, Any]] = [_label("Arguments", weight="Bolder", spacing="Medium")]
    if view.complete:
        elements.append(_runs(*(line.text for line in view.lines), monospace=True))
    if view.notice is not None:
        elements.append(_runs(view.notice))
    return elements


def _edit_card(card: Card) -> dict[str, Any] | None:
    """ "Edit and approve": an input per field the approver may change, holding its current
    value, and an approval whose data lists the fields (and whether each held text)."""
    inputs: list[dict[str, Any]] = []
    fields: list[list[str]] = []
    for name in card.editable:
        current = card.arguments.get(name)
        shown = edit_input(current) if name in card.arguments else ""
        if len(shown) > _MAX_INPUT_CHARS:
            continue
        inputs.append(
            {
                "type": "Input.Text",
                "id": edit_input_id(len(fields)),
                "label": _cut(name, 60),
                "value": shown,
                "maxLength": _MAX_INPUT_CHARS,
                "placeholder": "Text as typed" if isinstance(current, str) else "JSON or text",
            }
        )
        fields.append([name, "text" if isinstance(current, str) else "json"])
    if not inputs:
        return None
    return {
        "type": "Action.ShowCard",
        "title": "Edit and approve…",
        "card": {
            "type": "AdaptiveCard",
            "body": inputs,
            "actions": [
                {
                    "type": "Action.Execute",
                    "title": "Approve with these values",
                    "verb": Verdict.APPROVE.value,
                    "style": "positive",
                    "data": _data(card, edit=fields),
                }
            ],
        },
    }


def _actions(card: Card, *, approvable: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The body inputs and the actions of a pending card."""
    reason: dict[str, Any] = {
        "type": "Input.Text",
        "id": REASON_INPUT,
        "label": "Reason" + (" (required)" if card.require_reject_reason else " (optional)"),
        "isMultiline": True,
        "maxLength": MAX_REASON_CHARS,
        "isRequired": card.require_reject_reason,
    }
    if card.require_reject_reason:
        reason["errorMessage"] = "Say why you reject this call."
    reject = {
        "type": "Action.ShowCard",
        "title": "Reject…",
        "card": {
            "type": "AdaptiveCard",
            "body": [reason],
            "actions": [
                {
                    "type": "Action.Execute",
                    "title": "Reject",
                    "verb": Verdict.REJECT.value,
                    "style": "destructive",
                    "data": _data(card),
                }
            ],
        },
    }
    if not approvable:
        return [], [reject]
    inputs: list[dict[str, Any]] = []
    if card.grants:
        choices = [{"title": "Approve once", "value": ONCE}]
        choices += [
            {"title": _cut(grant.label(), 80), "value": json.dumps(grant.as_dict(), separators=(",", ":"))}
            for grant in card.grants
        ]
        inputs = [
            {
                "type": "Input.ChoiceSet",
                "id": GRANT_INPUT,
                "label": "Approve",
                "style": "expanded",
                "value": ONCE,
                "choices": choices,
            },
            *(
                _runs(_cut(grant.explain(_cut(card.agent_id, 60), _cut(card.tool_name, 60)), 300))
                for grant in card.grants
            ),
        ]
    approve = {
        "type": "Action.Execute",
        "title": "Approve",
        "verb": Verdict.APPROVE.value,
        "style": "positive",
        "data": _data(card),
    }
    edit = _edit_card(card)
    return inputs, [approve, *([edit] if edit else []), reject]


def _card_bytes(data: Any) -> int:
    return len(json.dumps(data, ensure_ascii=False).encode())


def render_card(card: Card, *, note: str | None = None) -> dict[str, Any]:
    """The Adaptive Card (1.4) for ``card`` as it stands, within :data:`MAX_CARD_BYTES`.

    Pending: what the agent wants to run, for whom, until when, who may approve, the
    approvals so far and every argument field; Approve (with the choice of a grant when the
    gate offers any), "Edit and approve…" when fields may change, and "Reject…" with a
    reason. Each ``Action.Execute`` has the verb ``approve`` or ``reject`` and data naming
    the request. Decided, expired or cancelled: the outcome, who decided, when and why,
    and no actions but the link to Signoff. A call whose fields do not all fit offers
    "Reject…" only. ``note``: one line for the clicker (why their click did not count).
    """
    title, colour = _HEADERS.get(card.status, (card.status.capitalize(), "Default"))

    def build(arguments: list[dict[str, Any]], *, approvable: bool) -> dict[str, Any]:
        body: list[dict[str, Any]] = [
            _label(title, weight="Bolder", size="Medium", color=colour),
            _runs(_cut(f"{card.agent_id} wants to run {card.tool_name}", 160), weight="Bolder"),
        ]
        if note:
            body.append(_runs(_cut(note, 300), color="Attention"))
        body += [_runs(*_details(card)), *arguments]
        actions: list[dict[str, Any]] = []
        if card.is_pending:
            inputs, actions = _actions(card, approvable=approvable)
            body += inputs
        else:
            outcome = _outcome(card)
            if outcome:
                body.append({"type": "Container", "separator": True, "items": [_runs(*outcome)]})
        if card.console_url and len(card.console_url) <= _MAX_URL_CHARS:
            actions.append({"type": "Action.OpenUrl", "title": "Open in Signoff", "url": card.console_url})
        return {
            "type": "AdaptiveCard",
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "version": "1.4",
            "msteams": {"width": "Full"},
            "body": body,
            "actions": actions,
        }

    rest = _card_bytes(build([], approvable=True))
    view = lay_out_arguments(
        card.arguments,
        budget=max(min(_MAX_ARGUMENTS_BYTES, MAX_CARD_BYTES - rest - _NOTE_BYTES), 0),
        line_limit=_ARGUMENT_LINE_BYTES,
        size=_card_bytes,
    )
    return build(_arguments(card, view), approvable=view.complete)


def message_activity(card: Card) -> dict[str, Any]:
    """The message activity that carries the card (posted, or put in place of the one posted)."""
    summary = _cut(
        f"{_HEADERS.get(card.status, (card.status,))[0]}: {card.agent_id} wants to run {card.tool_name}", 200
    )
    return {
        "type": "message",
        "summary": summary,
        "attachments": [{"contentType": CARD_CONTENT_TYPE, "content": render_card(card)}],
    }


def invoke_response(card: Card, *, note: str | None = None) -> dict[str, Any]:
    """The answer to an ``adaptiveCard/action`` invoke: the card as it stands now, which
    Teams shows the clicker in place of the one clicked."""
    return {"statusCode": 200, "type": CARD_CONTENT_TYPE, "value": render_card(card, note=note)}


def render_reminder(card: Card, waiting_on: tuple[Person, ...]) -> dict[str, Any]:
    """A reminder, a reply in the card's thread: an ``<at>`` mention per approver still to
    vote who has an Entra object id here (Teams notifies them), their name otherwise. Text
    from agents has ``<`` and ``>`` escaped, so it can mention nobody."""
    entities: list[dict[str, Any]] = []

    def escape(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def mention(person: Person) -> str:
        name = escape(_cut(person.name, 60))
        if not person.user_id:
            return name
        tag = f"<at>{name}</at>"
        entities.append(
            {
                "type": "mention",
                "text": tag,
                "mentioned": {"id": person.user_id, "name": _cut(person.name, 60)},
            }
        )
        return tag

    text = reminder_text(card, waiting_on, mention=mention, escape=escape)
    return {"type": "message", "textFormat": "xml", "text": text, "entities": entities}
