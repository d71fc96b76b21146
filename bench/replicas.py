"""Replicas on one PostgreSQL: pending creation with one server and with two, side by side.

Each round starts, on a fresh database, one ``signoff serve`` and then two on one database,
and keeps the same number of connections busy creating pending requests (split evenly over
the replicas, one load process each). Meanwhile the database's backends are sampled every
20 ms: how many wait on a lock (``pg_stat_activity.wait_event_type = 'Lock'``). The servers'
CPU time per request is read from /proc. Rounds alternate one and two replicas, and with
``--before REV`` also the code of that revision (servers and migrations from ``git archive``;
the load, the database and the machine the same), so a busy shared machine slows both alike.

    python -m bench.replicas [--before REV] [--rounds 3] [--duration 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._report import Row, text_table
from bench._server import PENDING_BODY, ROOT, Signoff, signoff_database


def tree(rev: str, into: Path) -> dict[str, str]:
    """The environment that runs ``signoff`` from revision ``rev`` of this repository: its files
    from ``git archive``, laid out as installed (``signoff/app``, ...), first on PYTHONPATH."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "path" / "signoff"
    pkg.mkdir(parents=True)
    for name in ("app", "channels", "migrations", "hooks"):
        (pkg / name).symlink_to(src / name)
    return {"PYTHONPATH": str(into / "path")}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class LockSampler:
    """Counts, every ``every`` seconds, the backends of ``database`` waiting on a lock."""

    database: str
    every: float = 0.02
    samples: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        import asyncpg

        async def loop() -> None:
            conn = await asyncpg.connect(host="127.0.0.1", user="postgres", database="postgres")
            try:
                while not self._stop.is_set():
                    n = await conn.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = $1 AND wait_event_type = 'Lock'",
                        self.database,
                    )
                    self.samples.append(int(n))
                    await asyncio.sleep(self.every)
            finally:
                await conn.close()

        asyncio.run(loop())

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        t = threading.Thread(target=self._run, daemon=True)
        t.start()
        try:
            yield
        finally:
            self._stop.set()
            t.join(10)


@dataclass(frozen=True)
class Result:
    rps: float
    lock_waits: float
    lock_waits_max: int
    cpu_ms_per_request: float
    p50_ms: float


def run_once(
    replicas: int, *, env: dict[str, str], concurrency: int, duration: float, warmup: float
) -> Result:
    name = "signoff_bench_replicas"
    with signoff_database("postgres", name=name, extra_env=env) as first:
        servers = [first] + [
            Signoff(first.db, first.database_url, first.env, first.key, first.admin, first.tmp)
            for _ in range(replicas - 1)
        ]
        try:
            for s in servers:
                s.start()
            assert all(s.proc is not None for s in servers)
            before = [cpu_seconds(s.proc.pid) for s in servers if s.proc is not None]
            procs = []
            for i, s in enumerate(servers):
                args = [
                    sys.executable,
                    "-m",
                    "bench._load",
                    "--url",
                    f"{s.url}/v1/hooks/pre-tool-use",
                    "--body",
                    PENDING_BODY.replace("%N%", f"r{i}-%N%"),
                    "--header",
                    f"Authorization: Bearer {s.key}",
                    "--concurrency",
                    str(concurrency // replicas),
                    "--duration",
                    str(duration),
                    "--warmup",
                    str(warmup),
                    "--expect",
                    '"decision":"pending"',
                ]
                procs.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True))
            sampler = LockSampler(name)
            time.sleep(warmup)
            with sampler.running():
                outs = [p.communicate()[0] for p in procs]
            after = [cpu_seconds(s.proc.pid) for s in servers if s.proc is not None]
        finally:
            for s in servers[1:]:
                s.stop()
    results: list[dict[str, Any]] = [json.loads(o) for o in outs]
    for r in results:
        if r["errors"]:
            raise RuntimeError(f"{r['errors']} bad answers, first: {r['first_error']}")
    requests = sum(r["requests"] for r in results)
    cpu = sum(after) - sum(before)
    # The CPU window includes the warm-up: scale the requests to it.
    window_requests = requests * (duration + warmup) / duration
    return Result(
        rps=requests / duration,
        lock_waits=statistics.mean(sampler.samples) if sampler.samples else 0.0,
        lock_waits_max=max(sampler.samples, default=0),
        cpu_ms_per_request=1000 * cpu / window_requests if window_requests else 0.0,
        p50_ms=statistics.median(r["p50_ms"] for r in results),
    )


def spread(values: list[float]) -> str:
    return f"{min(values):.0f} to {max(values):.0f}"


def measure(
    *, rounds: int, duration: float, warmup: float, concurrency: int, before: str | None = None
) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="signoff-bench-before-") as tmp:
        trees: dict[str, dict[str, str]] = {"this tree": {}}
        if before:
            trees = {f"before ({before})": tree(before, Path(tmp)), "this tree": {}}
        got: dict[tuple[str, int], list[Result]] = {}
        for r in range(rounds):
            for label, env in trees.items():
                for n in (1, 2):
                    res = run_once(n, env=env, concurrency=concurrency, duration=duration, warmup=warmup)
                    got.setdefault((label, n), []).append(res)
                    print(
                        f"  [round {r + 1}/{rounds}] {label}, {n} replica(s): {res.rps:.0f}/s, "
                        f"lock waits {res.lock_waits:.2f} (max {res.lock_waits_max}), "
                        f"{res.cpu_ms_per_request:.2f} ms CPU/request, p50 {res.p50_ms:.1f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
    rows = []
    for label in trees:
        one, two = got[(label, 1)], got[(label, 2)]
        ratios = [b.rps / a.rps for a, b in zip(one, two, strict=True)]
        ratio = statistics.median(ratios)
        rows.append(
            Row(
                f"pending creation, 2 replicas vs 1 ({label})",
                "postgres",
                f"{statistics.median(x.rps for x in two):.0f}/s ({spread([x.rps for x in two])}), "
                f"lock waits {statistics.median(x.lock_waits for x in two):.2f}",
                f"{statistics.median(x.rps for x in one):.0f}/s ({spread([x.rps for x in one])}), "
                f"lock waits {statistics.median(x.lock_waits for x in one):.2f} (1 replica)",
                ratio,
                "≥ 1.00",
                ratio >= 1.0,
                f"{concurrency} connections split over the replicas, {rounds} x {duration:g} s, alternating; "
                "ratio = median of per-round ratios (each round: "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + "); CPU per request 1 → 2 replicas: "
                f"{statistics.median(x.cpu_ms_per_request for x in one):.2f} → "
                f"{statistics.median(x.cpu_ms_per_request for x in two):.2f} ms; lock waits = mean "
                "backends waiting on a lock, sampled every 20 ms",
            )
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a revision to measure alongside (e.g. main)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = measure(
        rounds=args.rounds,
        duration=args.duration,
        warmup=args.warmup,
        concurrency=args.concurrency,
        before=args.before,
    )
    print(text_table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))


if __name__ == "__main__":
    main()
