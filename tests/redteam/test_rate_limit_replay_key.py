"""A rate limit spares only a gated call sent again under its key: the same call, for the same
user, that a gate still asks about. A key once spent on a gated call buys nothing for a call
the gate does not ask about (a ``when`` over the user or the metadata, a reload)."""

from __future__ import annotations

import pytest

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import InProcess

HOOKS = [
    {"type": "rate_limit", "tools": ["pay_*"], "limit": 2, "window": "1h"},
    {
        "type": "confirmation_gate",
        "tools": ["pay_*"],
        "when": "user == 'intern'",
        "channel": "chat",
        "timeout": "5m",
    },
]


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(
        {"channels": {"chat": {"type": "fake"}}, "agents": {"finance-bot": {"hooks": HOOKS}}},
        source="test.yaml",
    )


async def test_a_key_held_by_a_gated_call_buys_unlimited_unmetered_calls(
    settings: Settings, config: SignoffConfig
) -> None:
    runtime = Runtime.create(settings, config, channels={"chat": FakeChannel("chat")})
    try:
        async with transaction(runtime.sessions) as session:
            _, key = await create_key(session, "finance-bot", actor=Actor("test"))
        auth = {"Authorization": f"Bearer {key}"}
        async with InProcess(runtime) as app, app.client() as http:

            async def pre(**body: object) -> dict:
                r = await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "pay_x", "arguments": {"amount": 1}, **body},
                    headers=auth,
                )
                assert r.status_code == 200, r.text
                return r.json()

            # One gated call (user intern) makes a request holding key k1: one token.
            first = await pre(idempotency_key="k1", user_id="intern")
            assert first["decision"] == "pending", first
            # Without the key, the limit of 2 holds: one more allowed, then denied.
            assert (await pre(idempotency_key="n1", user_id="boss"))["decision"] == "allow"
            assert (await pre(idempotency_key="n2", user_id="boss"))["decision"] == "deny"
            # Under k1 the same tool+arguments by a user the gate does not ask about is
            # allowed, again and again, taking no token.
            allowed = 0
            for _ in range(20):
                again = await pre(idempotency_key="k1", user_id="boss")
                allowed += again["decision"] == "allow"
        assert allowed == 0, f"{allowed} calls allowed past a rate limit of 2/h"
    finally:
        await runtime.aclose()
