"""Console sessions that must not outlive what they stood for: a cookie planted before sign-in
(fixation) is still nobody's afterwards; an operator's session ends when a reload changes
their password or removes them, and a session signed in through the identity provider ends
when a reload removes console.oidc or names another client. Each refused session decides
nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.console.conftest import (  # noqa: F401  (fixtures)
    CHEAP,
    Agent,
    Console,
    agent,
    console,
    console_server,
    csrf_of,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import DANA, _body, _sign_in, _who, provider  # noqa: F401


@pytest.fixture
def body(provider: FakeProvider, password_hashes: dict[str, str]) -> dict[str, Any]:  # noqa: F811
    return _body(provider, password_hashes)


@pytest.fixture
def config(body: dict[str, Any]) -> SignoffConfig:
    return parse_config(body, source="console-oidc.yaml")


async def test_a_cookie_planted_before_sign_in_is_nobodys_after(
    console: Console,  # noqa: F811
    console_server: Any,  # noqa: F811
) -> None:
    attacker = Console(console_server.url)
    try:
        await attacker.get("/ui/login")
        planted = attacker.client.cookies.get("signoff_session")
        host = str(console.client.base_url.host)
        console.client.cookies.set("signoff_session", str(planted), domain=host, path="/ui")
        assert (await console.sign_in("alice")).status_code == 303
        assert console.client.cookies.get("signoff_session", domain=host) != planted
        assert await _who(console) == "Alice"
        assert await _who(attacker) is None
    finally:
        await attacker.aclose()


def _changed(body: dict[str, Any], change: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    if change == "new password":
        body["operators"]["alice"]["password_hash"] = CHEAP.hash("a-new-password-for-alice")
    elif change == "operator removed":
        del body["operators"]["alice"]
    elif change == "passwords off":
        body["console"]["password_sign_in"] = False
    elif change == "oidc removed":
        del body["console"]["oidc"]
        hooks = body["agents"]["finance-bot"]["hooks"]
        hooks[:] = [h for h in hooks if not any(a.startswith("group:") for a in h.get("approvers", []))]
    else:
        body["console"]["oidc"]["client_id"] = "another-client"
    return body


@pytest.mark.parametrize("change", ["new password", "operator removed", "passwords off"])
async def test_a_reload_ends_the_password_session_it_no_longer_holds(
    console: Console,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
    body: dict[str, Any],
    change: str,
) -> None:
    rid = await agent.ask()
    assert (await console.sign_in("alice")).status_code == 303
    token = csrf_of((await console.get(f"/ui/requests/{rid}")).text)
    runtime.config = parse_config(_changed(body, change), source="reloaded.yaml")
    assert await _who(console) is None
    r = await console.decide(rid, "approve", token=token)
    assert r.status_code == 303
    assert r.headers["location"].startswith("/ui/login")
    assert await status_of(runtime, rid) == "pending"


@pytest.mark.parametrize("change", ["oidc removed", "another client"])
async def test_a_reload_ends_the_provider_session_it_no_longer_holds(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
    body: dict[str, Any],
    change: str,
) -> None:
    rid = await agent.ask("one_payout", arguments={"to": "x"})
    await _sign_in(console, provider, DANA)
    assert await _who(console) == "Dana"
    token = csrf_of((await console.get(f"/ui/requests/{rid}")).text)
    runtime.config = parse_config(_changed(body, change), source="reloaded.yaml")
    assert await _who(console) is None
    await console.decide(rid, "approve", token=token)
    assert await status_of(runtime, rid) == "pending"
