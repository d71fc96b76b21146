"""The console in a real browser: Debian's Chromium driven by Playwright, against a real server.

Set ``SIGNOFF_CONSOLE_SCREENSHOTS=docs`` to write the README's screenshots there, and
``SIGNOFF_CONSOLE_PAGES=DIR`` to keep a screenshot of every page at phone and desktop widths.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Page, async_playwright, expect

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server, free_port
from tests.console.conftest import PASSWORDS, SESSION_SECRET, Agent, operators

pytestmark = pytest.mark.browser

CHROMIUM = Path(os.environ.get("SIGNOFF_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]
SCREENSHOTS = os.environ.get("SIGNOFF_CONSOLE_SCREENSHOTS")
PAGES = os.environ.get("SIGNOFF_CONSOLE_PAGES")
WIDTHS = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1366, "height": 900}}


def need_chromium() -> None:
    """Skip without Debian's chromium on a developer's machine; in CI (``CI`` set) fail instead."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    need_chromium()
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:
    """The default test config plus a gate that offers grants and edits, one in the console
    alone, a read-only guard and a webhook nobody listens on (tried once)."""
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"] += [
        {
            "type": "confirmation_gate",
            "name": "transfers",
            "tools": ["transfer_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "grants": [{"scope": "session", "for": "1h", "same": ["to"]}, {"scope": "agent", "for": "30m"}],
            "editable": ["amount", "memo"],
        },
        {
            "type": "confirmation_gate",
            "name": "publishing",
            "tools": ["publish_*"],
            "channel": "web",
            "approvers": ["alice"],
        },
        {"type": "readonly_guard", "tools": ["transfer_*", "wire_*"]},
    ]
    body["operators"] = operators(password_hashes)
    body["webhooks"] = {
        "audit-sink": {
            "url": f"https://127.0.0.1:{free_port()}/in",
            "secret": "whsec_" + base64.b64encode(bytes(range(32))).decode(),
            "events": ["request.created"],
            "max_attempts": 1,
        }
    }
    return parse_config(body, source="console-browser.yaml")


@pytest.fixture
async def console_server(runtime: Runtime) -> AsyncIterator[Server]:
    """With the outbox running, so the request page shows cards actually sent."""
    async with Server(runtime, background=True) as s:
        yield s


class Problems:
    """JavaScript errors and console errors (a CSP violation is one) seen by a page."""

    def __init__(self, page: Page) -> None:
        self.seen: list[str] = []
        page.on("pageerror", lambda exc: self.seen.append(f"page error: {exc}"))
        page.on("console", self._console)

    def _console(self, msg: ConsoleMessage) -> None:
        # A 401/403 the test provokes on purpose is logged as a failed resource load.
        if msg.type == "error" and "status of 40" not in msg.text:
            self.seen.append(msg.text)


async def sign_in(page: Page, base: str, operator: str, password: str | None = None) -> None:
    await page.goto(f"{base}/ui/")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    await page.get_by_label("Operator name").fill(operator)
    await page.get_by_label("Password").fill(PASSWORDS[operator] if password is None else password)
    await page.get_by_role("button", name="Sign in").click()


def keep(shot: Path) -> None:
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(SCREENSHOTS) / shot.name)


