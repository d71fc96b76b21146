"""One unreadable stored row never takes down a listing (rows written before the input
rules, or edited by hand), over real HTTP, on SQLite and PostgreSQL: the two differ in what
they store and read back."""

from __future__ import annotations

import csv
import io
import json

import httpx
import pytest
import sqlalchemy as sa

from signoff.app.db import dialect_of, transaction
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import Agent, Console

pytestmark = pytest.mark.postgres

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def spoil(runtime: Runtime, request_id: str, column: str, value: str) -> None:
    """Write ``value`` into a column of the row by hand, as SQL, past every rule."""
    async with transaction(runtime.sessions) as s:
        json_column = column in ("arguments", "request_metadata", "gate")
        cast = "CAST(:v AS json)" if json_column and dialect_of(s) == "postgresql" else ":v"
        await s.exec(
            sa.text(f"UPDATE confirmation_request SET {column} = {cast} WHERE id = :id"),  # type: ignore[call-overload]
            params={"v": value, "id": request_id},
        )


async def test_one_bad_row_never_takes_down_a_listing(
    alice: Console, agent: Agent, runtime: Runtime, console_server: Server
) -> None:
    good = await agent.ask(arguments={"amount": 90000, "memo": "fine"})
    surrogate = await agent.ask(arguments={"amount": 90001})
    bogus = await agent.ask(arguments={"amount": 90002})
    await spoil(runtime, surrogate, "arguments", '{"amount": 90001, "memo": "\\ud800"}')
    await spoil(runtime, surrogate, "request_metadata", '{"m": "\\udc00"}')
    await spoil(runtime, bogus, "status", "bogus")
    async with transaction(runtime.sessions) as s:
        sqlite = dialect_of(s) == "sqlite"
    broken = None
    if sqlite:  # PostgreSQL's json refuses text that is not JSON at all
        broken = await agent.ask(arguments={"amount": 90003})
        await spoil(runtime, broken, "arguments", "{not json")

    async with httpx.AsyncClient(base_url=console_server.url, headers=ADMIN, trust_env=False) as admin:
        listed = await admin.get("/v1/admin/requests")
        assert listed.status_code == 200, listed.text
        ids = [r["id"] for r in listed.json()]
        assert good in ids
        assert surrogate in ids
        assert bogus not in ids, "a row that cannot be shown is left out"
        shown = next(r for r in listed.json() if r["id"] == surrogate)
        assert shown["arguments"]["memo"] == "\ufffd", "unshowable characters are marked"
        if broken is not None:
            assert next(r for r in listed.json() if r["id"] == broken)["arguments"] == {
                "(unreadable)": "{not json"
            }

    for page in ("/ui/", "/ui/history", "/ui/history?status=pending"):
        r = await alice.get(page)
        assert r.status_code == 200, (page, r.text[:500])
        assert good in r.text

    exported = await alice.get("/ui/history/export.csv")
    assert exported.status_code == 200
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(exported.text))}
    assert rows.keys() >= {good, surrogate}
    assert rows[bogus]["status"] == "bogus", "shown as stored where it can be"
    lines = await alice.get("/ui/history/export.jsonl")
    assert lines.status_code == 200
    assert {json.loads(line)["id"] for line in lines.text.splitlines()} >= {good, surrogate}

    # The request itself can still be read, waited on and withdrawn by its agent.
    assert (await agent.client.get(f"/v1/requests/{surrogate}")).json()["arguments"]["memo"] == "\ufffd"
    assert (await agent.client.get(f"/v1/requests/{surrogate}/wait?timeout=0")).status_code == 200
    assert (await agent.client.post(f"/v1/requests/{surrogate}/cancel")).json()["status"] == "cancelled"
    assert (await alice.get(f"/ui/requests/{surrogate}")).status_code == 200
