"""The plain client reads the common ``http://host[:port][/path]`` URLs itself (sparing the hook
the import of urllib.parse) exactly as ``urlsplit`` reads them, and leaves every other form to
``urlsplit``."""

from __future__ import annotations

from urllib.parse import urlsplit

from hypothesis import given
from hypothesis import strategies as st

from signoff.hooks._plain import _plain_http

PIECES = st.sampled_from(
    [
        "http://",
        "https://",
        "localhost",
        "127.0.0.1",
        "Signoff.Example",
        ":",
        "8000",
        "99999",
        "/",
        "/api",
        "//",
        "?q=1",
        "#f",
        "@",
        "[::1]",
        "u:p@",
        " ",
        "\t",
        "é",
        ";x",
        "",
    ]
)


@given(st.lists(PIECES, max_size=7).map("".join))
def test_a_url_read_here_is_read_as_urlsplit_reads_it(url: str) -> None:
    plain = _plain_http(url)
    if plain is None:
        return
    parts = urlsplit(url)
    assert parts.scheme == "http"
    assert plain == (parts.hostname, parts.port or 80, parts.netloc.rpartition("@")[2], parts.path)


def test_the_common_forms_are_read_here() -> None:
    assert _plain_http("http://127.0.0.1:8000") == ("127.0.0.1", 8000, "127.0.0.1:8000", "")
    assert _plain_http("http://Signoff.internal/base/") == (
        "signoff.internal",
        80,
        "Signoff.internal",
        "/base/",
    )
    for other in ("https://x", "http://u@x", "http://[::1]:8000", "http://x:99999", "http://x?y"):
        assert _plain_http(other) is None
