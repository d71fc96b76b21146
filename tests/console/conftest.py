"""Fixtures for the console: operators with real argon2 hashes (cheap ones), a signed-in HTTP
client."""

from __future__ import annotations

import copy
import html
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher
from pydantic import BaseModel, ConfigDict, SecretStr

from signoff.app.audit import Actor
from signoff.app.channel_types import CHANNEL_TYPES, ChannelType
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server

SESSION_SECRET = "console-test-session-secret-0123456789"
VAULT_SECRET = "hunter2-the-vault-password"
PASSWORDS = {
    "alice": "alice-correct-horse",
    "bob": "bob-battery-staple",
    "carol-ops": "carol-purple-monkey",
    "mallory": "mallory-not-an-approver",
}
CSRF_INPUT = re.compile(r'name="csrf_token" value="([^"]+)"')


class VaultConfig(BaseModel):
    """A channel type with secrets in its config, to see them masked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = "vaulted"
    password: SecretStr
    region: str = "eu"


CHEAP = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
"""argon2id at its smallest cost: a hash carries its parameters, so the server verifies these
in microseconds instead of the default's ~50 ms a sign-in (tests/console/test_auth.py checks
the default parameters themselves)."""


@pytest.fixture(scope="session")
def password_hashes() -> dict[str, str]:
    return {name: CHEAP.hash(pw) for name, pw in PASSWORDS.items()}


@pytest.fixture
def config(password_hashes: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> SignoffConfig:
    """The default test config plus console operators and a channel with a secret."""
    monkeypatch.setitem(
        CHANNEL_TYPES, "vaulted", ChannelType(VaultConfig, lambda name, cfg: FakeChannel(name))
    )
    monkeypatch.setenv("SIGNOFF_TEST_VAULT_PASSWORD", VAULT_SECRET)
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["channels"]["vault"] = {"type": "vaulted", "password": "${SIGNOFF_TEST_VAULT_PASSWORD}"}
    body["operators"] = operators(password_hashes)
    return parse_config(body, source="console-test.yaml")


def operators(password_hashes: dict[str, str]) -> dict[str, Any]:
    """The console's operators: alice and carol-ops (as Carol) are people, bob and mallory
    operator names (bob is also a person's web id)."""
    return {
        "alice": {"password_hash": password_hashes["alice"], "person": "alice"},
        "bob": {"password_hash": password_hashes["bob"]},
        "carol-ops": {"password_hash": password_hashes["carol-ops"], "person": "carol"},
        "mallory": {"password_hash": password_hashes["mallory"]},
    }


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,
        session_secret=SESSION_SECRET,
    )


def csrf_of(page: str) -> str:
    m = CSRF_INPUT.search(page)
    assert m is not None, "no CSRF token on the page"
    return html.unescape(m.group(1))


class Console:
    """An HTTP client that signs in to the console like a browser (cookies, forms)."""

    def __init__(self, base_url: str, *, address: str | None = None) -> None:
        """``address``: the local address to connect from (any of 127.0.0.0/8 on loopback)."""
        transport = httpx.AsyncHTTPTransport(local_address=address) if address else None
        self.client = httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False, transport=transport)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        return await self.client.get(path, **kw)

    async def form_token(self, path: str) -> str:
        r = await self.client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
        return csrf_of(r.text)

    async def sign_in(
        self, name: str, password: str | None = None, *, next_url: str = "/ui/"
    ) -> httpx.Response:
        token = await self.form_token("/ui/login")
        return await self.client.post(
            "/ui/login",
            data={
                "csrf_token": token,
                "username": name,
                "password": PASSWORDS.get(name, "") if password is None else password,
                "next": next_url,
            },
        )

    async def decide(
        self, request_id: str, verdict: str, reason: str = "", *, token: str | None = None
    ) -> httpx.Response:
        """Post the request page's form; follows the redirect back to the page."""
        if token is None:
            token = await self.form_token(f"/ui/requests/{request_id}")
        r = await self.client.post(
            f"/ui/requests/{request_id}/decision",
            data={"csrf_token": token, "verdict": verdict, "reason": reason},
        )
        return r


@pytest.fixture
async def console_server(runtime: Runtime) -> AsyncIterator[Server]:
    async with Server(runtime) as s:
        yield s


@pytest.fixture
async def console(console_server: Server) -> AsyncIterator[Console]:
    c = Console(console_server.url)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
async def alice(console: Console) -> Console:
    r = await console.sign_in("alice")
    assert r.status_code == 303, r.text
    return console


@pytest.fixture
async def agent(console_server: Server, runtime: Runtime) -> AsyncIterator[Agent]:
    async with transaction(runtime.sessions) as session:
        _, key = await create_key(session, "finance-bot", actor=Actor("test"))
    a = Agent(console_server.url, key)
    try:
        yield a
    finally:
        await a.aclose()


class Agent:
    """An agent calling the pre-tool-use endpoint."""

    def __init__(self, base_url: str, key: str) -> None:
        self.client = httpx.AsyncClient(
            base_url=base_url, timeout=30, trust_env=False, headers={"Authorization": f"Bearer {key}"}
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def ask(self, tool: str = "pay_invoice", **body: Any) -> str:
        """A gated call; the pending request's id."""
        body.setdefault("arguments", {"amount": 90000})
        r = await self.client.post("/v1/hooks/pre-tool-use", json={"tool_name": tool, **body})
        assert r.status_code == 200, r.text
        assert r.json()["decision"] == "pending", r.json()
        rid: str = r.json()["request_id"]
        return rid

    async def status(self, request_id: str) -> str:
        r = await self.client.get(f"/v1/requests/{request_id}")
        assert r.status_code == 200, r.text
        status: str = r.json()["status"]
        return status
