"""An ntfy topic is a secret (README "A topic is a secret"): whoever knows one can read its
person's notifications on a server without per-topic access control, and each carries the
tokens that decide as that person. The console's configuration page is open to everyone the
console signs in, through the identity provider any account of it: it shows the people, and
must not show their topics."""

from __future__ import annotations

import pytest

import tests.conftest
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, free_port
from tests.console.conftest import (  # noqa: F401  (fixtures)
    SESSION_SECRET,
    Console,
    console,
    console_server,
    password_hashes,
)
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_oidc import _body, _sign_in, provider  # noqa: F401

TOPIC = "alice-3kQ9vT2mXr7wZp4L"
GUEST = Account("sub-guest", "guest@partner.example", "Guest", ["everyone"])


@pytest.fixture
def settings(db_url: str, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> Settings:  # noqa: F811
    """ntfy needs SIGNOFF_PUBLIC_URL: the server is told its own address in advance (the
    provider sends the browser back there)."""
    port = free_port()
    monkeypatch.setattr(tests.conftest, "free_port", lambda: port)
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,
        session_secret=SESSION_SECRET,
        public_url=f"http://127.0.0.1:{port}",
    )


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    body = _body(provider, password_hashes)
    body["channels"]["phone"] = {"type": "ntfy", "server": "http://127.0.0.1:9"}
    body["people"]["alice"]["ntfy"] = TOPIC
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "phone",
            "tools": ["phone_*"],
            "channel": "phone",
            "approvers": ["alice"],
        }
    )
    return parse_config(body, source="console-ntfy.yaml")


@pytest.mark.parametrize("who", ["guest", "operator"])
async def test_the_configuration_page_shows_no_ntfy_topic(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    who: str,
) -> None:
    if who == "guest":
        await _sign_in(console, provider, GUEST)
    else:
        assert (await console.sign_in("bob")).status_code == 303
    page = await console.get("/ui/config")
    assert page.status_code == 200
    assert "ntfy" in page.text  # the person's entry says they have one
    assert TOPIC not in page.text