async def test_sign_in_watch_a_request_arrive_approve_it_and_find_it_in_history(
    browser: Browser, console_server: Server, agent: Agent, tmp_path: Path
) -> None:
    base = console_server.url
    context = await browser.new_context(viewport={"width": 1280, "height": 860})
    page = await context.new_page()
    problems = Problems(page)

    await sign_in(page, base, "alice")
    await expect(page).to_have_url(f"{base}/ui/")
    await expect(page.get_by_text("Nothing is waiting for a decision.")).to_be_visible()
    await expect(page.locator(".signout .who")).to_have_text("Alice")

    # Requests made through the agent API appear without a reload.
    await page.evaluate("window.__sameDocument = true")
    rid = await agent.ask(
        arguments={"amount": 125000, "vendor": "ACME Ltd", "invoice": "INV-2291", "api_token": "s3cret"},
        user_id="carol",
        session_id="sess-42",
        tool_call_id="call-7",
    )
    row = page.locator(f'tr[data-request-id="{rid}"]')
    await expect(row).to_be_visible(timeout=10_000)
    assert await page.evaluate("window.__sameDocument") is True, "the page was reloaded"
    await expect(row).to_contain_text("pay_invoice")
    await expect(row).to_contain_text("finance-bot")
    await expect(row).to_contain_text(
        'amount=125000, vendor="ACME Ltd", invoice="INV-2291", api_token=[redacted]'
    )
    await expect(row).to_contain_text("Carol (carol)")
    await expect(row).to_contain_text("0 / 1")
    left = row.locator(".left")
    await expect(left).to_have_text(re.compile(r"^29m \d\ds$"))
    before = await left.text_content()
    await expect(left).not_to_have_text(before or "", timeout=3_000)  # it counts down

    await agent.ask("wire_money", arguments={"amount": 480000, "iban": "DE89 3704 0044 0532 0130 00"})
    await agent.ask("pay_vendor", arguments={"amount": 64000, "vendor": "Globex", "password": "hunter2"})
    await expect(page.locator("tr[data-request-id]")).to_have_count(3, timeout=10_000)
    await expect(page.locator(".count")).to_have_text("3 pending")
    assert await page.evaluate("window.__sameDocument") is True
    await page.screenshot(path=tmp_path / "console-queue.png")
    keep(tmp_path / "console-queue.png")

    await row.get_by_role("link", name="pay_invoice").click()
    await expect(page).to_have_url(f"{base}/ui/requests/{rid}")
    await expect(page.get_by_role("heading", level=1)).to_contain_text("pay_invoice")
    await expect(page.locator("pre.json").first).to_contain_text('"api_token": "[redacted]"')
    await expect(page.locator("#cards-title + table")).to_contain_text("sent", timeout=10_000)
    await page.get_by_label("Reason").fill("Invoice matches PO-7731")
    await page.screenshot(path=tmp_path / "console-request.png", full_page=True)
    keep(tmp_path / "console-request.png")

    await page.get_by_role("button", name="Approve").click()
    await expect(page.get_by_role("status")).to_have_text("Approved once by Alice.")
    await expect(page.locator("h1 .badge")).to_have_text("approved")
    votes = page.locator("#votes-title + table")
    await expect(votes).to_contain_text("Alice")
    await expect(votes).to_contain_text("Invoice matches PO-7731")
    await expect(votes).to_contain_text("via console")
    assert await agent.status(rid) == "approved"

    await page.get_by_role("link", name="History").click()
    await page.get_by_label("Status").select_option("approved")
    await page.get_by_label("Tool contains").fill("invoice")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(re.compile(r"/ui/history\?status=approved&.*tool=invoice"))
    found = page.locator("tr[data-request-id]")
    await expect(found).to_have_count(1)
    await expect(found).to_have_attribute("data-request-id", rid)
    await expect(found).to_contain_text("Alice via web")
    await expect(found).to_contain_text("Invoice matches PO-7731")

    # The queue has two left, and it works on a phone-sized screen.
    phone = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    small = await phone.new_page()
    problems_small = Problems(small)
    await sign_in(small, base, "bob")
    await expect(small.locator("tr[data-request-id]")).to_have_count(2)
    assert await small.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (
        "no sideways scroll"
    )
    await small.screenshot(path=tmp_path / "console-phone.png")
    keep(tmp_path / "console-phone.png")

    assert problems.seen == []
    assert problems_small.seen == []
    await phone.close()
    await context.close()


async def test_a_wrong_password_is_refused(browser: Browser, console_server: Server) -> None:
    page = await browser.new_page()
    await sign_in(page, console_server.url, "alice", "not-her-password")
    await expect(page.get_by_role("alert")).to_have_text("Wrong operator name or password.")
    await expect(page).to_have_url(re.compile(r"/ui/login$"))
    await expect(page.get_by_label("Operator name")).to_have_value("alice")
    await page.goto(f"{console_server.url}/ui/config")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fconfig"))


async def test_a_form_without_its_csrf_token_is_refused(
    browser: Browser, console_server: Server, agent: Agent
) -> None:
    rid = await agent.ask()
    page = await browser.new_page()
    await sign_in(page, console_server.url, "alice")
    await expect(page.locator(f'tr[data-request-id="{rid}"]')).to_be_visible()
    await page.goto(f"{console_server.url}/ui/requests/{rid}")
    await page.locator("form[action$='/decision'] input[name=csrf_token]").evaluate("el => el.remove()")
    await page.get_by_label("Reason").fill("sneaky")
    async with page.expect_response(re.compile(r"/decision$")) as response:
        await page.get_by_role("button", name="Approve").click()
    assert (await response.value).status == 403
    await expect(page.get_by_role("heading", level=1)).to_have_text("Form refused")
    assert await agent.status(rid) == "pending"


