"""Revision 0012 (each gate snapshot once) keeps the requests made before it valid: migrated
from 0011 with a pending two-person request as 0011 wrote it (its first gate in ``gate`` and in
``gates``, Alice's vote cast) and one made before several gates could ask (``gate`` alone), both
read, decide and replay as they would have; a downgrade gives ``gate`` back."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig
from signoff.app.db import create_engine, downgrade, migrate, transaction
from signoff.app.keys import create_key
from signoff.app.models import utcnow
from signoff.app.requests.canonical import call_digest
from signoff.app.requests.eligibility import recorded
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, PG_URL, Server, _drop_pg_database, _ensure_pg_database

pytestmark = pytest.mark.postgres

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of this test's own, at no revision yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_0012_{os.getpid()}").render_as_string(hide_password=False)
    _drop_pg_database(url)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)


_INSERT = sa.text(
    "INSERT INTO confirmation_request (id, agent_id, tool_name, arguments, call_digest, request_metadata, "
    "gate, gates, channel, status, created_at, expires_at, idempotency_key) VALUES (:id, 'finance-bot', "
    "'wire_money', :args, :digest, '{}', :gate, :gates, 'chat', 'pending', :now, :expires, :key)"
).bindparams(sa.bindparam("now", type_=sa.DateTime()), sa.bindparam("expires", type_=sa.DateTime()))


async def _write_as_0011(url: str, config: SignoffConfig, ids: tuple[str, str]) -> dict[str, Any]:
    """Two pending two-person requests as 0011's servers wrote them, the first with Alice's
    vote; returns the first gate's snapshot as 0011 stored it."""
    gate = dict(config.confirmation_gates("finance-bot"))["two-person"]
    stored = recorded("two-person", gate, config)[0].model_dump(mode="json", exclude={"config_version"})
    first = {**stored, "config_version": config.version}
    before_several = {k: stored[k] for k in ("name", "approvers", "quorum", "require_reject_reason")}
    now = utcnow()
    engine = create_engine(url)
    async with engine.begin() as conn:
        for rid, key, row_gate, gates in (
            (ids[0], "key-0011", first, [stored]),
            (ids[1], "key-0003", {**before_several, "config_version": config.version}, []),
        ):
            arguments = {"to": key}
            await conn.execute(
                _INSERT,
                {
                    "id": rid,
                    "args": json.dumps(arguments),
                    "digest": call_digest("wire_money", arguments),
                    "gate": json.dumps(row_gate),
                    "gates": json.dumps(gates),
                    "now": now.replace(tzinfo=None),
                    "expires": (now + timedelta(minutes=30)).replace(tzinfo=None),
                    "key": key,
                },
            )
        await conn.execute(
            sa.text(
                "INSERT INTO vote (request_id, gate, voter, verdict, channel, user_id, name, identity, "
                "created_at) VALUES (:id, 0, 'alice', 'approve', 'chat', 'U_ALICE', 'Alice', '{}', :now)"
            ).bindparams(sa.bindparam("now", type_=sa.DateTime())),
            {"id": ids[0], "now": now.replace(tzinfo=None)},
        )
    await engine.dispose()
    return stored


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def _columns(url: str, rid: str, version: str = "config_version") -> tuple[Any, Any, str | None]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.text(f"SELECT gate, gates, {version} FROM confirmation_request WHERE id = :id"),
                    {"id": rid},
                )
            ).one()
            # SQLite answers a JSON column read as text with the text.
            return _json(row[0]), _json(row[1]), row[2]
    finally:
        await engine.dispose()


async def _set_receipts_aside(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("UPDATE confirmation_request SET receipt = NULL"))
    finally:
        await engine.dispose()


async def test_requests_from_0011_read_decide_and_replay(fresh_url: str, config: SignoffConfig) -> None:
    ids = (uuid.uuid4().hex, uuid.uuid4().hex)
    await asyncio.to_thread(migrate, fresh_url, "0011")
    stored = await _write_as_0011(fresh_url, config, ids)
    await asyncio.to_thread(migrate, fresh_url)

    # Each snapshot is stored once now: in gates, the version beside it.
    gate, gates, version = await _columns(fresh_url, ids[0])
    assert (gate, gates, version) == (None, [stored], config.version)
    gate, gates, version = await _columns(fresh_url, ids[1])
    assert (gates, version) == ([], config.version)
    assert gate["name"] == "two-person"  # its only snapshot, where it was

    settings = Settings(database_url=fresh_url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]
    runtime = Runtime.create(settings, config)
    try:
        async with transaction(runtime.sessions) as session:
            _, token = await create_key(session, "finance-bot", actor=Actor("test"))
        agent = {"Authorization": f"Bearer {token}"}
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            for rid, approvals in zip(ids, (1, 0), strict=True):
                state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
                assert state["status"] == "pending"
                assert state["config_version"] == config.version
                assert [(g["name"], g["channel"], g["approvals"], g["quorum"]) for g in state["gates"]] == [
                    ("two-person", "chat", approvals, 2)
                ]
            again = await http.post(
                f"/v1/admin/requests/{ids[0]}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=ADMIN,
            )
            # The same decision again stands as it was (the callback contract): counted once.
            assert again.status_code == 200, again.text
            assert (again.json()["status"], again.json()["approvals"]) == ("pending", 1)
            for rid, voters in zip(ids, (["bob"], ["alice", "carol"]), strict=True):
                for voter in voters:
                    decided = await http.post(
                        f"/v1/admin/requests/{rid}/decision",
                        json={"verdict": "approve", "operator": voter},
                        headers=ADMIN,
                    )
                assert decided.json()["status"] == "approved", decided.text
            for rid, key in zip(ids, ("key-0011", "key-0003"), strict=True):
                replay = await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "wire_money", "arguments": {"to": key}, "idempotency_key": key},
                    headers=agent,
                )
                assert (replay.json()["decision"], replay.json()["request_id"]) == ("allow", rid)
            made = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "wire_money", "arguments": {"to": "new"}},
                headers=agent,
            )
            new = made.json()["request_id"]
    finally:
        await runtime.aclose()

    # A request made at 0012 stores its gate once, smaller; the downgrade writes gate back.
    gate, gates, version = await _columns(fresh_url, new)
    assert gate is None
    assert version == config.version
    assert len(json.dumps(gates)) < len(json.dumps(stored))
    # The decisions' signed receipts (0013) are never downgraded away: set them aside first.
    await _set_receipts_aside(fresh_url)
    await asyncio.to_thread(downgrade, fresh_url, "0011")
    gate, gates, _ = await _columns(fresh_url, new, version="NULL")
    assert gate == {**gates[0], "config_version": config.version}
