"""``signoff db backup PATH`` while a real ``signoff serve`` writes: the copy is one commit's
state of the database (its audit chain intact), and every request in it reads back whole. On
PostgreSQL it prints the ``pg_dump`` line, which restores into a new database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from signoff.app.db import create_engine, sessionmaker
from signoff.app.queries import RequestFilter, list_requests, request_out
from tests.app.serving import environment, serve, signoff
from tests.conftest import PG_URL

DEADLINE_SECONDS = 120


class Writer(threading.Thread):
    """Creates pending requests through the server, one after another, until stopped."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.created = 0
        self.failures: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.halt.is_set():
                call = {
                    "tool_name": "pay_vendor",
                    "arguments": {"amount": 60000 + self.created, "memo": "x" * 200},
                    "session_id": "s-backup",
                    "tool_call_id": f"call-{self.created}",
                }
                answer = http.post(
                    "/v1/hooks/pre-tool-use", json=call, headers={"Authorization": f"Bearer {self.key}"}
                )
                if answer.status_code != 200 or answer.json().get("decision") != "pending":
                    self.failures.append(answer.text)
                    return
                self.created += 1

    def until(self, count: int) -> None:
        deadline = threading.Event()
        timer = threading.Timer(DEADLINE_SECONDS, deadline.set)
        timer.start()
        try:
            while self.created < count and not deadline.is_set() and not self.failures:
                self.halt.wait(0.02)
        finally:
            timer.cancel()
        assert not self.failures, self.failures
        assert self.created >= count, f"only {self.created} requests written"


async def _read_all(url: str) -> int:
    """Read every request of ``url`` as the API shows it (votes, gates, arguments)."""
    engine = create_engine(url, readonly=True)
    try:
        async with sessionmaker(engine)() as session:
            rows = await list_requests(session, RequestFilter(), limit=1_000_000)
            for row in rows:
                shown = await request_out(session, row)
                assert shown.id == row.id
                assert shown.tool_name == "pay_vendor"
                assert shown.arguments["amount"] >= 60000
            return len(rows)
    finally:
        await engine.dispose()


def test_a_backup_taken_while_the_server_writes_is_whole(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    env = environment(tmp_path, f"sqlite:///{db}")
    assert signoff(env, "db", "upgrade").returncode == 0
    made = signoff(env, "keys", "create", "finance-bot")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]

    with serve(env, tmp_path / "serve.log") as served:
        writer = Writer(served.url, key)
        writer.start()
        try:
            writer.until(30)
            copies = []
            for n in range(2):
                before = writer.created
                target = tmp_path / f"backup-{n}.db"
                done = signoff(env, "db", "backup", str(target))
                assert done.returncode == 0, done.stderr
                assert done.stdout.startswith(f"backed up {db} to {target}: "), done.stdout
                copies.append((target, before))
            # Writes went on after the last copy: the copies were taken while the server wrote.
            writer.until(copies[-1][1] + 20)
        finally:
            writer.halt.set()
            writer.join(DEADLINE_SECONDS)
        assert not writer.failures, writer.failures

    for target, before in copies:
        assert not Path(f"{target}-wal").exists()  # one self-contained file
        with contextlib.closing(sqlite3.connect(target)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        read = asyncio.run(_read_all(f"sqlite:///{target}"))
        # Every request answered before the backup began is in it.
        assert read >= before, (read, before)
        backup_env = {**env, "SIGNOFF_DATABASE_URL": f"sqlite:///{target}"}
        verified = signoff(backup_env, "audit", "verify")
        assert verified.returncode == 0, verified.stderr
        assert verified.stdout.startswith("audit chain intact: ")
        listed = signoff(backup_env, "requests", "list", "--limit", "100000")
        assert listed.returncode == 0, listed.stderr
        assert len(listed.stdout.splitlines()) == read + 1  # the header


def test_a_backup_never_overwrites_and_names_a_missing_database(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    env = environment(tmp_path, f"sqlite:///{db}")
    missing = signoff(env, "db", "backup", str(tmp_path / "copy.db"))
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"error: there is no SQLite database at {db}: ")
    assert not db.exists()  # looking did not create one
    assert signoff(env, "db", "upgrade").returncode == 0
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"keep me")
    refused = signoff(env, "db", "backup", str(taken))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: {taken} exists: name a new file (a backup never overwrites one)"
    ]
    assert taken.read_bytes() == b"keep me"


@pytest.mark.postgres
def test_on_postgresql_the_printed_pg_dump_line_restores(tmp_path: Path, postgres_url: str) -> None:
    env = environment(tmp_path, postgres_url)
    target = tmp_path / "signoff.dump"
    done = signoff(env, "db", "backup", str(target))
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("pg_dump --format=custom --no-owner --file=")
    assert "pg_restore" in done.stderr
    subprocess.run(line, shell=True, check=True, timeout=120)  # the line as an operator pastes it
    name = f"signoff_backup_restore_{os.getpid()}"
    restored = PG_URL.rsplit("/", 1)[0] + f"/{name}"
    admin = PG_URL.rsplit("/", 1)[0] + "/postgres"
    subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {name}"], check=True)
    subprocess.run(["psql", admin, "-qc", f"CREATE DATABASE {name}"], check=True)
    try:
        subprocess.run(
            ["pg_restore", "--no-owner", f"--dbname={restored}", str(target)], check=True, timeout=120
        )
        verified = signoff({**env, "SIGNOFF_DATABASE_URL": restored}, "audit", "verify")
        assert verified.returncode == 0, verified.stderr
        assert verified.stdout.startswith("audit chain intact: ")
    finally:
        subprocess.run(["psql", admin, "-qc", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"], check=True)
