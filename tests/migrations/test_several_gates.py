"""Revision 0006 (several gates per request) keeps the requests and votes made before it
valid: migrated from 0003 with a pending two-person request and its first vote, the
request reads, decides and replays as it would have."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig
from signoff.app.db import create_engine, migrate, transaction
from signoff.app.keys import create_key
from signoff.app.models import utcnow
from signoff.app.requests.intake import call_digest
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, PG_URL, Server, _drop_pg_database, _ensure_pg_database

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own, at no revision yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_0006_{os.getpid()}").render_as_string(hide_password=False)
    _drop_pg_database(url)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)


OLD_GATE = {
    "name": "two-person",
    "approvers": ["alice", "bob", "carol"],
    "quorum": 2,
    "allow_self_approval": False,
    "require_reject_reason": True,
    "timeout_seconds": 1800.0,
}


async def _write_as_0003(url: str, rid: str) -> None:
    """A pending request, its card and Alice's vote, as revision 0003's schema held them."""
    now = utcnow()
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO confirmation_request (id, agent_id, tool_name, arguments, call_digest, "
                "request_metadata, gate, channel, status, created_at, expires_at, idempotency_key) "
                "VALUES (:id, 'finance-bot', 'wire_money', :args, :digest, '{}', :gate, 'chat', 'pending', "
                ":now, :expires, 'old-key')"
            ).bindparams(
                sa.bindparam("now", type_=sa.DateTime()), sa.bindparam("expires", type_=sa.DateTime())
            ),
            {
                "id": rid,
                "args": json.dumps({"to": "x"}),
                "digest": call_digest("wire_money", {"to": "x"}),
                "gate": json.dumps(OLD_GATE),
                "now": now.replace(tzinfo=None),
                "expires": (now + timedelta(minutes=30)).replace(tzinfo=None),
            },
        )
        await conn.execute(
            sa.text(
                "INSERT INTO vote (request_id, voter, verdict, channel, user_id, name, identity, created_at) "
                "VALUES (:id, 'alice', 'approve', 'chat', 'U_ALICE', 'Alice', '{}', :now)"
            ).bindparams(sa.bindparam("now", type_=sa.DateTime())),
            {"id": rid, "now": now.replace(tzinfo=None)},
        )
    await engine.dispose()


async def test_requests_and_votes_from_before_still_decide(fresh_url: str, config: SignoffConfig) -> None:
    rid = uuid.uuid4().hex
    await asyncio.to_thread(migrate, fresh_url, "0003")
    await _write_as_0003(fresh_url, rid)
    await asyncio.to_thread(migrate, fresh_url)

    settings = Settings(database_url=fresh_url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    runtime = Runtime.create(settings, config)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        async with transaction(runtime.sessions) as session:
            _, key = await create_key(session, "finance-bot", actor=Actor("test"))
        agent = {"Authorization": f"Bearer {key}"}
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
            assert state["status"] == "pending"
            assert [(g["name"], g["channel"], g["approvals"], g["quorum"]) for g in state["gates"]] == [
                ("two-person", "chat", 1, 2)
            ]
            assert [(v["gate"], v["user_id"]) for v in state["votes"]] == [("two-person", "U_ALICE")]

            # The old vote still counts once: Alice cannot vote again, Bob's vote decides.
            again = await http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=admin,
            )
            # The same decision again stands as it was (the callback contract): counted once.
            assert again.status_code == 200, again.text
            assert (again.json()["status"], again.json()["approvals"]) == ("pending", 1)
            bob = await http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "bob"},
                headers=admin,
            )
            assert bob.json()["status"] == "approved"
            replay = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "wire_money", "arguments": {"to": "x"}, "idempotency_key": "old-key"},
                headers=agent,
            )
            # The gate the old request recorded is the gate asking now: the approval stands.
            assert (replay.json()["decision"], replay.json()["request_id"]) == ("allow", rid)
    finally:
        await runtime.aclose()
