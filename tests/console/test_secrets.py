"""Secrets in a gated call's arguments never reach the database, the card, the console or
the exports: redacted by key in any spelling, and by value inside text (real HTTP, SQLite
and PostgreSQL)."""

from __future__ import annotations

import asyncio

import httpx
import sqlalchemy as sa

from signoff.app.db import transaction
from signoff.app.outbox import Dispatcher
from signoff.app.runtime import Runtime
from signoff.channels.fake import FakeChannel
from signoff.channels.slack._blocks import render_card
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import Agent, Console

SECRETS = [f"s3cr3t{i:02d}x" for i in range(16)]
ARGUMENTS = {
    "amount": 90000,
    "API-KEY": SECRETS[0],
    "X-Api-Key": SECRETS[1],
    "api key": SECRETS[2],
    "private_key": SECRETS[3],
    "credentials": {"user": "u", "pass": SECRETS[4]},
    "passphrase": SECRETS[5],
    "pwd": SECRETS[6],
    "access_key_id": SECRETS[7],
    "headers": [{"authorization": SECRETS[8]}, {"apiKey": SECRETS[9]}],
    "memo": (
        f"call with Bearer {SECRETS[10]} and AKIAIOSFODNN7EXAMPLE, xoxb-{SECRETS[11]}-1234, "
        f"sk-proj-{SECRETS[12]}abcdef, https://bob:{SECRETS[13]}@db.internal/app, "
        f"-----BEGIN PRIVATE KEY-----\n{SECRETS[14]}\n-----END PRIVATE KEY-----"
    ),
    "command": f"curl -H 'X-Api-Key: {SECRETS[15]}' https://api.example.com",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2VjcmV0c2lnbmF0dXJlMTIz",
}
LEAKS = [*SECRETS, "AKIAIOSFODNN7EXAMPLE", "c2VjcmV0c2lnbmF0dXJlMTIz"]


def assert_no_secret(where: str, text: str) -> None:
    found = [s for s in LEAKS if s in text]
    assert not found, f"{where} shows {found}"


async def test_secrets_never_reach_the_database_card_console_or_exports(
    alice: Console, agent: Agent, runtime: Runtime, console_server: Server, fake_channel: FakeChannel
) -> None:
    r = await agent.client.post(
        "/v1/hooks/pre-tool-use", json={"tool_name": "pay_invoice", "arguments": ARGUMENTS}
    )
    assert r.json()["decision"] == "pending", r.text
    assert_no_secret("the agent's answer", r.text)
    rid = r.json()["request_id"]
    shown = r.json()["request"]["arguments"]
    assert shown["amount"] == 90000
    assert shown["memo"].startswith("call with Bearer [redacted] and [redacted], [redacted], [redacted], ")
    assert "https://bob:[redacted]@db.internal/app" in shown["memo"]

    async with transaction(runtime.sessions) as s:
        stored = (
            await s.exec(  # type: ignore[call-overload]
                sa.text("SELECT arguments, request_metadata FROM confirmation_request WHERE id = :id"),
                params={"id": rid},
            )
        ).one()
        events = (await s.exec(sa.text("SELECT detail FROM audit_event"))).all()  # type: ignore[call-overload]
    assert_no_secret("the database row", repr(stored))
    assert_no_secret("the audit log", repr(events))

    await Dispatcher(
        runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event()
    ).run_once()
    card = fake_channel.cards_for(rid)[0]
    assert_no_secret("the card", repr(card))
    assert_no_secret("the Slack card", repr(render_card(card)))

    async with httpx.AsyncClient(
        base_url=console_server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, trust_env=False
    ) as admin:
        for path in ("/v1/admin/requests", f"/v1/admin/requests/{rid}", "/v1/admin/audit"):
            assert_no_secret(path, (await admin.get(path)).text)
    assert_no_secret("the agent's read", (await agent.client.get(f"/v1/requests/{rid}")).text)
    for page in (
        "/ui/",
        f"/ui/requests/{rid}",
        "/ui/history",
        "/ui/history/export.csv",
        "/ui/history/export.jsonl",
    ):
        answer = await alice.get(page)
        assert answer.status_code == 200, page
        assert_no_secret(page, answer.text)
