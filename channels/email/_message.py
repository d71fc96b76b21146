"""The approval email (pure): one message per recipient, HTML and plain text, a link per choice."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from html import escape

from signoff.channels._contract import ArgumentsView, Card, Person, lay_out_arguments, safe_url

__all__ = [
    "Choice",
    "argument_view",
    "message_id",
    "render_html",
    "render_message",
    "render_text",
    "subject_of",
]

_MAX_ARGUMENT_CHARS = 20_000
"""The most the argument lines of one message take (each line and its line break)."""
_MAX_HEADER_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
_ID_SAFE = re.compile(r"[^A-Za-z0-9._-]")

# One palette with the console (app/console/static/console.css); inline, as mail clients
# drop style sheets.
_INK, _MUTED, _LINE, _WASH = "#1b1f24", "#57606a", "#d0d7de", "#f6f8fa"
_BUTTONS = {
    "approve": ("#1a7f37", "#ffffff", "#1a7f37"),
    "grant": ("#ffffff", "#0a58ca", "#0a58ca"),
    "reject": ("#ffffff", "#cf222e", "#cf222e"),
}
# Single quotes only: these go inside double-quoted style attributes.
_FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"
_MONO = "ui-monospace, Menlo, Consolas, 'DejaVu Sans Mono', monospace"


@dataclass(frozen=True, slots=True)
class Choice:
    """One link in the message: what it is called, where it goes, what it allows."""

    kind: str
    """``approve``, ``grant`` or ``reject``."""
    label: str
    url: str
    explain: str | None = None


def _one_line(text: str, limit: int = _MAX_HEADER_CHARS) -> str:
    """Text fit for a header: no line breaks or control characters (no header injection)."""
    flat = _CONTROL.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _date(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def argument_view(card: Card) -> ArgumentsView:
    """The card's arguments as its message lays them out (incomplete: the message offers no approval)."""
    return lay_out_arguments(card.arguments, budget=_MAX_ARGUMENT_CHARS, size=lambda text: len(text) + 1)


def _arguments(view: ArgumentsView) -> str:
    if not view.fields:
        return "(none)"
    return "\n".join(line.text for line in view.lines)


def _names(people: Sequence[Person]) -> str:
    return ", ".join(p.name for p in people)


def subject_of(card: Card, *, reminder: bool = False) -> str:
    still = "Waiting on you: " if reminder else ""
    return _one_line(f"{still}Approval needed: {card.agent_id} wants to run {card.tool_name}")


def message_id(card: Card, recipient: str, sender_domain: str, batch: str | None = None) -> str:
    """The message's ``Message-ID``, the same each time it is sent (a retried send after a lost
    reply carries the same id, which mail stores de-duplicate on); ``batch`` names a reminder,
    whose messages are new ones."""
    who = hashlib.sha256(recipient.strip().lower().encode()).hexdigest()[:16]
    which = "" if batch in (None, card.request_id) else "." + hashlib.sha256(batch.encode()).hexdigest()[:12]
    return f"<signoff.{_ID_SAFE.sub('-', card.request_id)[:80]}.{who}{which}@{sender_domain}>"


def _facts(card: Card) -> list[tuple[str, str]]:
    facts = [("Agent", card.agent_id), ("Tool", card.tool_name)]
    if card.requester is not None:
        facts.append(("On behalf of", card.requester.name))
    facts.append(("Deadline", _date(card.expires_at)))
    facts.append(("Approvers", _names(card.approvers) or "—"))
    if card.gates:
        lines = [
            f"{g.name}: {len(g.approvals)} of {g.quorum}{'' if g.here else ' (in another channel)'}"
            for g in card.gates
        ]
        facts.append(("Reviews (every one must approve)", "; ".join(lines)))
    else:
        approvals = f"{len(card.approvals)} of {card.quorum}"
        if card.approvals:
            approvals += f": {_names(card.approvals)}"
        facts.append(("Approvals", approvals))
    facts.append(("Request", card.request_id))
    return facts


_NOTICE = (
    "Each link opens a confirmation page; nothing is decided until you confirm there. "
    "The links are yours alone: anyone who has them can answer as you, so do not forward this message."
)


def render_text(card: Card, recipient: Person, choices: Sequence[Choice]) -> str:
    lines = [
        f"Hello {recipient.name},",
        "",
        f"{card.agent_id} wants to run {card.tool_name} and needs your approval.",
        "",
    ]
    lines += [f"{label}: {value}" for label, value in _facts(card)]
    view = argument_view(card)
    lines += ["", "Arguments:"]
    if view.complete:
        lines.append(_arguments(view))
    if view.notice is not None:
        lines.append(view.notice)
        if card.console_url:
            lines.append(f"Open in Signoff: {safe_url(card.console_url)}")
    lines.append("")
    if card.require_reject_reason:
        lines += ["A rejection needs a reason (the page asks for it).", ""]
    for choice in choices:
        lines.append(f"{choice.label}:")
        if choice.explain:
            lines.append(f"  {choice.explain}")
        lines += [f"  {choice.url}", ""]
    lines += [_NOTICE, "", "-- ", "Signoff"]
    return "\n".join(lines) + "\n"


