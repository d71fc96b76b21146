"""Many concurrent waiters on one server process: memory, and every one woken correctly.

``count`` pending requests are written straight into the database; a separate
client process opens one connection per request and parks a long-poll
(``GET /v1/requests/{id}/wait?timeout=60``) on each. Once the server reports
them all waiting (``signoff_waiters`` on ``/metrics``), every request is decided
through the operator API (even ones approved, odd ones rejected, 16 at a time),
and each waiter's answer is checked against its own decision. The server's RSS
is read before the waiters connect, while they are all parked, and after.

The client needs one file descriptor per waiter; the script raises its soft
``RLIMIT_NOFILE`` to the hard limit (the server process inherits it).

    python -m bench.waiters [--db sqlite|postgres] [--count 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench._data import insert_pending
from bench._load import Connection
from bench._server import ROOT, signoff_database
from bench.replicas import tree

CLIENT = [sys.executable, "-m", "bench.waiters", "--client"]


def raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --- the client process ---------------------------------------------------------------------


async def park(host: str, port: int, key: str, ids: list[str], timeout: float) -> dict[str, object]:
    results: dict[str, str] = {}
    failures: list[str] = []
    started = asyncio.Event()
    opened = 0

    async def one(rid: str) -> None:
        nonlocal opened
        conn = Connection(host, port)
        raw = (
            f"GET /v1/requests/{rid}/wait?timeout={timeout:g} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {key}\r\n\r\n"
        ).encode()
        try:
            await conn.open()
            opened += 1
            if opened == len(ids):
                started.set()
            while True:  # re-attach after a long-poll that timed out, as the client library does
                status, body = await conn.request(raw)
                if status != 200:
                    failures.append(f"{rid}: HTTP {status} {body[:200]!r}")
                    break
                state = json.loads(body)["status"]
                if state != "pending":
                    results[rid] = state
                    break
        except Exception as exc:
            failures.append(f"{rid}: {type(exc).__name__}: {exc}")
        finally:
            conn.close()

    tasks = []
    for n, rid in enumerate(ids):
        tasks.append(asyncio.create_task(one(rid)))
        if n % 100 == 99:
            await asyncio.sleep(0.05)  # stay inside the listen backlog (2,000 connections a second)
    print(json.dumps({"event": "connecting", "tasks": len(tasks)}), flush=True)
    await asyncio.gather(*tasks)
    return {"results": results, "failures": failures[:20], "failed": len(failures)}


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ids", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--report", type=Path, required=True)
    args = p.parse_args(argv)
    ids = args.ids.read_text().split()
    raise_fd_limit(len(ids) + 100)
    runner = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    out = runner(park(args.host, args.port, args.key, ids, args.timeout))
    # A file, not the pipe: the event loop may leave an inherited pipe non-blocking, and a
    # report larger than the pipe's buffer would then be cut short.
    args.report.write_text(json.dumps(out))


# --- the orchestrator -----------------------------------------------------------------------


@dataclass
class WaitersResult:
    count: int
    woken_correctly: int
    wrong: int
    failed: int
    rss_before: float
    rss_parked: float
    rss_after: float
    park_seconds: float
    decide_seconds: float
    problems: list[str]

    @property
    def per_waiter_kib(self) -> float:
        return (self.rss_parked - self.rss_before) * 1024 / max(1, self.count)


def waiting(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    m = re.search(r"^signoff_waiters(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else -1


async def decide_all(url: str, headers: dict[str, str], ids: list[str], concurrency: int = 16) -> list[str]:
    problems: list[str] = []
    queue = list(enumerate(ids))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            n, rid = queue.pop()
            verdict = "approve" if n % 2 == 0 else "reject"
            r = await client.post(
                f"/v1/admin/requests/{rid}/decision", json={"verdict": verdict, "operator": "alice"}
            )
            if r.status_code != 200:
                problems.append(f"decide {rid}: HTTP {r.status_code} {r.text[:200]}")

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return problems


def measure(db: str, count: int, *, verbose: bool = True, env: dict[str, str] | None = None) -> WaitersResult:
    """``count`` waiters on one server; ``env`` is added to the server's environment (the
    code of another revision: :func:`bench.replicas.tree`)."""
    raise_fd_limit(count + 200)
    with signoff_database(db, name="signoff_bench_waiters", extra_env=env) as s:
        ids = insert_pending(s.database_url, count)
        expected = {rid: ("approved" if n % 2 == 0 else "rejected") for n, rid in enumerate(ids)}
        s.start()
        with httpx.Client(base_url=s.url, headers=s.agent_headers, timeout=30) as c:  # warm up
            c.post("/v1/hooks/pre-tool-use", json={"tool_name": "read", "arguments": {}})
            c.get(f"/v1/requests/{ids[0]}/wait", params={"timeout": 0})
        time.sleep(0.5)
        rss_before = s.rss_mib()
        id_file = s.tmp / "ids.txt"
        id_file.write_text("\n".join(ids))
        t0 = time.monotonic()
        report_file = s.tmp / "report.json"
        client = subprocess.Popen(
            [
                *CLIENT,
                "--port",
                str(s.port),
                "--key",
                s.key,
                "--ids",
                str(id_file),
                "--report",
                str(report_file),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            seen = 0
            while (seen := waiting(s.url)) < count:
                if time.monotonic() > deadline or client.poll() is not None:
                    if client.poll() is None:
                        client.kill()
                    tail = (client.communicate()[0] or "")[-2000:]
                    raise RuntimeError(f"only {seen} of {count} waiters parked; client said: {tail}")
                time.sleep(0.25)
            park_seconds = time.monotonic() - t0
            if verbose:
                print(f"  {seen} waiters parked in {park_seconds:.1f} s", file=sys.stderr)
            rss_parked = s.rss_mib()
            t1 = time.monotonic()
            problems = asyncio.run(decide_all(s.url, s.admin_headers, ids))
            decide_seconds = time.monotonic() - t1
            if problems:  # their waiters would wait for a decision that never comes
                raise RuntimeError(f"{len(problems)} decisions refused: {'; '.join(problems[:3])}")
            out, _ = client.communicate(timeout=120)
        finally:
            if client.poll() is None:
                client.kill()
                client.communicate()
        if client.returncode != 0 or not report_file.exists():
            raise RuntimeError(f"the waiting client failed ({client.returncode}): {(out or '')[-2000:]}")
        report = json.loads(report_file.read_text())
        time.sleep(0.5)
        rss_after = s.rss_mib()
    results: dict[str, str] = report["results"]
    right = sum(1 for rid, st in results.items() if expected.get(rid) == st)
    problems += report["failures"]
    wrong = [
        f"{rid}: got {st}, decided {expected[rid]}" for rid, st in results.items() if expected[rid] != st
    ]
    problems += wrong[:20]
    return WaitersResult(
        count=count,
        woken_correctly=right,
        wrong=len(results) - right,
        failed=int(report["failed"]),
        rss_before=rss_before,
        rss_parked=rss_parked,
        rss_after=rss_after,
        park_seconds=park_seconds,
        decide_seconds=decide_seconds,
        problems=problems,
    )


def main() -> None:
    if "--client" in sys.argv:
        client_main([a for a in sys.argv[1:] if a != "--client"])
        return
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--before", help="a revision to measure alongside, alternating (e.g. main)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="signoff-bench-before-") as tmp:
        trees: dict[str, dict[str, str] | None] = {"this tree": None}
        if args.before:
            trees = {f"before ({args.before})": tree(args.before, Path(tmp)), "this tree": None}
        for n in range(args.rounds):
            for label, env in trees.items():
                r = measure(args.db, args.count, env=env)
                print(
                    f"[round {n + 1}, {label}] {r.count} waiters ({args.db}): {r.woken_correctly} woken "
                    f"correctly, {r.wrong} wrong, {r.failed} failed; RSS {r.rss_before:.0f} → "
                    f"{r.rss_parked:.0f} (parked) → {r.rss_after:.0f} MiB ({r.per_waiter_kib:.1f} KiB per "
                    f"waiter); parked in {r.park_seconds:.1f} s, decided in {r.decide_seconds:.1f} s",
                    flush=True,
                )
                for problem in r.problems[:20]:
                    print("  ", problem)


if __name__ == "__main__":
    main()
