"""What the console signs with its one secret stays apart: a personal token (without its
``sop_``) is no session cookie, a session cookie (with ``sop_`` added) is no personal token,
and a flash message's or an OIDC sign-in state's cookie is neither."""

from __future__ import annotations

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
from tests.console.fake_oidc import FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import _body, _new_token, _who, provider  # noqa: F401


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(_body(provider, password_hashes), source="console-oidc.yaml")


async def test_no_signed_value_of_the_console_is_another_kind(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask()
    assert (await console.sign_in("alice")).status_code == 303
    cookie = str(console.client.cookies.get("signoff_session"))
    token = await _new_token(console)
    await console.client.get("/ui/login/oidc")  # an OIDC sign-in state cookie
    flow = console.client.cookies.get("signoff_oidc", path="/ui/oidc")
    await console.decide(rid, "reject", "no")  # a flash message's cookie
    flash = console.client.cookies.get("signoff_flash")
    assert flow
    assert flash

    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False, timeout=30) as other:
        for value in (token.removeprefix("sop_"), token, str(flow), str(flash)):
            other.cookies.clear()
            other.cookies.set("signoff_session", value, path="/ui")
            home = await other.get("/ui/")
            assert home.status_code == 303, value[:20]
        for value in ("sop_" + cookie, "sop_" + str(flow), "sop_" + str(flash), cookie):
            r = await other.post(
                f"/v1/me/requests/{rid}/decision",
                json={"verdict": "approve"},
                headers={"Authorization": f"Bearer {value}"},
            )
            assert r.status_code == 401, (value[:20], r.status_code)
    assert await status_of(runtime, rid) == "rejected"  # alice's own rejection, nothing else
    assert await _who(console) == "Alice"
