"""A gate that lists no approvers is open to anyone who sees its card in its channel (``signoff
config check`` says so: "anyone in the channel 'chat' may approve"); operators, configured by
name, decide wherever the card went. Someone signed in through the identity provider whom no
operator entry names is neither: any account the provider signs in for this client (a new
hire, a contractor, a guest) must not decide a gate whose card went to a chat channel they
may not even be in, from the console or with a personal token made there. Where the provider
account is an operator's person, it may, as the operator may."""

from __future__ import annotations

import html
from typing import Any

import httpx
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
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import _body, _flash_after, _new_token, _sign_in, provider  # noqa: F401

GUEST = Account("sub-guest", "guest@partner.example", "Guest", ["everyone"])
"""Any account of the provider: in no directory, no approving group, no operator entry."""
ALICE = Account("sub-alice", "alice@example.com", "Alice L.", [])
"""The directory's alice (an operator's person) at the provider."""


def _open_body(provider: FakeProvider, password_hashes: dict[str, str]) -> dict[str, Any]:  # noqa: F811
    body = _body(provider, password_hashes)
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "open-in-chat",
            "tools": ["open_*"],
            "channel": "chat",
            "timeout": "30m",
        }
    )
    return body


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_open_body(provider, password_hashes), source="console-oidc.yaml")


async def test_a_provider_account_decides_no_open_gate_of_a_chat_channel_from_the_console(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    approve = await agent.ask("open_payout", arguments={"to": "x"})
    reject = await agent.ask("open_refund", arguments={"to": "y"})
    await _sign_in(console, provider, GUEST)
    shown = await _flash_after(console, approve)
    await _flash_after(console, reject, "reject")
    assert await status_of(runtime, approve) == "pending", shown[-400:]
    assert await status_of(runtime, reject) == "pending"


async def test_a_provider_account_decides_no_open_gate_of_a_chat_channel_with_a_token(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask("open_payout", arguments={"to": "x"})
    await _sign_in(console, provider, GUEST)
    token = await _new_token(console)
    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False, timeout=30) as cli:
        r = await cli.post(
            f"/v1/me/requests/{rid}/decision",
            json={"verdict": "approve"},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 409, r.text
    assert await status_of(runtime, rid) == "pending"


async def test_an_operators_person_signed_in_through_the_provider_decides_it(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask("open_payout", arguments={"to": "x"})
    await _sign_in(console, provider, ALICE)
    shown = html.unescape(await _flash_after(console, rid))
    assert await status_of(runtime, rid) == "approved", shown[-400:]
