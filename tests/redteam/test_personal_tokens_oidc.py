"""Whose a personal token is, for a sign-in through the identity provider: the account (its
issuer and subject), never the username or email it repeats. Another account of the provider
under the same email sees none of its tokens on the console's Token page and revokes none."""

from __future__ import annotations

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Console,
    console,
    console_server,
    csrf_of,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_oidc import DANA, _body, _new_token, _sign_in, provider  # noqa: F401
from tests.redteam.test_personal_token_listing import ROW

SAME_EMAIL = Account("sub-someone-else", DANA.email, "Not Dana", ["everyone"])


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_body(provider, password_hashes), source="console-oidc.yaml")


async def test_another_account_with_the_same_email_neither_sees_nor_revokes_a_token(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
) -> None:
    await _sign_in(console, provider, DANA)
    await _new_token(console)
    [tid] = ROW.findall((await console.get("/ui/tokens")).text)
    other = Console(console_server.url)
    try:
        await _sign_in(other, provider, SAME_EMAIL)
        page = (await other.get("/ui/tokens")).text
        assert ROW.findall(page) == []
        tried = await other.client.post(f"/ui/tokens/{tid}/revoke", data={"csrf_token": csrf_of(page)})
        assert tried.status_code == 303
    finally:
        await other.aclose()
    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False) as http:
        listed = (
            await http.get("/v1/admin/tokens", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        ).json()
    assert [(t["id"], t["active"]) for t in listed] == [(tid, True)]
    # Its owner revokes it.
    page = (await console.get("/ui/tokens")).text
    assert (
        await console.client.post(f"/ui/tokens/{tid}/revoke", data={"csrf_token": csrf_of(page)})
    ).status_code == 303
    assert "revoked by" in (await console.get("/ui/tokens")).text
