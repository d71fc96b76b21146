"""Start a real ``signoff serve`` process on a scratch database for a benchmark."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("SIGNOFF_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/signoff_bench")

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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(db: str) -> Iterator[tuple[str, str, str]]:
    """Yields (base url, agent key, admin token)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "signoff.yaml"
        cfg.write_text(CONFIG)
        admin = secrets.token_urlsafe(16)
        url = f"sqlite:///{tmp}/bench.db" if db == "sqlite" else PG
        env = {
            **os.environ,
            "SIGNOFF_CONFIG": str(cfg),
            "SIGNOFF_DATABASE_URL": url,
            "SIGNOFF_ADMIN_TOKEN": admin,
        }
        signoff = [sys.executable, "-m", "app.cli"]
        if db == "postgres":
            psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q"]
            subprocess.run([*psql, "-c", "DROP DATABASE IF EXISTS signoff_bench WITH (FORCE)"], check=True)
            subprocess.run([*psql, "-c", "CREATE DATABASE signoff_bench"], check=True)
        subprocess.run([*signoff, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=ROOT)
        out = subprocess.run(
            [*signoff, "keys", "create", "bench-agent"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        key = out.stdout.strip().splitlines()[-1]
        port = _port()
        proc = subprocess.Popen(
            [*signoff, "serve", "--port", str(port), "--no-migrate"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/readyz").status_code == 200:
                        break
                time.sleep(0.1)
            yield base, key, admin
        finally:
            proc.terminate()
            proc.wait(10)
