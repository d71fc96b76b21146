"""``console.password_sign_in: false`` ends every password sign-in (docs/console.md), and a
personal token stops working when the sign-in it was made from would no longer hold: a token
made from a password session decides nothing once password sign-in is turned off."""

from __future__ import annotations

import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.conftest import Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Agent,
    Console,
    agent,
    console,
    console_server,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import _body, _new_token, provider  # noqa: F401


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_body(provider, password_hashes), source="console-oidc.yaml")


async def test_a_password_sessions_token_ends_with_password_sign_in(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    password_hashes: dict[str, str],  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    token = await _new_token(console)
    runtime.config = parse_config(
        _body(provider, password_hashes, password_sign_in=False), source="passwords-off.yaml"
    )
    rid = await agent.ask("pay_invoice", arguments={"amount": 90000})
    answer = await agent.client.post(
        f"/v1/me/requests/{rid}/decision",
        json={"verdict": "approve"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 401, (answer.status_code, answer.text[:300])
    assert await status_of(runtime, rid) == "pending"
