"""Revision 0015 (audit chains) keeps an upgraded log verifiable: the one chain earlier servers
wrote becomes chain 1 as it is, new events spread over the chains, and ``verify_chain`` passes
before and after; the downgrade links everything into one chain the previous release verifies,
and refuses a log that is already broken."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from signoff.app import audit
from signoff.app.audit import GENESIS, Action, Actor, event_hash, verify_chain
from signoff.app.config import SignoffConfig
from signoff.app.db import SchemaError, create_engine, downgrade, migrate, transaction
from signoff.app.models import UTCDateTime, utcnow
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, PG_URL, _drop_pg_database, _ensure_pg_database

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_0015_{os.getpid()}").render_as_string(hide_password=False)
    _drop_pg_database(url)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)


_OLD_EVENTS = sa.table(
    "audit_event",
    *(sa.column(c) for c in ("seq", "request_id", "action", "actor_channel", "actor_id", "actor_name")),
    sa.column("detail", sa.JSON()),
    sa.column("created_at", UTCDateTime()),
    sa.column("prev_hash"),
    sa.column("hash"),
)


async def _write_as_0012(url: str, n: int) -> None:
    """``n`` events in one chain, as 0012's servers appended them (numbered 1 to n)."""
    prev, rows = GENESIS, []
    start = utcnow() - timedelta(hours=1)
    for seq in range(1, n + 1):
        actor = Actor("web", f"u{seq}", "Ünïcode")
        created_at = start + timedelta(seconds=seq)
        detail = {"n": seq, "note": "ß"}
        digest = event_hash(
            seq=seq,
            prev_hash=prev,
            request_id=None,
            action="tool_call",
            actor=actor,
            detail=detail,
            created_at=created_at,
        )
        rows.append(
            {
                "seq": seq,
                "request_id": None,
                "action": "tool_call",
                "actor_channel": actor.channel,
                "actor_id": actor.id,
                "actor_name": actor.name,
                "detail": detail,
                "created_at": created_at,
                "prev_hash": prev,
                "hash": digest,
            }
        )
        prev = digest
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(sa.insert(_OLD_EVENTS), rows)
        await conn.execute(sa.text("UPDATE audit_head SET seq = :n, last_hash = :h"), {"n": n, "h": prev})
    await engine.dispose()


async def _verify_as_0012(url: str) -> tuple[int, str | None]:
    """The previous release's check: one chain, numbered from 1, its head at its end."""
    engine = create_engine(url)
    async with engine.connect() as conn:
        head = (await conn.execute(sa.text("SELECT seq, last_hash FROM audit_head"))).all()
        events = (await conn.execute(sa.select(_OLD_EVENTS).order_by(_OLD_EVENTS.c.seq))).all()
    await engine.dispose()
    prev = GENESIS
    for expected, ev in enumerate(events, start=1):
        if ev.seq != expected or ev.prev_hash != prev:
            return expected - 1, f"event {expected} out of place"
        actual = event_hash(
            seq=ev.seq,
            prev_hash=prev,
            request_id=ev.request_id,
            action=ev.action,
            actor=Actor(ev.actor_channel or "", ev.actor_id, ev.actor_name),
            detail=ev.detail,
            created_at=ev.created_at,
        )
        if actual != ev.hash:
            return expected - 1, f"event {expected} edited"
        prev = ev.hash
    if head != [(len(events), prev)]:
        return len(events), f"head {head} is not the end"
    return len(events), None


async def _append(runtime: Runtime, transactions: int) -> None:
    async def one(i: int) -> None:
        async with transaction(runtime.sessions) as s:
            await audit.append(s, Action.TOOL_CALL, actor=Actor("agent", str(i)), detail={"after": i})
            await audit.append(
                s, Action.TOOL_CALL, actor=Actor("agent", str(i)), detail={"after": i, "too": 1}
            )

    await asyncio.gather(*(one(i) for i in range(transactions)))


async def test_an_upgraded_log_verifies_grows_in_chains_and_downgrades_into_one(
    fresh_url: str, config: SignoffConfig
) -> None:
    await asyncio.to_thread(migrate, fresh_url, "0012")
    await _write_as_0012(fresh_url, 5)
    assert await _verify_as_0012(fresh_url) == (5, None)
    await asyncio.to_thread(migrate, fresh_url)

    runtime = Runtime.create(Settings(database_url=fresh_url, admin_token=ADMIN_TOKEN), config)  # type: ignore[arg-type]
    try:
        async with runtime.sessions() as s:
            assert await verify_chain(s) == (5, None)
            chain_1 = (
                await s.exec(sa.text("SELECT chain, chain_seq, seq FROM audit_event ORDER BY seq"))
            ).all()
        assert [tuple(r) for r in chain_1] == [(1, n, n) for n in range(1, 6)]
        await _append(runtime, 6)
        async with runtime.sessions() as s:
            assert await verify_chain(s) == (17, None)
            rows = (await s.exec(sa.text("SELECT seq, chain FROM audit_event WHERE seq > 5"))).all()
        assert len(rows) == 12
        assert len({chain for _, chain in rows}) > 1
    finally:
        await runtime.aclose()

    await asyncio.to_thread(downgrade, fresh_url, "0014")
    assert await _verify_as_0012(fresh_url) == (17, None)
    # And up again: the relinked chain is chain 1.
    await asyncio.to_thread(migrate, fresh_url)
    runtime = Runtime.create(Settings(database_url=fresh_url, admin_token=ADMIN_TOKEN), config)  # type: ignore[arg-type]
    try:
        async with runtime.sessions() as s:
            assert await verify_chain(s) == (17, None)
    finally:
        await runtime.aclose()


@pytest.mark.parametrize(
    "tamper",
    ["UPDATE audit_event SET actor_name = 'Mallory' WHERE seq = 3", "DELETE FROM audit_event WHERE seq = 4"],
)
async def test_a_broken_log_is_not_relinked_by_the_downgrade(fresh_url: str, tamper: str) -> None:
    await asyncio.to_thread(migrate, fresh_url, "0012")
    await _write_as_0012(fresh_url, 4)
    await asyncio.to_thread(migrate, fresh_url, "0015")
    engine = create_engine(fresh_url)
    async with engine.begin() as conn:
        await conn.execute(sa.text(tamper))
    await engine.dispose()
    with pytest.raises((SchemaError, RuntimeError), match="audit chain 1"):
        await asyncio.to_thread(downgrade, fresh_url, "0014")
    engine = create_engine(fresh_url)
    async with engine.connect() as conn:
        version: Any = (await conn.execute(sa.text("SELECT version_num FROM alembic_version"))).scalar()
    await engine.dispose()
    assert version == "0015", "the refused downgrade changed nothing"
