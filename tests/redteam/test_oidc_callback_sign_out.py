"""``GET /ui/oidc/callback`` is where the identity provider sends the browser back; anyone can
link to it. A provider that refuses a sign-in this browser started (``prompt=none`` answered
``login_required``: a disabled account) ends the session there. A callback this browser did not
start (no sign-in state cookie, another state) is someone else's link: a page elsewhere that
navigates the browser to it, with or without an ``error``, must not sign the operator out."""

from __future__ import annotations

import pytest

from signoff.app.config import SignoffConfig, parse_config
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Console,
    console,
    console_server,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import FakeProvider
from tests.console.test_oidc import DANA, _body, _sign_in, _who, provider  # noqa: F401


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_body(provider, password_hashes), source="console-oidc.yaml")


FORGED_CALLBACKS = [
    "/ui/oidc/callback",
    "/ui/oidc/callback?error=login_required",
    "/ui/oidc/callback?error=access_denied&state=guessed",
    "/ui/oidc/callback?code=x&state=guessed",
]


@pytest.mark.parametrize("url", FORGED_CALLBACKS)
async def test_a_callback_this_browser_did_not_start_signs_no_password_operator_out(
    console: Console,  # noqa: F811
    url: str,
) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    assert await _who(console) == "Alice"
    await console.client.get(url)  # a link on another site, followed by the browser
    assert await _who(console) == "Alice", f"{url} signed alice out"


@pytest.mark.parametrize("url", FORGED_CALLBACKS)
async def test_a_callback_this_browser_did_not_start_signs_no_oidc_session_out(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    url: str,
) -> None:
    await _sign_in(console, provider, DANA)
    assert await _who(console) == "Dana"
    copied = console.client.cookies.get("signoff_session")
    await console.client.get(url)
    console.client.cookies.set("signoff_session", str(copied), path="/ui")
    assert await _who(console) == "Dana", f"{url} ended Dana's session"


@pytest.mark.parametrize("start", ["/ui/login/oidc?recheck=1", "/ui/login/oidc"])
async def test_a_provider_refusing_a_sign_in_started_elsewhere_ends_no_password_session(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    start: str,
) -> None:
    """A page elsewhere can send the browser through a whole sign-in (start, provider, back);
    with nobody signed in at the provider, it answers an error to this browser's own state.
    That is the provider's word on a provider sign-in, and none on an operator's password."""
    assert (await console.sign_in("alice")).status_code == 303
    provider.account = None
    refused = await console.client.get(start, follow_redirects=True)
    assert refused.status_code == 401, refused.text
    assert await _who(console) == "Alice"
