"""What an approver reads on a page before deciding: the request's page in the console and the
confirmation page an email link opens show the call's arguments as the cards do.

Every card writes a character that does not show as itself (a bidi override, a zero-width
space, a line separator) as a ``\\u`` escape, so an agent cannot make a value read otherwise
than it runs. The pages where an approver confirms or decides must not show the same
arguments raw: a right-to-left override there turns ``rm -rf ~ #`` into what reads like a
comment, and the Approve button under it still approves the call as it runs.
"""

from __future__ import annotations

import copy
import html
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.channels.smtp_server import LocalSmtp
from tests.channels.test_email_flow import PUBLIC, links, mail_to
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server
from tests.console.conftest import CHEAP, PASSWORDS, Console, operators
from tests.redteam.support import ask

ALICE = "alice@example.com"
# Reads as ``echo done # ~ rm -rf`` where bidi controls are drawn; runs ``rm -rf ~``.
COMMAND = "echo done; \u2067rm -rf ~ #\u2069 \u200b\u2028"
HIDDEN = "\u2067\u2069\u200b\u2028"
ESCAPED = ("\\u2067", "\\u2069", "\\u200b", "\\u2028")
_PRE = re.compile(r'<pre class="json"[^>]*aria-label="Arguments as JSON">(.*?)</pre>', re.S)


def _arguments_shown(page: str) -> str:
    m = _PRE.search(page)
    assert m is not None, "no arguments on the page"
    return html.unescape(m.group(1))


def _shows_escaped(shown: str) -> None:
    assert not any(c in shown for c in HIDDEN), ascii(shown)
    assert all(e in shown for e in ESCAPED), shown
    assert "rm -rf ~ #" in shown


@pytest.fixture
def smtp() -> Iterator[LocalSmtp]:
    with LocalSmtp() as server:
        yield server


def _mail_config(smtp_port: int) -> dict[str, Any]:
    return {
        "channels": {
            "mail": {
                "type": "email",
                "smtp_url": f"smtp://127.0.0.1:{smtp_port}?starttls=false",
                "from": "Signoff <signoff@example.com>",
            }
        },
        "people": {"alice": {"name": "Alice", "email": ALICE}},
        "agents": {
            "finance-bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "name": "shell",
                        "tools": ["Bash"],
                        "channel": "mail",
                        "approvers": ["alice"],
                        "timeout": "30m",
                    }
                ]
            }
        },
    }


@pytest.fixture
async def mail(smtp: LocalSmtp, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret="a-long-random-secret-for-the-email-links",  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
    )
    runtime = Runtime.create(settings, parse_config(_mail_config(smtp.port), source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def test_the_confirmation_page_of_an_email_link_shows_hidden_characters_escaped(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    _server, http = mail
    answer = await ask(http, agent_key, {"tool_name": "Bash", "arguments": {"command": COMMAND}})
    assert answer["decision"] == "pending", answer
    message = await mail_to(smtp, ALICE, answer["request_id"])
    for part in (message.part("plain"), message.part("html")):
        assert not any(c in part for c in HIDDEN)  # the email itself writes them as escapes
    page = await http.get(links(message)["Approve"])
    assert page.status_code == 200, page.text
    _shows_escaped(_arguments_shown(page.text))


@pytest.fixture
def config() -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    hashes = {name: CHEAP.hash(password) for name, password in PASSWORDS.items()}
    body["operators"] = operators(hashes)
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "shell",
            "tools": ["Bash"],
            "channel": "chat",
            "approvers": ["alice"],
        }
    )
    return parse_config(body, source="console-test.yaml")


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        session_secret="console-test-session-secret-0123456789",  # type: ignore[arg-type]
    )


async def test_the_console_request_page_and_queue_show_hidden_characters_escaped(
    server: Server, http: httpx.AsyncClient, agent_key: str
) -> None:
    answer = await ask(http, agent_key, {"tool_name": "Bash", "arguments": {"command": COMMAND}})
    assert answer["decision"] == "pending", answer
    console = Console(server.url)
    try:
        assert (await console.sign_in("alice")).status_code == 303
        page = await console.get(f"/ui/requests/{answer['request_id']}")
        assert page.status_code == 200, page.text
        _shows_escaped(_arguments_shown(page.text))
        queue = await console.get("/ui/")
        assert queue.status_code == 200
        assert not any(c in html.unescape(queue.text) for c in HIDDEN), "the queue shows them raw"
    finally:
        await console.aclose()


async def test_the_console_shows_a_tool_name_requester_and_argument_names_escaped(
    server: Server, http: httpx.AsyncClient, agent_key: str
) -> None:
    """Beside the values: the tool's name, the requester's id and the arguments' names are the
    agent's text too, in the queue and on the request's page."""
    call = {
        "tool_name": "pay_\u2067x\u2069",
        "arguments": {"amount": 90000, "memo\u200b": "ls"},
        "user_id": "ops\u2028Approved by Alice",
    }
    answer = await ask(http, agent_key, call)
    assert answer["decision"] == "pending", answer
    console = Console(server.url)
    try:
        assert (await console.sign_in("alice")).status_code == 303
        for path in ("/ui/", f"/ui/requests/{answer['request_id']}"):
            page = await console.get(path)
            assert page.status_code == 200, page.text
            shown = html.unescape(page.text)
            assert not any(c in shown for c in HIDDEN), (path, "shows the agent's hidden characters raw")
            assert "\\u2067" in shown, path
    finally:
        await console.aclose()


async def test_a_history_time_out_of_range_in_utc_is_refused_not_a_server_error(
    server: Server, http: httpx.AsyncClient, agent_key: str
) -> None:
    console = Console(server.url)
    try:
        assert (await console.sign_in("alice")).status_code == 303
        for query in (
            {"from": "0001-01-01T00:00+01:00"},
            {"to": "9999-12-31"},
            {"before": "0001-01-01T00:30+01:00"},
        ):
            page = await console.get("/ui/history", params=query)
            assert page.status_code < 500, (query, page.status_code)
    finally:
        await console.aclose()
