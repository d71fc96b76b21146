"""What one ntfy notification says: pure functions of the card, the tokens and the clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from signoff.channels._contract import Card, duration_text, lay_out_arguments, shown_text

__all__ = ["MAX_MESSAGE_BYTES", "Action", "Notification", "render_notification"]

MAX_MESSAGE_BYTES = 4096
"""ntfy's default ``message-size-limit``: a longer body would become an attachment."""
_ARGUMENT_BYTES = 3000
"""What the argument lines may take of it at most (less when the rest of the message, what,
who, time left and the request, leaves less room)."""
_NOTICE_BYTES = 200
"""Room kept for the line saying values are cut short or the fields do not fit."""
_TOOL_CHARS = 250
"""The longest tool name a message shows (counted as written, escapes included); a
longer one is cut short, and the notification then offers no Approve."""
_LINE_BYTES = 200
"""A value longer than fits a lock screen is cut short ("… N more characters"); whole in Signoff."""
_TITLE_CHARS = 200


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Action:
    """One of a notification's buttons, as ntfy's publish API takes it (``actions``)."""

    action: Literal["http", "view"]
    label: str
    url: str
    method: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None
    clear: bool = False

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "action": self.action,
            "label": self.label,
            "url": self.url,
            "clear": self.clear,
        }
        if self.action == "http":
            data["method"] = self.method or "POST"
            if self.headers:
                data["headers"] = dict(self.headers)
            if self.body is not None:
                data["body"] = self.body
        return data


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification, published as JSON to the server's root URL."""

    topic: str
    title: str
    message: str
    priority: int
    tags: tuple[str, ...]
    click: str | None
    actions: tuple[Action, ...]

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "topic": self.topic,
            "title": self.title,
            "message": self.message,
            "priority": self.priority,
            "tags": list(self.tags),
            "actions": [a.as_json() for a in self.actions],
        }
        if self.click:
            data["click"] = self.click
        return data


def render_notification(
    card: Card,
    *,
    topic: str,
    callback_url: str,
    approve_token: str,
    reject_token: str,
    reject_page: str,
    now: datetime,
    priority: int = 4,
    reminder: bool = False,
) -> Notification:
    """The notification asking the person at ``topic`` to decide ``card``.

    Approve and Reject are ``http`` actions that POST their token (the body, as text) to
    ``callback_url``, as the phone app sends them; Open is a ``view`` action to the console
    page. A gate that wants a reason for a rejection gets a Reject that opens
    ``reject_page`` (the token's page, with a reason field) instead. The body stays within
    :data:`MAX_MESSAGE_BYTES` (a longer one would reach the phone as an attachment under the
    same actions): the arguments get the room the rest leaves, and a call whose argument fields
    do not all fit, or whose tool name is too long to show whole, offers no Approve (the whole
    call is in Signoff)."""
    tool, agent = shown_text(card.tool_name), shown_text(card.agent_id)
    whole_tool = len(tool) <= _TOOL_CHARS
    left = max(0, int((card.expires_at - now).total_seconds()))
    deadline = card.expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"Tool: {_cut(tool, _TOOL_CHARS)}", f"Agent: {agent}"]
    if not whole_tool:
        head.append("The tool's name is cut short here, so it cannot be approved here.")
    tail = [f"Time left: {duration_text(left)} (expires {deadline})"]
    if card.quorum > 1:
        tail.append(f"Approvals: {len(card.approvals)} of {card.quorum}")
    tail.append(f"Request {card.request_id}")
    if card.require_reject_reason:
        tail.append("Rejecting needs a reason: Reject… opens a page to give one.")
    # The arguments get the room the rest leaves within ntfy's limit: a longer body would
    # reach the approver as an attachment, under the same actions.
    rest = len("\n".join([*head, "Arguments: none", *tail]).encode("utf-8")) + _NOTICE_BYTES
    view = lay_out_arguments(
        card.arguments,
        budget=max(0, min(_ARGUMENT_BYTES, MAX_MESSAGE_BYTES - rest)),
        line_limit=_LINE_BYTES,
        size=lambda line: len(line.encode("utf-8")) + 1,
    )
    lines = list(head)
    if card.arguments:
        lines.append("Arguments:")
        lines += [line.text for line in view.lines]
    else:
        lines.append("Arguments: none")
    if view.notice:
        lines.append(view.notice)
    lines += tail
    message = "\n".join(lines)
    approvable = view.complete and whole_tool and len(message.encode("utf-8")) <= MAX_MESSAGE_BYTES

    headers = {"Content-Type": "text/plain"}
    actions: list[Action] = []
    if approvable:
        actions.append(Action("http", "Approve", callback_url, "POST", headers, approve_token, clear=True))
    if card.require_reject_reason:
        actions.append(Action("view", "Reject…", reject_page))
    else:
        actions.append(Action("http", "Reject", callback_url, "POST", headers, reject_token, clear=True))
    if card.console_url:
        actions.append(Action("view", "Open", card.console_url))
    what = f"Approve {tool} for {agent}?"
    return Notification(
        topic=topic,
        title=_cut(f"Reminder: {what}" if reminder else what, _TITLE_CHARS),
        message=message,
        priority=priority,
        tags=("alarm_clock",) if reminder else ("lock",),
        click=card.console_url,
        actions=tuple(actions),
    )
