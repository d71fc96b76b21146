"""Where the console goes after signing in (``next``) stays on this site, as a browser reads
the Location header: browsers drop tabs and line breaks anywhere in a URL, read
a backslash as a slash, and take ``//host`` as another site. Any text at all, through
:func:`safe_next`, resolves against the console's origin to a page of that origin."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from signoff.app.console.auth import safe_next
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Console,
    config,
    console,
    console_server,
    password_hashes,
    settings,
)
from tests.console.test_console_http import redirect_target

ORIGIN = "https://signoff.example.com"
PIECES = st.sampled_from(
    [
        "/",
        "//",
        "\\",
        "/\\",
        "\t",
        "\n",
        "\r",
        " ",
        "ui",
        "/ui",
        "..",
        ".",
        "%2F",
        "%5C",
        "@",
        "evil.example",
        ":",
        "javascript:",
        "https:",
        "?",
        "#",
        "%0a",
        "\x00",
        "\u3002",
        "\uff0f",
    ]
)


def as_a_browser_reads(location: str) -> tuple[str, str]:
    """(origin, path) of ``location`` resolved against the console as a browser resolves it."""
    cleaned = location.replace("\t", "").replace("\n", "").replace("\r", "").replace("\\", "/")
    parts = urlsplit(urljoin(ORIGIN + "/ui/login", cleaned.strip("\x00 ")))
    return f"{parts.scheme}://{parts.netloc}", parts.path


@given(st.lists(PIECES, max_size=8).map("".join) | st.text(max_size=40))
@example("/ui/\t/evil.example")
@example("/ui\\@evil.example")
@example("/ui/..//evil.example")
def test_next_resolves_to_a_console_page(value: str) -> None:
    origin, _ = as_a_browser_reads(safe_next(value))
    assert origin == ORIGIN, (value, safe_next(value))


@pytest.mark.parametrize(
    "evil", ["/ui/%2F%2Fevil.example", "%2F%2Fevil.example", "/\\evil.example", "/ui\t//evil.example"]
)
async def test_next_through_the_server_stays_home(console: Console, evil: str) -> None:  # noqa: F811
    r = await console.sign_in("alice", next_url=evil)
    assert as_a_browser_reads(redirect_target(r)[0])[0] == ORIGIN, evil
