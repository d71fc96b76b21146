"""``signoff serve`` and the command line behind a real PgBouncer in transaction pooling.

PgBouncer is Debian's package (``make pgbouncer``, part of ``make test``), started here on a
free loopback port in front of the tests' PostgreSQL (``auth_type = any``: no passwords),
with a small server pool so that clients share server connections all the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from tests.app.serving import SIGNOFF, environment, serve, signoff
from tests.conftest import free_port

pytestmark = pytest.mark.postgres

PGBOUNCER = Path(os.environ.get("SIGNOFF_TEST_PGBOUNCER", "/usr/sbin/pgbouncer"))


@dataclass
class PgBouncer:
    port: int
    folder: Path
    target_port: int
    process: subprocess.Popen[bytes] | None = None
    pool_size: int = 4
    """Server connections per database and user (``default_pool_size``)."""

    def url(self, direct: str) -> str:
        """``direct`` (a database on the tests' PostgreSQL) through this PgBouncer."""
        return make_url(direct).set(port=self.port).render_as_string(hide_password=False)

    def log(self) -> str:
        return (self.folder / "pgbouncer.log").read_text(errors="replace")

    def start(self) -> None:
        ini = self.folder / "pgbouncer.ini"
        ini.write_text(
            f"""[databases]
* = host=127.0.0.1 port={self.target_port} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 1000
server_login_retry = 1
query_wait_timeout = 2
ignore_startup_parameters = extra_float_digits
""",
            encoding="utf-8",
        )
        ini.chmod(0o644)
        # PgBouncer refuses to run as root: it drops to nobody, who reads the file above.
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with (self.folder / "pgbouncer.log").open("ab") as out:
            self.process = subprocess.Popen(
                [str(PGBOUNCER), *user, str(ini)], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"pgbouncer exited ({self.process.returncode}):\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
                return
            time.sleep(0.05)
        raise AssertionError(f"pgbouncer did not listen on {self.port}:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@pytest.fixture
def pgbouncer(postgres_empty_url: str) -> Iterator[PgBouncer]:
    if not PGBOUNCER.exists():
        pytest.fail(
            f"{PGBOUNCER} is not installed: `make test` installs it (or apt-get install -y pgbouncer)"
        )
    folder = Path(tempfile.mkdtemp(prefix="signoff-pgbouncer-"))
    folder.chmod(0o755)
    bouncer = PgBouncer(free_port(), folder, make_url(postgres_empty_url).port or 5432)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _pooled_env(tmp_path: Path, direct: str, bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    return environment(
        tmp_path,
        bouncer.url(direct),
        SIGNOFF_DATABASE_POOLING="transaction",
        # Long enough that only LISTEN/NOTIFY wakes a waiter in time.
        SIGNOFF_CROSS_PROCESS_POLL_SECONDS="30",
        **extra,
    )


def _key(env: dict[str, str]) -> str:
    upgraded = signoff(env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    created = signoff(env, "keys", "create", "finance-bot")
    assert created.returncode == 0, created.stderr
    return created.stdout.strip().splitlines()[-1]


def test_serve_refuses_a_transaction_pooler_the_settings_do_not_declare(
    postgres_empty_url: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    env = environment(tmp_path, pgbouncer.url(postgres_empty_url))
    done = subprocess.run(
        [str(SIGNOFF), "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    where = make_url(pgbouncer.url(postgres_empty_url)).render_as_string(hide_password=True)
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"error: SIGNOFF_DATABASE_URL ({where}) reaches PostgreSQL through a transaction pooler such as "
        "PgBouncer (two open connections ran on one server process, "
    ), done.stderr
    assert line.endswith(
        "set SIGNOFF_DATABASE_POOLING=transaction, and SIGNOFF_LISTEN_DATABASE_URL to PostgreSQL itself"
    )


async def test_keys_concurrent_creates_and_a_fast_wake_through_pgbouncer(
    postgres_empty_url: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    env = _pooled_env(tmp_path, postgres_empty_url, pgbouncer, SIGNOFF_LISTEN_DATABASE_URL=postgres_empty_url)
    key = _key(env)
    agent = {"Authorization": f"Bearer {key}"}
    with serve(env, tmp_path / "serve.log", args=("--no-migrate",)) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=60, headers=agent) as http:

            async def create(i: int) -> httpx.Response:
                return await http.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": "pay_invoice", "arguments": {"amount": 60000 + i}},
                )

            # Forty at once, over and over, on a server pool of four: every statement shares
            # server connections with other clients' statements.
            answers: list[httpx.Response] = []
            for round_ in range(3):
                answers += await asyncio.gather(*(create(round_ * 40 + i) for i in range(40)))
            statuses = [a.status_code for a in answers]
            assert statuses == [200] * len(answers), [a.text for a in answers if a.status_code != 200][:3]
            ids = {a.json()["request_id"] for a in answers}
            assert len(ids) == len(answers)
            assert {a.json()["decision"] for a in answers} == {"pending"}

            # A decision made by another process (the command line, through PgBouncer) wakes a
            # waiter here through the direct LISTEN, not the 30 s poll.
            rid = answers[0].json()["request_id"]
            waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait", params={"timeout": 25}))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            approve = await asyncio.create_subprocess_exec(
                str(SIGNOFF),
                *("requests", "approve", rid, "--as", "alice"),
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await approve.communicate()
            assert approve.returncode == 0, err
            decided_at = time.monotonic()
            result = await asyncio.wait_for(waiter, 25)
            woken_after = time.monotonic() - decided_at
    assert result.status_code == 200
    assert result.json()["status"] == "approved"
    assert woken_after < 2, f"woken {woken_after:.2f} s after the decision: no NOTIFY (the poll is 30 s)"
    log = served.output()
    assert "(heard its own NOTIFY)" in log, log
    assert "Traceback" not in log, log


def test_without_a_direct_listen_url_the_log_says_wakes_fall_back_to_the_poll(
    postgres_empty_url: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    env = _pooled_env(tmp_path, postgres_empty_url, pgbouncer)
    _key(env)
    with serve(env, tmp_path / "unset.log", args=("--no-migrate",)) as served:
        pass
    fallback = [ln for ln in served.output().splitlines() if "wake waiters only by the 30 s poll" in ln]
    assert len(fallback) == 1, served.output()
    assert fallback[0].endswith(
        "SIGNOFF_DATABASE_POOLING=transaction and no SIGNOFF_LISTEN_DATABASE_URL (LISTEN needs a "
        "session of its own); set it to PostgreSQL itself"
    )

    # LISTEN through the pooler: it hears nothing, and says so.
    env["SIGNOFF_LISTEN_DATABASE_URL"] = pgbouncer.url(postgres_empty_url)
    with serve(env, tmp_path / "pooled.log", args=("--no-migrate",)) as served:
        deadline = time.monotonic() + 30
        while "heard no NOTIFY" not in served.output() and time.monotonic() < deadline:
            time.sleep(0.2)
    unheard = [ln for ln in served.output().splitlines() if "heard no NOTIFY" in ln]
    assert len(unheard) == 1, served.output()
    assert "decisions made by other processes wake waiters only by the 30 s poll: the LISTEN" in unheard[0]
    assert "point SIGNOFF_LISTEN_DATABASE_URL at PostgreSQL itself, not a transaction pooler" in unheard[0]
    assert "listening for decisions on" not in served.output()


async def _call_until(http: httpx.AsyncClient, status: int, deadline: float) -> httpx.Response:
    answer = await http.post("/v1/hooks/pre-tool-use", json={"tool_name": "read_ledger", "arguments": {}})
    while answer.status_code != status and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        answer = await http.post("/v1/hooks/pre-tool-use", json={"tool_name": "read_ledger", "arguments": {}})
    return answer


async def test_a_valid_key_while_the_database_fails_is_503_never_401(
    postgres_empty_url: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    env = _pooled_env(
        tmp_path,
        postgres_empty_url,
        pgbouncer,
        SIGNOFF_LISTEN_DATABASE_URL=postgres_empty_url,
    )
    key = _key(env)
    with serve(env, tmp_path / "serve.log", args=("--no-migrate",)) as served:
        async with httpx.AsyncClient(
            base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
        ) as http:
            allowed = await http.post(
                "/v1/hooks/pre-tool-use", json={"tool_name": "read_ledger", "arguments": {}}
            )
            assert allowed.status_code == 200, allowed.text
            assert allowed.json()["decision"] == "allow"
            seen: list[int] = []

            # 1. PgBouncer itself is gone: connections are refused.
            pgbouncer.stop()
            await asyncio.sleep(2.5)  # past the key's cache (signoff.app.keys.CACHE_SECONDS)
            for _ in range(5):
                down = await http.post(
                    "/v1/hooks/pre-tool-use", json={"tool_name": "read_ledger", "arguments": {}}
                )
                seen.append(down.status_code)
            assert down.status_code == 503, down.text
            assert down.headers["Retry-After"] == "1"
            assert down.json()["detail"].startswith("the database is unavailable")

            # 2. PgBouncer answers, but the PostgreSQL behind it cannot be reached: the database
            # errors come from PgBouncer's own words ("cannot connect to server").
            pgbouncer.target_port = free_port()
            pgbouncer.start()
            await asyncio.sleep(2.5)
            for _ in range(5):
                failing = await http.post(
                    "/v1/hooks/pre-tool-use", json={"tool_name": "read_ledger", "arguments": {}}
                )
                seen.append(failing.status_code)
            assert failing.status_code == 503, failing.text
            assert failing.json()["detail"].startswith("the database is unavailable")
            ready = await http.get("/readyz")
            assert ready.status_code == 503

            # 3. Back: the same key works again.
            pgbouncer.stop()
            pgbouncer.target_port = make_url(postgres_empty_url).port or 5432
            pgbouncer.start()
            back = await _call_until(http, 200, time.monotonic() + 30)
            assert back.status_code == 200, back.text
    assert 401 not in seen, seen
    assert set(seen) == {503}, seen
    assert "Traceback" not in served.output(), served.output()


async def test_the_command_line_through_an_undeclared_pooler_says_what_to_set(
    postgres_empty_url: str, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    upgraded = signoff(environment(tmp_path, postgres_empty_url), "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    # Another client of the pooler leaves its prepared statements (asyncpg's own names) on
    # PgBouncer's one server connection (one: the command line is given that same one).
    pgbouncer.stop()
    pgbouncer.pool_size = 1
    pgbouncer.start()
    # asyncpg numbers its statements per process: a client started as the command line is
    # (a process of its own) names them as the command line will.
    script = (
        "import asyncio, asyncpg, sys\n"
        "async def main():\n"
        "    c = await asyncpg.connect(sys.argv[1])\n"
        "    for i in range(30):\n"
        "        assert await c.fetchval(f'SELECT {i}::int + $1::int', 1) == i + 1\n"
        "    await c.close()\n"
        "asyncio.run(main())\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, pgbouncer.url(postgres_empty_url)], capture_output=True, text=True
    )
    assert other.returncode == 0, other.stderr
    done = signoff(environment(tmp_path, pgbouncer.url(postgres_empty_url)), "keys", "create", "finance-bot")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "error: the database's prepared statements did not last (a transaction pooler such as "
        "PgBouncer in front of it?): set SIGNOFF_DATABASE_POOLING=transaction (the database at "
    ), done.stderr
    assert done.stderr.count("\n") == 1
    assert (
        signoff(
            _pooled_env(tmp_path, postgres_empty_url, pgbouncer), "keys", "create", "finance-bot"
        ).returncode
        == 0
    )
