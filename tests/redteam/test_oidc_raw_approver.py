"""A raw channel id in ``approvers`` is not something a console sign-in may claim.

Gates may name approvers by a raw id of their channel's type (an email address on an email
channel, a Slack id on Slack): that id is vouched for by that channel only. Someone signed in
through the identity provider votes with the provider's username claim (the email by
default), which the person may choose or leave unverified: they are an approver as a person
of the directory (which takes only verified emails) or through a ``group:``, never by a raw
id their username or email repeats."""

from __future__ import annotations

import pytest

import tests.conftest
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, free_port
from tests.console.conftest import (  # noqa: F401  (fixtures)
    SESSION_SECRET,
    Agent,
    Console,
    agent,
    console,
    console_server,
    password_hashes,
)
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import _body, _flash_after, _sign_in, provider  # noqa: F401

AUDITOR = "auditor@partner.example"
"""The gate's approver: a raw address on the email channel, nobody of the directory."""

MALLORY = Account("sub-mallory", AUDITOR, "Mallory", [], email_verified=False)
"""Any account at the provider whose email (never verified) was set to the auditor's."""


@pytest.fixture
def settings(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Email links need SIGNOFF_PUBLIC_URL: the server is told its own address in advance (the
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
    body["channels"]["mail"] = {"type": "email", "smtp_url": "smtp://127.0.0.1:9", "from": "s@example.com"}
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "audited",
            "tools": ["audit_*"],
            "channel": "mail",
            "approvers": [AUDITOR],
            "min_assurance": "oidc",
        }
    )
    return parse_config(body, source="console-oidc.yaml")


async def test_an_unverified_email_at_the_provider_is_not_a_raw_email_approver(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask("audit_export", arguments={"table": "payroll"})
    await _sign_in(console, provider, MALLORY)
    flash = await _flash_after(console, rid)
    assert await status_of(runtime, rid) == "pending", (
        "approved by an account whose email the provider never verified"
    )
    assert "Approved" not in flash
