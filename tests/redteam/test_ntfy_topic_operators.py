"""Everyone the console signs in (with OIDC on, any account of the identity provider) reads
the requests, their votes, the audit log and the history exports: none of them may show an
approver's ntfy topic, the secret that reads her notifications and the signed Approve in each.
Nor do the operator API's listings and the command line: they name the person by her
directory key instead (``(not shown)`` for someone the directory does not know)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent, Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.channels.fake_ntfy import FakeNtfy
from tests.channels.test_ntfy_flow import (  # noqa: F401  (fixtures)
    ALICE,
    BOB,
    CAROL,
    PUBLIC,
    SECRET,
    _config,
    notified,
    ntfy,
    pre,
    tap,
)
from tests.cli import signoff
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import CHEAP, PASSWORDS, Console

TOPICS = (ALICE, BOB, CAROL)
CONSOLE_PAGES = (
    "/ui/",
    "/ui/queue/rows",
    "/ui/grants",
    "/ui/grants?all=1",
    "/ui/tokens",
    "/ui/webhooks",
    "/ui/history",
    "/ui/history?status=approved",
    "/ui/history/export.csv",
    "/ui/history/export.jsonl",
    "/ui/audit",
    "/ui/audit?action=vote",
    "/ui/audit?action=vote_refused",
    "/ui/audit/verify",
    "/ui/config",
)
ADMIN_LISTINGS = ("/v1/admin/requests", "/v1/admin/grants", "/v1/admin/audit", "/v1/admin/config")


@pytest.fixture
async def phone(ntfy: FakeNtfy, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:  # noqa: F811
    """The ntfy flow's server with a second console operator, ``mallory``: an operator who is
    no approver of anything (as anyone the identity provider signs in would be)."""
    body: dict[str, Any] = copy.deepcopy(_config(ntfy.url))
    body["operators"]["mallory"] = {"password_hash": CHEAP.hash(PASSWORDS["mallory"])}
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret=SECRET,  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
        sweep_interval_seconds=0.2,
    )
    runtime = Runtime.create(settings, parse_config(body, source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def _decided_by_phone(
    server: Server,
    http: httpx.AsyncClient,
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> list[str]:
    """Votes and refusals through ntfy: a two-person wire approved by Alice and Bob, a
    transfer made for Alice that she cannot approve (refused) and Bob rejects."""
    wire = await pre(http, agent_key, {"tool_name": "wire_money", "arguments": {"to": "acme"}})
    transfer = await pre(
        http, agent_key, {"tool_name": "transfer_funds", "arguments": {}, "user_id": "alice"}
    )
    [alice_wire] = await notified(ntfy, ALICE, wire)
    [bob_wire] = await notified(ntfy, BOB, wire)
    assert (await tap(http, alice_wire, "Approve")).status_code == 200
    assert (await tap(http, bob_wire, "Approve")).status_code == 200
    [alice_transfer] = await notified(ntfy, ALICE, transfer)
    [bob_transfer] = await notified(ntfy, BOB, transfer)
    refused = await tap(http, alice_transfer, "Approve")
    assert refused.status_code == 409, refused.text  # her own call
    assert (await tap(http, bob_transfer, "Reject")).status_code == 200
    # The database keeps the topics (the votes are checked against them): only views hide them.
    async with server.runtime.sessions() as s:
        ids = {v.user_id for v in (await s.exec(select(Vote))).all()}
        hers = await s.exec(select(AuditEvent).where(col(AuditEvent.actor_id) == ALICE))
        actors = {e.action for e in hers.all()}
    assert {ALICE, BOB} <= ids
    assert actors == {"vote", "vote_refused"}
    return [wire, transfer]


def _shows_no_topic(where: str, text: str) -> None:
    for topic in TOPICS:
        assert topic not in text, f"{where} shows the ntfy topic {topic}"


async def test_no_console_page_or_export_shows_a_topic_to_another_operator(
    phone: tuple[Server, httpx.AsyncClient],
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> None:
    server, http = phone
    ids = await _decided_by_phone(server, http, ntfy, agent_key)
    mallory = Console(server.url)
    try:
        assert (await mallory.sign_in("mallory")).status_code == 303
        paths = [*CONSOLE_PAGES]
        for rid in ids:
            paths += [f"/ui/requests/{rid}", f"/ui/requests/{rid}/live", f"/ui/audit?request_id={rid}"]
        for path in paths:
            shown = await mallory.get(path)
            assert shown.status_code == 200, (path, shown.status_code)
            _shows_no_topic(path, shown.text)
        wire = (await mallory.get(f"/ui/requests/{ids[0]}")).text
        assert "(alice)" in wire  # each vote names its person by her directory key
        assert "(bob)" in wire
        refused = (await mallory.get(f"/ui/requests/{ids[1]}")).text.split('id="refused-title"')[1]
        assert "own" in refused.split("</section>")[0].lower()  # her refused click is listed
        export = (await mallory.get("/ui/history/export.jsonl")).text
        assert export.strip()
    finally:
        await mallory.aclose()


async def test_no_operator_api_listing_shows_a_topic(
    phone: tuple[Server, httpx.AsyncClient],
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> None:
    server, http = phone
    ids = await _decided_by_phone(server, http, ntfy, agent_key)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    paths = [*ADMIN_LISTINGS, *(f"/v1/admin/requests/{rid}" for rid in ids)]
    paths += [f"/v1/admin/audit?request_id={rid}" for rid in ids]
    for path in paths:
        shown = await http.get(path, headers=admin)
        assert shown.status_code == 200, (path, shown.text)
        _shows_no_topic(path, shown.text)
    trail = (await http.get(f"/v1/admin/requests/{ids[1]}", headers=admin)).json()["audit"]
    [refusal] = [e for e in trail if e["action"] == "vote_refused"]
    assert refusal["actor_id"] == "alice"
    assert refusal["actor_name"] == "Alice"
    decided = (await http.get(f"/v1/admin/requests/{ids[0]}", headers=admin)).json()
    assert decided["decided_by"]["user_id"] == "bob"
    assert {e["actor_id"] for e in decided["audit"] if e["action"] in ("vote", "approved")} == {
        "alice",
        "bob",
    }


async def test_the_command_line_shows_no_topic(
    phone: tuple[Server, httpx.AsyncClient],
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
    db_url: str,
) -> None:
    server, http = phone
    ids = await _decided_by_phone(server, http, ntfy, agent_key)
    env = {"PATH": "/usr/bin:/bin", "SIGNOFF_DATABASE_URL": db_url}
    runs = [("requests", "list"), ("grants", "list", "--all")]
    runs += [("requests", "show", rid) for rid in ids]
    for args in runs:
        done = await asyncio.to_thread(signoff, *args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        _shows_no_topic(" ".join(args), done.stdout + done.stderr)
    shown = json.loads((await asyncio.to_thread(signoff, "requests", "show", ids[0], env=env)).stdout)
    assert shown["decided_by"]["user_id"] == "bob"
