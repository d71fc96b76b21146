"""``email_verified: false`` keeps a provider account's email from naming a person of the
directory (docs/console.md). Some providers spell the claim as a string (AWS Cognito's userinfo
says ``"false"``); a ``"false"`` said so is still false, and an account whose email is a
colleague's, unverified in any spelling, signs in as nobody of the directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Console,
    console,
    console_server,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_oidc import _body, _sign_in, _who, provider  # noqa: F401

SPOOF = Account("sub-mallory", "erin@example.com", "Mallory", [])
"""Any account of the provider whose email was set to Erin's (of the directory)."""


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_body(provider, password_hashes), source="console-oidc.yaml")


@pytest.mark.parametrize("unverified", [False, "false", "False", "FALSE", " false ", 0, "0", "no"])
async def test_an_unverified_email_in_any_spelling_names_nobody(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    unverified: Any,
) -> None:
    provider.tamper = {"email_verified": unverified}
    await _sign_in(console, provider, SPOOF)
    assert await _who(console) == "Mallory", f"email_verified={unverified!r} signed in as Erin"


@pytest.mark.parametrize("verified", [True, "true", "True"])
async def test_a_verified_email_in_any_spelling_names_its_person(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    verified: Any,
) -> None:
    provider.tamper = {"email_verified": verified}
    await _sign_in(console, provider, SPOOF)
    assert await _who(console) == "Erin E."


UNSAID = Account("sub-mallory", "erin@example.com", "Mallory", [], email_verified=None)
"""An account of a provider that never says whether an email is verified (Microsoft Entra ID),
its email set to Erin's."""


async def test_an_email_the_provider_never_said_it_verified_names_nobody(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
) -> None:
    await _sign_in(console, provider, UNSAID)
    assert await _who(console) == "Mallory"


async def test_trusting_unverified_emails_is_the_operators_choice(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    runtime: Runtime,
    password_hashes: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    body = _body(provider, password_hashes)
    body["console"]["oidc"]["trust_unverified_email"] = True
    (tmp_path / "c.yaml").write_text(json.dumps(body), encoding="utf-8")
    assert (await runtime.reload(tmp_path / "c.yaml")).ok
    await _sign_in(console, provider, UNSAID)
    assert await _who(console) == "Erin E."
    # Said to be unverified, it names nobody even then.
    provider.tamper = {"email_verified": False}
    await _sign_in(console, provider, SPOOF)
    assert await _who(console) == "Mallory"
