"""Draw docs/email.png: the approval email as a mail client shows its HTML part.

The message is rendered by the email channel itself (the same code that sends it), for a
sample request, and photographed by headless Chromium (Debian's, at /usr/bin/chromium:
`make chromium` installs it) through Playwright.

    .venv/bin/python scripts/email_picture.py [OUT.png]
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.async_api import async_playwright

from signoff.channels import Card, GrantChoice, Person
from signoff.channels.email import EmailChannel, EmailConfig, LinkSigner, render_html

CHROMIUM = Path("/usr/bin/chromium")
OUT = Path(__file__).resolve().parent.parent / "docs" / "email.png"


def sample() -> str:
    """The HTML part of the message Alice gets for a sample payment."""
    created = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
    card = Card(
        request_id="3f9c2a7be1d54c0a9b8e6d2f4a1c7e05",
        agent_id="finance-bot",
        tool_name="pay_invoice",
        arguments={"invoice": "INV-2291", "vendor": "ACME Ltd", "amount": 72000, "api_token": "[redacted]"},
        status="pending",
        created_at=created,
        expires_at=created + timedelta(minutes=30),
        quorum=1,
        approvers=(Person("Alice Liu", "alice@example.com"), Person("Bob Chen", "bob@example.com")),
        requester=Person("Dana Park", "dana@example.com"),
        grants=(GrantChoice("session", 3600, ("vendor",)), GrantChoice("agent", 1800)),
    )
    config = EmailConfig.model_validate(
        {"type": "email", "smtp_url": "smtp://localhost:25?starttls=false", "from": "signoff@example.com"}
    )
    channel = EmailChannel("mail", config, LinkSigner(b"picture-only-key" * 2, "https://signoff.example.com"))
    recipient = card.approvers[0]
    assert recipient.user_id is not None
    return render_html(card, recipient, channel.choices(card, recipient.user_id))


async def photograph(html: str, out: Path) -> None:
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 680, "height": 600}, device_scale_factor=1)
            await page.set_content(html, wait_until="load")
            await page.screenshot(path=str(out), full_page=True)
        finally:
            await browser.close()


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    asyncio.run(photograph(sample(), out))
    sys.stdout.write(f"wrote {out}\n")


if __name__ == "__main__":
    main()
