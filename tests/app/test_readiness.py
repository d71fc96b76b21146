"""``/readyz`` tells the truth about a real ``signoff serve``, and agents' 503s name the same
reason: a schema behind the code (from the start, or moved under the running server), a
database that cannot be written, a full disk. ``/healthz``, the OpenAPI schema and
``signoff --version`` name the release."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from signoff.app.audit import Actor
from signoff.app.db import (
    create_engine,
    downgrade,
    head_revision,
    is_sqlite,
    migrate,
    sessionmaker,
    transaction,
)
from signoff.app.keys import create_key
from signoff.app.readiness import DISK_FULL, READ_ONLY, SCHEMA_BEHIND
from tests.app.serving import Served, environment, serve, signoff
from tests.conftest import ADMIN_TOKEN
from tests.migrations import released

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GATED = {"tool_name": "pay_invoice", "arguments": {"amount": 60000}}


def _key(url: str) -> dict[str, str]:
    async def make() -> str:
        engine = create_engine(url)
        try:
            async with transaction(sessionmaker(engine)) as session:
                _, token = await create_key(session, "finance-bot", actor=Actor("test"))
            return token
        finally:
            await engine.dispose()

    return {"Authorization": f"Bearer {asyncio.run(make())}"}


def _sql(url: str, *statements: str) -> None:
    async def run() -> None:
        engine = create_engine(url)
        try:
            async with engine.begin() as conn:
                for statement in statements:
                    await conn.execute(sa.text(statement))
        finally:
            await engine.dispose()

    asyncio.run(run())


def _ready(served: Served) -> httpx.Response:
    return httpx.get(f"{served.url}/readyz", timeout=30)


def _unready(served: Served, reason: str) -> None:
    answer = _ready(served)
    assert answer.status_code == 503, answer.text
    assert reason in answer.json()["reason"], answer.text
    assert answer.headers["retry-after"]


def _agent_refused(served: Served, agent: dict[str, str], reason: str) -> None:
    """A gated call answers 503 naming ``reason``, with Retry-After (a retry may first meet
    the cached statement the change invalidated: the client retries as it would)."""
    for _ in range(3):
        answer = httpx.post(f"{served.url}/v1/hooks/pre-tool-use", json=GATED, headers=agent, timeout=30)
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"]
        if answer.json()["detail"] == reason:
            return
    raise AssertionError(f"{answer.text} does not name {reason!r}")


def _asks(served: Served, agent: dict[str, str]) -> None:
    answer = httpx.post(f"{served.url}/v1/hooks/pre-tool-use", json=GATED, headers=agent, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"] == "pending"


def test_the_release_is_named_everywhere(tmp_path: Path) -> None:
    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}")
    assert signoff(env, "--version").stdout.strip() == f"signoff {release}"
    with serve(env, tmp_path / "serve.log") as served:
        assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok", "version": release}
        assert httpx.get(f"{served.url}/openapi.json").json()["info"]["version"] == release
        assert _ready(served).json() == {"status": "ready", "version": release, "revision": head_revision()}


@pytest.mark.postgres
def test_a_schema_behind_the_code_is_named_until_upgraded(empty_url: str, tmp_path: Path) -> None:
    # As the issue found it: made by the first release, then upgraded to 0010 by later code.
    released.make_database(empty_url, "0001@3502eac", tmp_path)
    migrate(empty_url, "0010")
    released.write_rows(empty_url)  # an agent's key as that schema holds it
    agent = {"Authorization": f"Bearer {released.TOKEN}"}
    env = environment(tmp_path, empty_url)
    with serve(env, tmp_path / "serve.log", args=("--no-migrate",)) as served:
        _unready(served, SCHEMA_BEHIND)
        _agent_refused(served, agent, SCHEMA_BEHIND)
        assert signoff(env, "db", "upgrade").returncode == 0
        assert _ready(served).status_code == 200
        _asks(served, agent)

        # A schema moved back under the running server: the first failing call reads it again.
        # The audit chains by their own downgrade (it relinks the events into one chain), the
        # revisions before them by hand.
        assert downgrade(empty_url, "0014") == "0014"
        _sql(
            empty_url,
            "ALTER TABLE confirmation_request DROP COLUMN call_digest",
            "ALTER TABLE confirmation_request DROP COLUMN config_version",  # 0012's
            "ALTER TABLE confirmation_request DROP COLUMN action_digest",  # 0013's
            "ALTER TABLE confirmation_request DROP COLUMN receipt",
            "ALTER TABLE confirmation_request DROP COLUMN execution_receipt",
            "DROP TABLE receipt_key",
            "ALTER TABLE vote DROP COLUMN assurance",  # 0014's
            "UPDATE alembic_version SET version_num = '0010'",
        )
        _agent_refused(served, agent, SCHEMA_BEHIND)
        _unready(served, SCHEMA_BEHIND)
        assert signoff(env, "db", "upgrade").returncode == 0
        assert _ready(served).status_code == 200
        _asks(served, agent)
    assert "Traceback" not in served.output()


def _pg(url: str, statement: str) -> None:
    u = make_url(url)

    async def run() -> None:
        conn = await asyncpg.connect(user=u.username or "postgres", host=u.host, port=u.port or 5432)
        try:
            await conn.execute(statement.format(database=f'"{u.database}"'))
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.mark.postgres
def test_a_database_that_cannot_be_written_is_named(empty_url: str, tmp_path: Path) -> None:
    migrate(empty_url)
    agent = _key(empty_url)
    env = environment(tmp_path, empty_url)
    mounts = ""
    if is_sqlite(empty_url):
        db = make_url(empty_url).database
        mounts = f"mount --bind {db} {db}\nmount -o remount,ro,bind {db}"  # the file read-only
    else:
        _pg(empty_url, "ALTER DATABASE {database} SET default_transaction_read_only = on")
    with serve(env, tmp_path / "serve.log", mounts=mounts) as served:
        _unready(served, READ_ONLY)
        _agent_refused(served, agent, READ_ONLY)
        # Reads still answer.
        assert httpx.get(f"{served.url}/v1/admin/requests", headers=ADMIN).status_code == 200


def _fill(path: Path) -> None:
    """Write ``path`` until its disk is full."""
    with path.open("wb", buffering=0) as out, pytest.raises(OSError, match="No space left"):  # noqa: PT012
        while True:
            out.write(b"\0" * 65536)


PG_DISK_FULL = (
    "CREATE FUNCTION disk_is_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
    "'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$"
)


@pytest.mark.postgres
def test_a_full_disk_is_named_until_there_is_room(empty_url: str, tmp_path: Path) -> None:
    if is_sqlite(empty_url):
        seed = tmp_path / "seed.db"
        migrate(f"sqlite:///{seed}")
        agent = _key(f"sqlite:///{seed}")
        disk = tmp_path / "disk"
        disk.mkdir()
        url = f"sqlite:///{disk / 'signoff.db'}"
        mounts = f"mount -t tmpfs -o size=8m tmpfs {disk}\ncp {seed} {disk}/signoff.db"
    else:
        # PostgreSQL's own disk is the database server's: its "disk full" error stands in.
        migrate(empty_url)
        agent = _key(empty_url)
        url, mounts, disk = empty_url, "", None
    env = environment(tmp_path, url)
    with serve(env, tmp_path / "serve.log", mounts=mounts) as served:
        _asks(served, agent)
        if disk is not None:
            fill = served.root() / str(disk).lstrip("/") / "fill"
            _fill(fill)
            _unready(served, DISK_FULL)
            _agent_refused(served, agent, DISK_FULL)
            fill.unlink()
        else:
            _sql(
                url,
                PG_DISK_FULL,
                "CREATE TRIGGER disk_is_full BEFORE INSERT ON confirmation_request "
                "FOR EACH ROW EXECUTE FUNCTION disk_is_full()",
            )
            _agent_refused(served, agent, DISK_FULL)
            _sql(url, "DROP TRIGGER disk_is_full ON confirmation_request")
        assert _ready(served).status_code == 200
        _asks(served, agent)
    assert "Traceback" not in served.output()
