"""Downgrades work with data on both databases, or are refused before anything changes.

A downgrade runs in one transaction (SQLite's too) and never drops data the database holds:
what each revision's downgrade drops is declared in ``signoff.migrations.history.DROPS``,
checked here against the downgrades themselves.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from signoff.app.config import SignoffConfig
from signoff.app.db import SchemaError, create_engine, downgrade, head_revision, migrate, revisions
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.migrations.history import DROPS
from tests.conftest import ADMIN_TOKEN, Server
from tests.migrations import released
from tests.migrations.released import APPROVED, PENDING, TOKEN

AGENT = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.postgres  # migrations: both databases


async def _schema(url: str) -> dict[str, Any]:
    """The revision, each table's columns and row count: what a refused downgrade must keep."""
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:

            def read(c: sa.Connection) -> dict[str, Any]:
                inspector = sa.inspect(c)
                tables = sorted(t for t in inspector.get_table_names() if t != "alembic_version")
                return {
                    "revision": c.execute(sa.text("SELECT version_num FROM alembic_version")).scalar(),
                    "columns": {t: sorted(col["name"] for col in inspector.get_columns(t)) for t in tables},
                    "rows": {t: c.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar() for t in tables},
                }

            return await conn.run_sync(read)
    finally:
        await engine.dispose()


def _names(schema: dict[str, Any]) -> set[str]:
    return set(schema["columns"]) | {f"{t}.{c}" for t, cols in schema["columns"].items() for c in cols}


def _dropped(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    gone = _names(before) - _names(after)
    # A table's own columns go with it.
    return {n for n in gone if "." not in n or n.split(".")[0] not in gone}


async def test_each_downgrade_drops_what_it_declares(empty_url: str) -> None:
    await asyncio.to_thread(migrate, empty_url)
    chain = ["base", *revisions()]
    for below, revision in reversed(list(itertools.pairwise(chain))):
        before = await _schema(empty_url)
        assert await asyncio.to_thread(downgrade, empty_url, below) == (None if below == "base" else below)
        after = await _schema(empty_url) if below != "base" else {"columns": {}}
        assert _dropped(before, after) == {d.name for d in DROPS[revision]}, revision


async def _serves_old_rows(url: str, config: SignoffConfig) -> None:
    runtime = Runtime.create(Settings(database_url=url, admin_token=ADMIN_TOKEN), config)  # type: ignore[arg-type]
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            for rid, status in ((PENDING, "pending"), (APPROVED, "approved")):
                got = await http.get(f"/v1/requests/{rid}", headers=AGENT)
                assert got.json()["status"] == status, got.text
    finally:
        await runtime.aclose()


async def test_rows_older_than_a_revision_survive_its_downgrade_and_the_way_back(
    empty_url: str, tmp_path: Any, config: SignoffConfig
) -> None:
    await asyncio.to_thread(released.make_database, empty_url, "0005", tmp_path)
    await asyncio.to_thread(released.write_rows, empty_url)
    await asyncio.to_thread(migrate, empty_url)
    held = (await _schema(empty_url))["rows"]
    for target in reversed(revisions()[:-1]):
        assert await asyncio.to_thread(downgrade, empty_url, target) == target
        now = await _schema(empty_url)
        # Below 0015 the log has one chain head again (0015 made the others, empty).
        kept = {**held, "audit_head": 1} if target < "0015" else held
        assert {t: n for t, n in kept.items() if t in now["rows"]} == now["rows"], target
    assert await asyncio.to_thread(migrate, empty_url) == head_revision()
    assert (await _schema(empty_url))["rows"] == held
    await _serves_old_rows(empty_url, config)


async def test_a_downgrade_that_would_drop_data_is_refused_and_changes_nothing(
    empty_url: str, tmp_path: Any, config: SignoffConfig
) -> None:
    await asyncio.to_thread(released.make_database, empty_url, "0010", tmp_path)
    await asyncio.to_thread(released.write_rows, empty_url)  # its requests name their gates
    await asyncio.to_thread(migrate, empty_url)
    before = await _schema(empty_url)

    for target in ("0005", "0001", "base"):
        with pytest.raises(SchemaError) as refused:
            await asyncio.to_thread(downgrade, empty_url, target)
        assert f"refused to downgrade to {target}" in str(refused.value)
        assert "confirmation_request.gates (2 rows, revision 0006)" in str(refused.value)
        assert "nothing was changed" in str(refused.value)
        assert await _schema(empty_url) == before

    # Down to where the rows lose nothing, it works.
    assert await asyncio.to_thread(downgrade, empty_url, "0006") == "0006"
    assert await asyncio.to_thread(migrate, empty_url) == head_revision()
    await _serves_old_rows(empty_url, config)


async def test_an_approval_with_changes_is_never_downgraded_away(empty_url: str, tmp_path: Any) -> None:
    await asyncio.to_thread(migrate, empty_url)
    await asyncio.to_thread(released.write_rows, empty_url)
    engine = create_engine(empty_url)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text("UPDATE confirmation_request SET approved_arguments = :a WHERE id = :id"),
            {"a": '{"amount": 50000}', "id": APPROVED},
        )
    await engine.dispose()
    lost = r"confirmation_request\.approved_arguments \(1 row, revision 0008\)"
    with pytest.raises(SchemaError, match=lost):
        await asyncio.to_thread(downgrade, empty_url, "0007")
    assert await asyncio.to_thread(downgrade, empty_url, "0008") == "0008"
