"""Draw the Slack cards in the docs from the exact blocks the Slack channel posts.

    .venv/bin/python scripts/card_pictures.py [--out docs]

Builds sample cards, renders them with ``signoff.channels.slack`` (the code that posts
them), turns the Block Kit JSON into HTML laid out as Slack lays it out (header, fields
in two columns, code blocks, context line, buttons, a grant button's confirm dialog) and
photographs it with headless Chromium (``make chromium`` installs it). Slack itself cannot
be reached from here, so the pictures are of the blocks, not of a Slack client.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from signoff.channels import ArgumentChange, Card, GrantChoice, Person
from signoff.channels.slack._blocks import render_card

PEOPLE = {"U0ALICE": "Alice Liu", "U0BOB": "Bob Chen", "U0DANA": "Dana Park"}
NOW = datetime(2026, 12, 1, 10, 32, tzinfo=UTC)
ALICE, BOB = Person("Alice Liu", "U0ALICE"), Person("Bob Chen", "U0BOB")
SESSION = GrantChoice("session", 3600, ("to",))
AGENT = GrantChoice("agent", 86400)


def sample_cards() -> dict[str, Card]:
    pending = Card(
        request_id="r_7Hq2kP",
        agent_id="finance-bot",
        tool_name="pay_invoice",
        arguments={"invoice_id": "INV-7", "amount": 90000, "to": "ACME GmbH", "memo": "Q4 hosting"},
        status="pending",
        created_at=NOW,
        expires_at=NOW + timedelta(minutes=30),
        quorum=1,
        approvers=(ALICE, BOB),
        requester=Person("Dana Park", "U0DANA"),
        grants=(SESSION, AGENT),
        editable=("amount", "memo"),
    )
    decided = {
        "status": "approved",
        "approvals": (ALICE,),
        "decided_by": ALICE,
        "decided_at": NOW + timedelta(minutes=2),
        "grants": (),
    }
    granted = {"granted": SESSION, "granted_until": NOW + timedelta(minutes=62)}
    edited = {"changes": (ArgumentChange("amount", 90000, 40000),), "editable": ()}
    return {
        "slack-card-pending": pending,
        "slack-card-granted": _replace(pending, **decided, **granted),
        "slack-card-edited": _replace(pending, **decided, **edited),
    }


def _replace(card: Card, **changes: Any) -> Card:
    fields = {name: getattr(card, name) for name in card.__slots__}  # type: ignore[attr-defined]
    return Card(**(fields | changes))


# -- Block Kit → HTML


def mrkdwn(text: str) -> str:
    """Slack's mrkdwn as HTML: code blocks, inline code, bold, italics, mentions, dates, links."""
    out = []
    for i, part in enumerate(re.split(r"```\n?(.*?)\n?```", text, flags=re.S)):
        out.append(f"<pre>{html.escape(part)}</pre>" if i % 2 else _inline(part))
    return "".join(out)


def _inline(text: str) -> str:
    text = html.escape(text, quote=False)
    text = re.sub(r"&lt;@(\w+)&gt;", _mention, text)
    text = re.sub(r"&lt;!date\^\d+\^[^|]*\|([^&]*)&gt;", r"\1", text)
    text = re.sub(r"&lt;([^|&]+)\|([^&]+)&gt;", r'<a href="\1">\2</a>', text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*([^*\n]+)\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w/])_([^_\n]+)_(?!\w)", r"<i>\1</i>", text)
    return text.replace("\n", "<br>")


def _mention(m: re.Match[str]) -> str:
    return f'<span class="mention">@{PEOPLE.get(m[1], m[1])}</span>'


def _text(obj: dict[str, Any]) -> str:
    return mrkdwn(obj["text"]) if obj.get("type") == "mrkdwn" else html.escape(obj["text"])


def block_html(block: dict[str, Any]) -> str:
    kind = block["type"]
    if kind == "header":
        return f'<div class="header">{_text(block["text"])}</div>'
    if kind == "section":
        parts = []
        if "text" in block:
            parts.append(f'<div class="text">{_text(block["text"])}</div>')
        if "fields" in block:
            cells = "".join(f'<div class="field">{_text(f)}</div>' for f in block["fields"])
            parts.append(f'<div class="fields">{cells}</div>')
        return f'<div class="section">{"".join(parts)}</div>'
    if kind == "context":
        return '<div class="context">' + " ".join(_text(e) for e in block["elements"]) + "</div>"
    if kind == "divider":
        return "<hr>"
    if kind == "actions":
        buttons = []
        for element in block["elements"]:
            style = element.get("style", "")
            buttons.append(f'<span class="button {style}">{_text(element["text"])}</span>')
        return f'<div class="actions">{"".join(buttons)}</div>'
    raise ValueError(f"no drawing for a {kind} block")