@pytest.fixture
async def short_server(runtime: Runtime) -> AsyncIterator[Server]:
    settings = Settings(
        database_url=runtime.settings.database_url,
        admin_token=ADMIN_TOKEN,
        session_secret=SESSION_SECRET,
        session_max_age_seconds=3,
    )
    rt = Runtime.create(settings, runtime.config, channels={"chat": FakeChannel("chat")})
    try:
        async with Server(rt) as s:
            yield s
    finally:
        await rt.aclose()


async def test_an_expired_session_goes_back_to_sign_in(browser: Browser, short_server: Server) -> None:
    page = await browser.new_page()
    await sign_in(page, short_server.url, "alice")
    await expect(page).to_have_url(f"{short_server.url}/ui/")
    # The queue's own poll finds the session over and takes the page to the sign-in form.
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=.*ended=1"), timeout=10_000)
    await expect(page.get_by_text("Your session has ended.")).to_be_visible()
    await page.goto(f"{short_server.url}/ui/audit")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Faudit"))


async def width_contexts(browser: Browser) -> dict[str, BrowserContext]:
    return {
        "phone": await browser.new_context(viewport=WIDTHS["phone"], is_mobile=True, has_touch=True),
        "desktop": await browser.new_context(viewport=WIDTHS["desktop"]),
    }


async def shoot(page: Page, name: str, tmp_path: Path) -> str | None:
    """A full-page screenshot of ``page``; what is wrong with its layout, if anything."""
    await page.wait_for_load_state("networkidle")
    shot = tmp_path / f"{name}.png"
    await page.screenshot(path=shot, full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if PAGES:
        Path(PAGES).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(PAGES) / shot.name)
    wide, room = await page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    if wide > room:
        return f"{name} scrolls sideways ({wide}px in {room}px)"
    spilled = await page.evaluate(SPILLED_CELLS)
    return f"{name}: cell parts under their label: {spilled}" if spilled else None


# On a phone each table row is a card of "label  value" lines. A cell of several parts (a
# name and its id, a list with commas, a pill) must flow beside its label, never into the
# label's column below it: the text of every part starts right of the label.
SPILLED_CELLS = """() => {
  const out = [];
  for (const td of document.querySelectorAll('.rows td[data-label]')) {
    const content = getComputedStyle(td, '::before').content;
    if (content === 'none' || content === 'normal') continue;  // a plain table row
    const range = document.createRange();
    range.selectNodeContents(td);
    const boxes = [...range.getClientRects()].filter((b) => b.width > 0);
    if (boxes.some((b) => b.left < boxes[0].left - 1)) {
      out.push(`${td.dataset.label}: ${td.innerText.slice(0, 40)}`);
    }
  }
  return out.slice(0, 5);
}"""


async def radios_sit_left_of_their_labels(page: Page) -> None:
    choices = page.locator("fieldset.grants label.choice")
    await expect(choices).to_have_count(3)
    for i in range(3):
        radio = await choices.nth(i).locator("input[type=radio]").bounding_box()
        text = await choices.nth(i).locator("span").bounding_box()
        assert radio is not None
        assert text is not None
        assert radio["x"] + radio["width"] <= text["x"], (i, radio, text)
        first_line = text["y"] + 24
        assert text["y"] <= radio["y"] + radio["height"] / 2 <= first_line, (i, radio, text)


async def filter_labels_share_a_line(page: Page) -> None:
    """The history's first row of filters: every label on one line, at one height (a field's
    hint sits in its label, not under its input, which would lift that label above the rest)."""
    tops = []
    for label in ("Status", "Agent", "Tool contains", "Decided by"):
        box = await page.locator(f"form.filters label:has-text('{label}')").first.bounding_box()
        assert box is not None, label
        tops.append((label, round(box["y"]), round(box["height"])))
    assert len({(y, h) for _, y, h in tops}) == 1, tops


