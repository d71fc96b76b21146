"""Draw the Teams cards in docs/teams.md from the exact Adaptive Cards the Teams channel posts.

    npm install --prefix /tmp/ac adaptivecards@3
    .venv/bin/python scripts/teams_card_pictures.py \
        --renderer /tmp/ac/node_modules/adaptivecards/dist/adaptivecards.js

Builds sample cards, renders them with ``signoff.channels.teams`` (the code that posts them),
lays the JSON out with Microsoft's own Adaptive Cards renderer (the ``adaptivecards`` npm
package, the one Teams' web client builds on, with its default host config rather than
Teams' theme) and photographs it with headless Chromium. Teams itself cannot be reached from
here, so the pictures are of the cards, not of a Teams client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from signoff.channels import Card, GrantChoice, Person
from signoff.channels.teams import render_card

NOW = datetime(2026, 12, 1, 10, 32, tzinfo=UTC)
ALICE, BOB = Person("Alice Liu", "0a11ce00-0000-4000-8000-000000000001"), Person("Bob Chen")

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<style>body{margin:0;padding:16px;background:#f5f5f5;font-family:"Segoe UI",system-ui,sans-serif}
#card{width:560px;background:#fff;border-radius:6px;box-shadow:0 1px 3px rgba(0,0,0,.2);padding:4px}</style>
<style>%s</style><script>%s</script></head><body><div id="card"></div><script>
const card = new AdaptiveCards.AdaptiveCard();
card.hostConfig = new AdaptiveCards.HostConfig({fontFamily: '"Segoe UI", system-ui, sans-serif'});
card.parse(%s);
document.getElementById("card").appendChild(card.render());
</script></body></html>"""


def samples() -> dict[str, tuple[Card, str | None]]:
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
        requester=Person("Dana Park"),
        grants=(GrantChoice("session", 3600, ("to",)),),
        editable=("amount", "memo"),
        console_url="https://signoff.example.com/ui/requests/r_7Hq2kP",
    )
    approved = replace(
        pending,
        status="approved",
        approvals=(ALICE,),
        decided_by=ALICE,
        decided_at=NOW + timedelta(minutes=2),
        grants=(),
    )
    return {
        "teams-card-pending": (pending, None),
        "teams-card-reject": (pending, "Reject…"),
        "teams-card-approved": (approved, None),
    }


async def photograph(renderer: Path, out: Path, chromium: str) -> None:
    from playwright.async_api import async_playwright

    script = renderer.read_text(encoding="utf-8").replace("</script", "<\\/script")
    css = renderer.with_name("adaptivecards.css")
    style = css.read_text(encoding="utf-8") if css.exists() else ""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium)
        for name, (card, press) in samples().items():
            page = await browser.new_page(device_scale_factor=2)
            await page.set_content(PAGE % (style, script, json.dumps(render_card(card))))
            if press:
                await page.locator(f'button[aria-label="{press}"]').evaluate("b => b.click()")
            target = out / f"{name}.png"
            await page.locator("#card").screenshot(path=str(target))
            print(target)  # noqa: T201
            await page.close()
        await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renderer", type=Path, required=True, help="adaptivecards.js from the npm package")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    asyncio.run(photograph(args.renderer, args.out, args.chromium))


if __name__ == "__main__":
    main()