def _button(choice: Choice) -> str:
    background, ink, border = _BUTTONS.get(choice.kind, _BUTTONS["grant"])
    style = (
        f"display:inline-block;padding:10px 18px;margin:0 8px 8px 0;border-radius:6px;"
        f"border:1px solid {border};background:{background};color:{ink};font-weight:600;"
        f"text-decoration:none;font-family:{_FONT};font-size:15px"
    )
    link = f'<a href="{escape(choice.url)}" style="{style}">{escape(choice.label)}</a>'
    if choice.explain:
        hint = f'<div style="color:{_MUTED};font-size:13px;margin:0 0 10px">{escape(choice.explain)}</div>'
        return f"<div>{link}{hint}</div>"
    return f"<div>{link}</div>"


def _arguments_html(card: Card, pre_style: str) -> str:
    view = argument_view(card)
    html = f'<pre style="{pre_style}">{escape(_arguments(view))}</pre>' if view.complete else ""
    if view.notice is not None:
        link = ""
        if card.console_url:
            href = escape(safe_url(card.console_url))
            link = f' <a href="{href}" style="color:#0a58ca">Open in Signoff</a>'
        html += f'<p style="margin:8px 0 0">{escape(view.notice)}{link}</p>'
    return html


def render_html(card: Card, recipient: Person, choices: Sequence[Choice]) -> str:
    rows = "".join(
        f'<tr><td style="padding:4px 16px 4px 0;color:{_MUTED};font-size:13px;text-transform:uppercase;'
        f'letter-spacing:0.03em;vertical-align:top;white-space:nowrap">{escape(label)}</td>'
        f'<td style="padding:4px 0;vertical-align:top;word-break:break-word">{escape(value)}</td></tr>'
        for label, value in _facts(card)
    )
    pre_style = (
        f"background:{_WASH};border:1px solid {_LINE};border-radius:8px;padding:12px;margin:0;"
        f"font-family:{_MONO};font-size:13px;white-space:pre-wrap;word-break:break-word"
    )
    reason_note = (
        f'<p style="color:{_MUTED};font-size:13px;margin:0 0 12px">A rejection needs a reason '
        "(the page asks for it).</p>"
        if card.require_reject_reason
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(subject_of(card))}</title></head>"
        f'<body style="margin:0;padding:0;background:#ffffff;color:{_INK};font-family:{_FONT};'
        'font-size:15px;line-height:1.45">'
        '<div style="background:#24292f;color:#ffffff;padding:10px 20px;font-weight:700;font-size:17px">'
        "Signoff</div>"
        '<div style="max-width:640px;padding:16px 20px 28px">'
        f'<h1 style="font-size:21px;margin:4px 0 6px">Approval needed: '
        f'<span style="font-family:{_MONO}">{escape(card.tool_name)}</span></h1>'
        f'<p style="margin:0 0 14px">Hello {escape(recipient.name)}, '
        f"<strong>{escape(card.agent_id)}</strong> wants to run "
        f"<strong>{escape(card.tool_name)}</strong> and needs your approval.</p>"
        f'<table role="presentation" style="border-collapse:collapse;margin:0 0 14px">{rows}</table>'
        f'<h2 style="font-size:16px;margin:0 0 6px">Arguments</h2>'
        f"{_arguments_html(card, pre_style)}"
        '<div style="margin:18px 0 6px">'
        f"{''.join(_button(c) for c in choices)}</div>"
        f"{reason_note}"
        f'<p style="color:{_MUTED};font-size:13px;margin:12px 0 0">{escape(_NOTICE)}</p>'
        "</div></body></html>"
    )


def render_message(
    card: Card,
    *,
    sender: str,
    recipient: Person,
    address: str,
    choices: Sequence[Choice],
    message_id: str,
    now: datetime,
    reminder: bool = False,
) -> EmailMessage:
    """The message to ``address``: plain text first, HTML as the preferred alternative
    (``reminder``: a reminder or an escalation, whose subject says the request waits on them)."""
    msg = EmailMessage()
    msg["Subject"] = subject_of(card, reminder=reminder)
    msg["From"] = sender
    msg["To"] = address
    msg["Date"] = format_datetime(now.astimezone(UTC))
    msg["Message-ID"] = message_id
    # An automatic message: no out-of-office replies, no auto-forwarding rules.
    msg["Auto-Submitted"] = "auto-generated"
    msg["X-Auto-Response-Suppress"] = "All"
    msg["X-Signoff-Request"] = _one_line(card.request_id)
    msg.set_content(render_text(card, recipient, choices))
    msg.add_alternative(render_html(card, recipient, choices), subtype="html")
    return msg