async def test_every_page_at_phone_and_desktop_widths(
    browser: Browser, console_server: Server, agent: Agent, tmp_path: Path
) -> None:
    base = console_server.url
    pay = await agent.ask(
        arguments={"amount": 125000, "vendor": "ACME Ltd", "invoice": "INV-2291"}, user_id="carol"
    )
    transfer = await agent.ask(
        "transfer_funds",
        arguments={"to": "DE89 3704 0044 0532 0130 00", "amount": 480000, "memo": "Q4 supplier run"},
        session_id="sess-42",
    )
    changed = await agent.ask(
        "transfer_funds",
        arguments={"to": "FR14 2004 1010 0505 0001 3M02 606", "amount": 52000, "memo": "rent"},
    )
    publish = await agent.ask("publish_post", arguments={"title": "Release notes 2.4", "draft": False})
    wire = await agent.ask("wire_money", arguments={"amount": 990000, "iban": "GB33BUKB20201555555555"})
    contexts = await width_contexts(browser)
    pages = {width: await ctx.new_page() for width, ctx in contexts.items()}
    problems = [Problems(p) for p in pages.values()]
    wrong: list[str | None] = []

    for width, page in pages.items():
        await page.goto(f"{base}/ui/login")
        wrong.append(await shoot(page, f"{width}-login", tmp_path))
        await sign_in(page, base, "alice")
        await expect(page.locator("tr[data-request-id]")).to_have_count(5)
        row = page.locator(f'tr[data-request-id="{publish}"]')
        await expect(row.locator('td[data-label="Channel"]')).to_have_text("web")
        await expect(page.locator(f'tr[data-request-id="{pay}"] td[data-label="Channel"]')).to_have_text(
            "chat"
        )
        wrong.append(await shoot(page, f"{width}-queue", tmp_path))

        await page.goto(f"{base}/ui/requests/{pay}")
        await expect(page.locator("#reason-help")).to_have_text(
            "Recorded with your vote as Alice, shown to the agent and on the chat card."
        )
        wrong.append(await shoot(page, f"{width}-request-pending", tmp_path))
        await page.goto(f"{base}/ui/requests/{publish}")
        await expect(page.locator("#reason-help")).to_have_text(
            "Recorded with your vote as Alice, shown to the agent."
        )
        await page.goto(f"{base}/ui/requests/{transfer}")
        await radios_sit_left_of_their_labels(page)
        wrong.append(await shoot(page, f"{width}-request-grants-and-edits", tmp_path))

    # Decided: one transfer approved for the session, another with a changed amount, the wire rejected.
    desk = pages["desktop"]
    await desk.get_by_text("this session (1h)").click()
    await expect(desk.get_by_role("radio", name=re.compile("this session"))).to_be_checked()
    await desk.get_by_role("button", name="Approve").click()
    await expect(desk.locator("h1 .badge")).to_have_text("approved")
    await expect(desk.locator(".decide")).to_contain_text(
        re.compile(
            r"With a grant for this session until [\d-]+ [\d:]+ UTC,"
            r' while the argument "to" stays the same:\s+used 0 times'
        )
    )
    await desk.goto(f"{base}/ui/requests/{changed}")
    await desk.get_by_label("amount").fill("40000")
    await desk.get_by_role("button", name="Approve").click()
    await expect(desk.locator("h1 .badge")).to_have_text("approved")
    await expect(desk.locator(".decide p").first).to_have_text(
        re.compile(r"^approved by Alice via web\s+at [\d-]+ [\d:]+ UTC, with these changes:\s*$")
    )
    await desk.goto(f"{base}/ui/requests/{wire}")
    await desk.get_by_label("Reason").fill("Not on the payment plan for this quarter")
    await desk.get_by_role("button", name="Reject").click()
    await expect(desk.locator("h1 .badge")).to_have_text("rejected")
    # The phone still shows the transfer's page, which reloads itself once its poll sees the
    # approval: let it first (a navigation racing that reload is interrupted by it).
    await expect(pages["phone"].locator("h1 .badge")).to_have_text("approved", timeout=15_000)

    for width, page in pages.items():
        for name, path in [
            ("request-approved-with-a-grant", f"/ui/requests/{transfer}"),
            ("request-approved-with-changes", f"/ui/requests/{changed}"),
            ("request-rejected", f"/ui/requests/{wire}"),
            ("history", "/ui/history"),
            ("grants", "/ui/grants"),
            ("webhooks", "/ui/webhooks"),
            ("audit", "/ui/audit"),
            ("audit-verify", "/ui/audit/verify"),
            ("config", "/ui/config"),
            ("no-such-request", "/ui/requests/no-such-request"),
        ]:
            await page.goto(base + path)
            wrong.append(await shoot(page, f"{width}-{name}", tmp_path))
            if name == "history" and width == "desktop":
                await filter_labels_share_a_line(page)

    assert [p.seen for p in problems] == [[], []]
    assert [w for w in wrong if w] == []
    for ctx in contexts.values():
        await ctx.close()
