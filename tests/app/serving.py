"""``signoff serve`` as an operator runs it: a process on a port, its log in a file.

:func:`serve` starts it (optionally inside ``unshare -rm``, a mount namespace of its own in
which a shell script first mounts what the test needs: a read-only file, a small disk) and
waits for ``/healthz``; on leaving it sends SIGTERM and waits for the exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, free_port

SIGNOFF = Path(sys.executable).with_name("signoff")
START_SECONDS = 90.0
"""A cold start on a busy machine."""


def environment(tmp_path: Path, database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a server on ``database_url`` with the tests' configuration."""
    config = tmp_path / "signoff.yaml"
    if not config.exists():
        config.write_text(yaml.safe_dump(DEFAULT_CONFIG, sort_keys=False), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    env.update(
        SIGNOFF_DATABASE_URL=database_url,
        SIGNOFF_CONFIG=str(config),
        SIGNOFF_ADMIN_TOKEN=ADMIN_TOKEN,
        SIGNOFF_LOG_FORMAT="text",
        **extra,
    )
    return env


def signoff(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``signoff`` command line."""
    return subprocess.run(
        [str(SIGNOFF), *args], env=dict(env), capture_output=True, text=True, timeout=120, check=False
    )


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def root(self) -> Path:
        """The file system as the server sees it (its own mounts included)."""
        return Path(f"/proc/{self.process.pid}/root")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code once it has exited."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def _wait_healthy(served: Served) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise AssertionError(f"signoff serve exited ({served.process.returncode}):\n{served.output()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{served.url}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"signoff serve did not answer within {START_SECONDS:g} s:\n{served.output()}")


@contextlib.contextmanager
def serve(
    env: Mapping[str, str],
    log: Path,
    *,
    port: int | None = None,
    mounts: str = "",
    args: tuple[str, ...] = (),
) -> Iterator[Served]:
    """``signoff serve --port PORT ARGS``; ``mounts``: shell commands run first, in a mount
    namespace of the server's own."""
    port = port or free_port()
    command = [str(SIGNOFF), "serve", "--port", str(port), *args]
    if mounts:
        command = ["unshare", "-rm", "sh", "-ec", f'{mounts}\nexec "$@"', "sh", *command]
    with log.open("ab") as out:
        process = subprocess.Popen(command, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    served = Served(f"http://127.0.0.1:{port}", port, process, log)
    try:
        _wait_healthy(served)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