def dialog_html(confirm: dict[str, Any]) -> str:
    style = "danger" if confirm.get("style") == "danger" else "primary"
    return (
        '<div class="dialog">'
        f'<div class="title">{_text(confirm["title"])}</div>'
        f'<div class="text">{_text(confirm["text"])}</div>'
        f'<div class="buttons"><span class="button">{_text(confirm["deny"])}</span>'
        f'<span class="button {style}">{_text(confirm["confirm"])}</span></div></div>'
    )


CSS = """
body { margin: 0; padding: 20px; background: #fff; font: 15px/1.46 "DejaVu Sans", Lato, sans-serif;
       color: #1d1c1d; width: 640px; }
.message { display: flex; gap: 8px; }
.avatar { width: 36px; height: 36px; border-radius: 6px; background: #4a154b; color: #fff;
          font-weight: bold; display: flex; align-items: center; justify-content: center; }
.name { font-weight: 900; } .app { font-size: 10px; background: #e8e8e8; padding: 1px 3px;
        border-radius: 2px; color: #616061; margin-left: 4px; } .time { color: #616061; font-size: 12px; }
.header { font-size: 18px; font-weight: 900; margin: 6px 0; }
.section { margin: 6px 0; } .fields { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 16px; }
code { font: 12px "DejaVu Sans Mono", monospace; color: #e01e5a; background: #f8f8f8;
       border: 1px solid #e8e8e8; border-radius: 3px; padding: 0 3px; }
pre { font: 12px/1.5 "DejaVu Sans Mono", monospace; background: #f8f8f8; border: 1px solid #e8e8e8;
      border-radius: 4px; padding: 8px; margin: 4px 0; white-space: pre-wrap; }
.mention { color: #1264a3; background: #e8f5fa; border-radius: 3px; padding: 0 2px; }
.context { color: #616061; font-size: 12px; margin: 6px 0; }
.actions { display: flex; flex-wrap: wrap; gap: 8px; margin: 8px 0; }
.button { border: 1px solid #bbb; border-radius: 4px; padding: 3px 12px; font-size: 13px;
          font-weight: bold; background: #fff; }
.button.primary { background: #007a5a; border-color: #007a5a; color: #fff; }
.button.danger { color: #e01e5a; border-color: #e01e5a; }
.dialog { margin: 18px 0 0 44px; width: 420px; border-radius: 8px; padding: 16px 20px;
          box-shadow: 0 0 0 1px #ddd, 0 4px 12px rgba(0,0,0,.12); }
.dialog .title { font-size: 18px; font-weight: 900; margin-bottom: 10px; }
.dialog .buttons { display: flex; justify-content: flex-end; gap: 8px; margin-top: 16px; }
.dialog .button.danger { background: #e01e5a; color: #fff; }
"""


def page(card: Card, *, dialog_for: str | None = None) -> str:
    _, blocks = render_card(card)
    body = "".join(block_html(b) for b in blocks)
    dialog = ""
    if dialog_for is not None:
        for block in blocks:
            for element in block.get("elements", []):
                if element.get("action_id") == dialog_for and "confirm" in element:
                    dialog = dialog_html(element["confirm"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{CSS}</style></head><body>"
        '<div class="message"><div class="avatar">S</div><div><span class="name">Signoff</span>'
        '<span class="app">APP</span> <span class="time">10:32</span>'
        f"{body}</div></div>{dialog}</body></html>"
    )


async def photograph(pages: dict[str, str], out: Path) -> None:
    from playwright.async_api import async_playwright

    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        sys.exit("error: /usr/bin/chromium is missing; install it with `make chromium`")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(chromium))
        shot = await browser.new_page(viewport={"width": 680, "height": 200}, device_scale_factor=2)
        for name, content in pages.items():
            await shot.set_content(content)
            target = out / f"{name}.png"
            await shot.screenshot(path=str(target), full_page=True)
            sys.stdout.write(f"wrote {target}\n")
        await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    cards = sample_cards()
    pages = {name: page(card) for name, card in cards.items()}
    pages["slack-card-grant-confirm"] = page(cards["slack-card-pending"], dialog_for="signoff_grant.0")
    asyncio.run(photograph(pages, args.out))


if __name__ == "__main__":
    main()
