"""Revision 0014 (vote assurance) gives the votes recorded before it the level their stored
identity shows, and null (not known) where it shows none; a downgrade keeps each level in the
vote's identity, from where the upgrade takes it again."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from signoff.app.db import create_engine, downgrade, migrate
from signoff.app.models import utcnow
from tests.conftest import PG_URL, _drop_pg_database, _ensure_pg_database

pytestmark = pytest.mark.postgres
_AT = sa.DateTime()

IDENTITIES = {
    "cli": ({"via": "cli"}, "cli_local"),
    "api": ({"via": "api"}, "admin_token"),
    "console": ({"via": "console"}, "console_password"),
    "mail": ({"link": "approve"}, "email_link"),
    "feishu": ({"open_id": "ou_a", "union_id": "on_a"}, "feishu_signed"),
    "slack": ({"user_id": "U0A", "team_id": "T0A"}, "slack_signed"),
    "fake": ({}, None),
    "other": ({"via": "somewhere-new"}, None),
}


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_0014_{os.getpid()}").render_as_string(hide_password=False)
    _drop_pg_database(url)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)


async def _write_as_0012(url: str) -> None:
    now = utcnow().replace(tzinfo=None)
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO confirmation_request (id, agent_id, tool_name, arguments, call_digest, "
                "request_metadata, gates, channel, status, created_at, expires_at) VALUES ('r1', "
                "'finance-bot', 'wire_money', '{}', '', '{}', '[]', 'chat', 'pending', :now, :expires)"
            ).bindparams(sa.bindparam("now", type_=_AT), sa.bindparam("expires", type_=_AT)),
            {"now": now, "expires": now + timedelta(minutes=30)},
        )
        for voter, (identity, _) in IDENTITIES.items():
            await conn.execute(
                sa.text(
                    "INSERT INTO vote (request_id, gate, voter, verdict, channel, user_id, identity, "
                    "created_at) VALUES ('r1', 0, :voter, 'approve', 'chat', :voter, :identity, :now)"
                ).bindparams(sa.bindparam("now", type_=sa.DateTime())),
                {"voter": voter, "identity": json.dumps(identity), "now": now},
            )
    await engine.dispose()


async def _levels(url: str) -> dict[str, str | None]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.text("SELECT voter, assurance FROM vote"))).all()
    finally:
        await engine.dispose()
    return {str(voter): level for voter, level in rows}


async def _columns(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set(
                await conn.run_sync(lambda c: {col["name"] for col in sa.inspect(c).get_columns("vote")})
            )
    finally:
        await engine.dispose()


def test_votes_before_0014_get_the_level_their_identity_shows_or_null(fresh_url: str) -> None:
    migrate(fresh_url, "0012")
    asyncio.run(_write_as_0012(fresh_url))
    migrate(fresh_url, "0014")
    assert asyncio.run(_levels(fresh_url)) == {voter: level for voter, (_, level) in IDENTITIES.items()}

    asyncio.run(_set_level(fresh_url, "fake", "oidc"))  # as a server of 0014 records one
    expected = {voter: level for voter, (_, level) in IDENTITIES.items()} | {"fake": "oidc"}
    downgrade(fresh_url, "0013")
    assert "assurance" not in asyncio.run(_columns(fresh_url))
    assert migrate(fresh_url) is not None
    assert asyncio.run(_levels(fresh_url)) == expected


async def _set_level(url: str, voter: str, level: str) -> None:
    engine = create_engine(url)
    async with engine.begin() as conn:
        await conn.execute(
            sa.text("UPDATE vote SET assurance = :level WHERE voter = :voter"),
            {"level": level, "voter": voter},
        )
    await engine.dispose()
