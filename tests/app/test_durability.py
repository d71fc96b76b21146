"""A request and a decision are on disk before anyone hears of them: a real ``signoff serve`` on
SQLite, its system calls traced (``strace``), creates pending requests and decides them through
the operator API while an agent waits on each; no thread of the server says anything (an HTTP
answer, the wake-up of the event loop) after writing the WAL until the WAL is synced.

Under ``SIGNOFF_SQLITE_SYNC=normal`` (which trades this away) the same trace shows answers sent
from an unsynced WAL, so the check sees what it looks for."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from signoff.app.audit import Actor
from signoff.app.db import create_engine, migrate, sessionmaker, transaction
from signoff.app.keys import create_key
from tests.app.serving import Served, environment, serve
from tests.conftest import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CALLS = 4
CONFIG = {
    "channels": {"console": {"type": "web"}},
    "people": {"alice": {"name": "Alice", "web": "alice"}},
    "agents": {
        "finance-bot": {
            "hooks": [
                {
                    "type": "confirmation_gate",
                    "name": "payments",
                    "tools": ["pay_*"],
                    "channel": "console",
                    "approvers": ["alice"],
                    "timeout": "30m",
                }
            ]
        }
    },
}
TRACED = "pwrite64,pwritev,write,writev,sendto,sendmsg,fsync,fdatasync"
_LINE = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((\d+)<([^>]*)>")
_TELLS = ("TCP", "UNIX", "eventfd")
"""What a send tells someone on: a client's connection, the event loop's wake-up (from a
worker thread)."""
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>")


@dataclass
class Trace:
    """What the traced syscalls show, read in the order strace saw them."""

    wal_syncs: int = 0
    told_unsynced: list[str] = field(default_factory=list)
    """Each socket send by a thread that had written the WAL since the last sync had begun."""
    http_answers: int = 0


def read_trace(text: str) -> Trace:
    trace = Trace()
    dirty: dict[str, int] = {}  # thread -> sequence number of its first unsynced WAL write
    syncing: dict[str, int] = {}  # thread -> sequence number at which its WAL sync began
    for seq, raw in enumerate(text.splitlines()):
        found = _LINE.match(raw)
        if found is None:
            continue
        thread, rest = found.groups()
        resumed = _RESUMED.match(rest)
        if resumed is not None:
            if resumed.group(1) in ("fsync", "fdatasync") and thread in syncing:
                _synced(trace, dirty, syncing.pop(thread))
            continue
        call = _CALL.match(rest)
        if call is None:
            continue
        name, _fd, target = call.groups()
        if name.startswith("pwrite") and target.endswith("-wal"):
            dirty.setdefault(thread, seq)
        elif name in ("fsync", "fdatasync") and target.endswith("-wal"):
            if "<unfinished" in rest:
                syncing[thread] = seq
            else:
                _synced(trace, dirty, seq)
        elif name in ("write", "writev", "sendto", "sendmsg") and any(k in target for k in _TELLS):
            if "TCP" in target and '"HTTP/1.1 ' in rest:
                trace.http_answers += 1
            if thread in dirty:
                trace.told_unsynced.append(raw)
    return trace


def _synced(trace: Trace, dirty: dict[str, int], began: int) -> None:
    trace.wal_syncs += 1
    for thread in [t for t, first in dirty.items() if first < began]:
        del dirty[thread]


@contextlib.contextmanager
def traced(served: Served, out: Path) -> Iterator[None]:
    """``strace`` attached to every thread of ``served`` (and any it starts) while inside."""
    errors = (out.parent / "strace.log").open("wb")
    strace = subprocess.Popen(
        [
            "strace",
            "-f",
            "-qq",
            "-yy",
            "-s",
            "16",
            "-e",
            f"trace={TRACED}",
            "-o",
            str(out),
            "-p",
            str(served.process.pid),
        ],
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        # Attached once a health check's answer shows in the trace.
        deadline = time.monotonic() + 30
        while '"HTTP/1.1 200' not in (out.read_text(errors="replace") if out.exists() else ""):
            assert strace.poll() is None, f"strace could not attach: {errors.name}"
            assert time.monotonic() < deadline, "strace did not attach within 30 s"
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{served.url}/healthz", timeout=2)
        yield
    finally:
        strace.send_signal(signal.SIGINT)
        strace.wait(30)
        errors.close()


async def _key(url: str) -> str:
    engine = create_engine(url)
    try:
        async with transaction(sessionmaker(engine)) as session:
            _, token = await create_key(session, "finance-bot", actor=Actor("test"))
        return token
    finally:
        await engine.dispose()


async def _waiting(http: httpx.AsyncClient, served: Served, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = (await http.get(f"{served.url}/metrics")).text
        found = re.search(r"^signoff_waiters (\S+)$", metrics, re.M)
        if found and float(found.group(1)) == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{count} waiters never parked at {served.url}")


async def _create_and_decide(served: Served, token: str) -> None:
    """``CALLS`` times, one after another: a pending request, an agent waiting on it, an
    operator's approval, the agent's answer."""
    agent = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as http:
        for n in range(CALLS):
            made = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "pay_invoice", "arguments": {"amount": n}},
                headers=agent,
            )
            assert made.json()["decision"] == "pending", made.text
            rid = made.json()["request_id"]
            waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait?timeout=30", headers=agent))
            await _waiting(http, served, 1)
            decided = await http.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=ADMIN,
            )
            assert decided.status_code == 200, decided.text
            assert (await waiter).json()["status"] == "approved"
            await _waiting(http, served, 0)


async def _run(tmp_path: Path, url: str, sync: str | None) -> Trace:
    await asyncio.to_thread(migrate, url)
    token = await _key(url)
    (tmp_path / "signoff.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False), encoding="utf-8")
    extra = {"SIGNOFF_SQLITE_SYNC": sync} if sync else {}
    env = environment(tmp_path, url, **extra)
    out = tmp_path / "strace.txt"
    with serve(env, tmp_path / "serve.log") as served:
        with traced(served, out):
            await _create_and_decide(served, token)
    return read_trace(out.read_text(errors="replace"))


@pytest.fixture
def strace() -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed: `make test` installs it (or apt-get install -y strace)")


@pytest.mark.usefixtures("strace")
async def test_requests_and_decisions_are_synced_before_anyone_is_told(tmp_path: Path) -> None:
    trace = await _run(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}", None)
    assert trace.http_answers >= 3 * CALLS  # the traced server did answer each call
    assert trace.told_unsynced == [], "\n".join(trace.told_unsynced[:10])
    # Each pending request and each decision had a commit of its own, each synced.
    assert trace.wal_syncs >= 2 * CALLS


@pytest.mark.usefixtures("strace")
async def test_normal_sync_tells_before_the_disk_has_it(tmp_path: Path) -> None:
    trace = await _run(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}", "normal")
    assert trace.http_answers >= 3 * CALLS
    assert trace.told_unsynced, "SIGNOFF_SQLITE_SYNC=normal answered only from a synced WAL"
