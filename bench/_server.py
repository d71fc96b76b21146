"""Real server processes for the benchmarks: ``signoff serve`` on a scratch database, and baselines."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PG_BASE = os.environ.get("SIGNOFF_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/signoff_bench")

CONFIG = """
people:
  alice: {name: Alice, web: alice}
agents:
  bench-agent:
    hooks:
      - type: confirmation_gate
        tools: ["pay_*"]
        when: "args.amount >= 50000"
        channel: web
        approvers: [alice]
        timeout: 30m
"""

SLACK_SECRET = "bench-signing-secret"
SLACK_CHANNEL = """
channels:
  bench-slack:
    type: slack
    bot_token: xoxb-test-bot-token
    signing_secret: bench-signing-secret
    channel: C0SIGNOFF
    base_url: {base_url}
"""
SLACK_GATE = """
      - type: confirmation_gate
        tools: ["slack_*"]
        channel: bench-slack
        approvers: [alice]
        timeout: 30m
"""


def config_with_slack(base_url: str) -> str:
    """CONFIG plus a Slack channel (at ``base_url``) and a gate on ``slack_*`` tools that uses it."""
    people = CONFIG.replace(
        "alice: {name: Alice, web: alice}", "alice: {name: Alice, web: alice, slack: W0ALICE}"
    )
    return SLACK_CHANNEL.format(base_url=base_url) + people.rstrip() + SLACK_GATE


@contextlib.contextmanager
def fake_slack() -> Iterator[str]:
    """The tests' fake Slack Web API in a process of its own; yields its ``base_url``."""
    with tempfile.TemporaryDirectory(prefix="signoff-fake-slack-") as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fake_slack_server", "--port-file", str(port_file)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the fake Slack did not start")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port_file.read_text().strip()}/api/"
        finally:
            stop(proc)


# What the load generator sends: a call that needs a person, and one no gate matches
# (the tool matches the gate's pattern, its condition is false: the CEL runs too).
PENDING_BODY = (
    '{"tool_name": "pay_invoice", "arguments": {"amount": 120000, "to": "ACME GmbH", '
    '"iban": "DE02120300000000202051"}, "session_id": "bench", "idempotency_key": "bench-%N%"}'
)
ALLOW_BODY = (
    '{"tool_name": "pay_invoice", "arguments": {"amount": 12, "to": "ACME GmbH", '
    '"iban": "DE02120300000000202051"}, "session_id": "bench"}'
)
INSERT_BODY = PENDING_BODY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-d", "postgres", "-c", sql],
        check=True,
        capture_output=True,
    )


def pg_url(name: str) -> str:
    return PG_BASE.rsplit("/", 1)[0] + "/" + name


def fresh_pg_database(name: str) -> str:
    psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    psql(f'CREATE DATABASE "{name}"')
    return pg_url(name)


def drop_pg_database(name: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Signoff:
    """A scratch database with Signoff's schema, an agent key, and (when started) a server on it."""

    db: str
    database_url: str
    env: dict[str, str]
    key: str
    admin: str
    tmp: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def agent_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "signoff.app.cli", *args],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        return out.stdout

    def start(self, *, migrate: bool = False, wait: bool = True) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "signoff.app.cli", "serve", "--port", str(self.port)]
        if not migrate:
            args.append("--no-migrate")
        self.log = self.tmp / f"server-{self.port}-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        if wait:
            wait_http(f"{self.url}/readyz", self.proc)
        return self.proc

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None:
            stop(self.proc, kill=kill)
            self.proc = None

    def rss_mib(self) -> float:
        assert self.proc is not None
        return rss_mib(self.proc.pid)


@contextlib.contextmanager
def signoff_database(
    db: str, *, config: str = CONFIG, name: str = "signoff_bench", extra_env: dict[str, str] | None = None
) -> Iterator[Signoff]:
    """A migrated scratch database and an agent key for ``bench-agent`` (no server yet)."""
    with tempfile.TemporaryDirectory(prefix="signoff-bench-") as tmp_name:
        tmp = Path(tmp_name)
        cfg = tmp / "signoff.yaml"
        cfg.write_text(config)
        admin = secrets.token_urlsafe(32)
        url = f"sqlite:///{tmp}/{name}.db" if db == "sqlite" else fresh_pg_database(name)
        env = {
            **os.environ,
            "SIGNOFF_CONFIG": str(cfg),
            "SIGNOFF_DATABASE_URL": url,
            "SIGNOFF_ADMIN_TOKEN": admin,
            **(extra_env or {}),
        }
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env.pop(var, None)
        s = Signoff(db, url, env, "", admin, tmp)
        try:
            s.cli("db", "upgrade")
            s.key = s.cli("keys", "create", "bench-agent").strip().splitlines()[-1]
            yield s
        finally:
            s.stop()
            if db == "postgres":
                drop_pg_database(name)


@contextlib.contextmanager
def running_server(db: str, **kw: object) -> Iterator[Signoff]:
    """``signoff serve`` on a fresh scratch database, ready."""
    with signoff_database(db, **kw) as s:  # type: ignore[arg-type]
        s.start()
        yield s


@contextlib.contextmanager
def baseline(kind: str, database: str = "") -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A bare baseline app (``bench.baselines``) under uvicorn; yields (base url, process)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.baselines", kind, "--port", str(port), "--database", database],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/docs", proc)
        yield url, proc
    finally:
        stop(proc)
