"""Revision 0007 (single-use approvals, grants) keeps what was approved before it valid: an
approval made under 0006 still allows its call once, is closed by the call's report, and lapses
after the default ``approval_valid_for``; the revision goes down and up again cleanly."""

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

GATE = {
    "key": "payments",
    "name": "payments",
    "channel": "chat",
    "approvers": ["alice", "bob"],
    "quorum": 1,
    "allow_self_approval": False,
    "require_reject_reason": False,
    "timeout_seconds": 1800.0,
}
ARGUMENTS = {"amount": 60000}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own, at no revision yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_0007_{os.getpid()}").render_as_string(hide_password=False)
    _drop_pg_database(url)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)


async def _approved_as_0006(url: str, rid: str, key: str, decided_ago: timedelta) -> None:
    """An approved request and its vote, as revision 0006's schema held them."""
    now = utcnow().replace(tzinfo=None)
    stamps = [sa.bindparam(n, type_=sa.DateTime()) for n in ("now", "expires", "decided")]
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO confirmation_request (id, agent_id, tool_name, arguments, call_digest, "
                "request_metadata, gate, gates, channel, status, created_at, expires_at, decided_at, "
                "decided_by_channel, decided_by_user_id, decided_by_name, idempotency_key) "
                "VALUES (:id, 'finance-bot', 'pay_invoice', :args, :digest, '{}', :gate, :gates, 'chat', "
                "'approved', :now, :expires, :decided, 'web', 'alice', 'Alice', :key)"
            ).bindparams(*stamps),
            {
                "id": rid,
                "args": json.dumps(ARGUMENTS),
                "digest": call_digest("pay_invoice", ARGUMENTS),
                "gate": json.dumps(GATE),
                "gates": json.dumps([GATE]),
                "now": now - decided_ago,
                "expires": now + timedelta(minutes=30),
                "decided": now - decided_ago,
                "key": key,
            },
        )
        await conn.execute(
            sa.text(
                "INSERT INTO vote (request_id, gate, voter, verdict, channel, user_id, name, identity, "
                "created_at) VALUES (:id, 0, 'alice', 'approve', 'web', 'alice', 'Alice', '{}', :now)"
            ).bindparams(sa.bindparam("now", type_=sa.DateTime())),
            {"id": rid, "now": now},
        )
    await engine.dispose()


async def test_an_approval_from_before_allows_its_call_once(fresh_url: str, config: SignoffConfig) -> None:
    fresh, old = uuid.uuid4().hex, uuid.uuid4().hex
    await asyncio.to_thread(migrate, fresh_url, "0006")
    await _approved_as_0006(fresh_url, fresh, "fresh-key", timedelta(minutes=1))
    await _approved_as_0006(fresh_url, old, "old-key", timedelta(minutes=11))
    await asyncio.to_thread(migrate, fresh_url)

    settings = Settings(database_url=fresh_url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    runtime = Runtime.create(settings, config)
    try:
        async with transaction(runtime.sessions) as session:
            _, token = await create_key(session, "finance-bot", actor=Actor("test"))
        agent = {"Authorization": f"Bearer {token}"}
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:

            async def replay(key: str) -> dict[str, str]:
                body = {"tool_name": "pay_invoice", "arguments": ARGUMENTS, "idempotency_key": key}
                answer: dict[str, str] = (
                    await http.post("/v1/hooks/pre-tool-use", json=body, headers=agent)
                ).json()
                return answer

            assert (await replay("fresh-key"))["decision"] == "allow"
            lapsed = await replay("old-key")
            assert lapsed["decision"] == "deny"
            assert "lapsed" in lapsed["reason"]
            report = {"tool_name": "pay_invoice", "arguments": ARGUMENTS, "idempotency_key": "fresh-key"}
            assert (await http.post("/v1/hooks/post-tool-use", json=report, headers=agent)).status_code == 200
            assert "used" in (await replay("fresh-key"))["reason"]
            shown = (await http.get(f"/v1/requests/{fresh}", headers=agent)).json()
            assert shown["executed_at"] is not None
            assert shown["grant"] is None
            assert shown["votes"][0]["grant"] is None
    finally:
        await runtime.aclose()


async def test_the_revision_goes_down_and_up_again(fresh_url: str) -> None:
    await asyncio.to_thread(migrate, fresh_url)
    from alembic import command
    from alembic.config import Config

    from signoff.app.db import MIGRATIONS, async_url

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = async_url(fresh_url)
    await asyncio.to_thread(command.downgrade, cfg, "0006")
    engine = create_engine(fresh_url)
    async with engine.connect() as conn:
        tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
        columns = await conn.run_sync(lambda c: [col["name"] for col in sa.inspect(c).get_columns("vote")])
    await engine.dispose()
    assert "approval_grant" not in tables
    assert "grant_choice" not in columns
    await asyncio.to_thread(migrate, fresh_url)
