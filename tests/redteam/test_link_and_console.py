"""One person, two surfaces: an approver who votes with their email link and then again from
the console (signed in with their operator password), or the other way round, is one vote
toward a quorum of two; and a mail scanner opening the links with HEAD decides nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.channels.smtp_server import LocalSmtp
from tests.channels.test_email_flow import PUBLIC, confirm, links, mail_to
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import CHEAP, PASSWORDS, Console
from tests.redteam.support import ask
from tests.redteam.test_email_links import ALICE, BOB, LINK_SECRET, _mail_config

WIRE = {"tool_name": "wire_money", "arguments": {"amount": 5}}
"""The "wires" gate: alice and bob on the mail channel, a quorum of two."""


@pytest.fixture
def smtp() -> Iterator[LocalSmtp]:
    with LocalSmtp() as server:
        yield server


@pytest.fixture
async def mail(smtp: LocalSmtp, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    body: dict[str, Any] = _mail_config(smtp.port)
    body["operators"] = {
        "alice": {"password_hash": CHEAP.hash(PASSWORDS["alice"]), "person": "alice"},
    }
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret=LINK_SECRET,  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
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


async def _votes(runtime: Runtime, rid: str) -> list[Vote]:
    async with runtime.reads() as s:
        return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


async def _status(http: httpx.AsyncClient, key: str, rid: str) -> str:
    status: str = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})).json()[
        "status"
    ]
    return status


@pytest.mark.parametrize("first", ["link", "console"])
async def test_a_link_and_the_console_are_one_vote_of_one_person(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str, first: str
) -> None:
    server, http = mail
    rid = (await ask(http, agent_key, WIRE))["request_id"]
    alice_link = links(await mail_to(smtp, ALICE, rid))["Approve"]
    console = Console(server.url)
    try:
        assert (await console.sign_in("alice")).status_code == 303
        for surface in [first, "console" if first == "link" else "link"]:
            if surface == "link":
                await confirm(http, alice_link)
            else:
                await console.decide(rid, "approve")
    finally:
        await console.aclose()
    assert len(await _votes(server.runtime, rid)) == 1
    assert await _status(http, agent_key, rid) == "pending"
    bob = links(await mail_to(smtp, BOB, rid))
    assert (await confirm(http, bob["Approve"])).status_code == 200
    assert await _status(http, agent_key, rid) == "approved"


async def test_head_on_a_link_decides_nothing(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail
    rid = (await ask(http, agent_key, WIRE))["request_id"]
    for path in links(await mail_to(smtp, ALICE, rid)).values():
        r = await http.head(path)
        assert r.status_code in (200, 405), (path, r.status_code)
    assert await _votes(server.runtime, rid) == []
    assert await _status(http, agent_key, rid) == "pending"
