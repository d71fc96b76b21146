"""A decision reaching the waiting agent, against its floor, before and after a change.

For each database, servers of two source trees (``--before``, a git revision, and this
working tree) are started in turn, ``--alternate`` times each, on the same machine in the same
run. Each server gets two series: a signed Slack button click and an operator API decision,
each approving a request an agent is long-polling (``GET /v1/requests/{id}/wait``); the figure
is from sending the decision to the waiter's complete answer (see :mod:`bench.wake_latency`).

The floor, measured in every run next to the servers: one loopback HTTP round trip to a bare
FastAPI echo (``bench.baselines``) plus one ``fsync`` of a freshly written 4 KiB page in the
scratch database's own directory (PostgreSQL's data directory is on the same disk here).
The ratio is the decision's p50 over the floor's p50 (echo p50 + fsync p50).

The ``--before`` tree runs from ``git archive`` of that revision, imported ahead of this
working tree's editable install (whose import hooks are taken out for that process alone).

    python -m bench.click_latency [--before d909199] [--rounds 200] [--alternate 3] [--db sqlite postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import wake_latency
from bench._server import ROOT, baseline, config_with_slack, fake_slack, signoff_database

_SITECUSTOMIZE = """\
import sys
# This tree, not the editable install of another: drop the editable installs' import hooks.
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


@contextlib.contextmanager
def source_tree(revision: str) -> Iterator[dict[str, str]]:
    """The environment that runs ``revision``'s server instead of this working tree's."""
    with tempfile.TemporaryDirectory(prefix="signoff-bench-tree-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", revision], cwd=ROOT, check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        path = Path(tmp) / "path"
        (path / "signoff").mkdir(parents=True)
        for package in ("app", "channels", "migrations", "hooks"):
            (path / "signoff" / package).symlink_to(root / package)
        (path / "_signoff_hooks_entry.py").symlink_to(root / "hooks" / "_console" / "_signoff_hooks_entry.py")
        (path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        yield {"PYTHONPATH": str(path)}


def fsync_ms(directory: Path, n: int) -> list[float]:
    """``n`` times: write a 4 KiB page to a file in ``directory`` and fsync it."""
    out = []
    page = os.urandom(4096)
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, page, (i % 64) * 4096)
            t0 = time.perf_counter()
            os.fsync(fd)
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
    return out


async def echo_ms(url: str, n: int) -> list[float]:
    """``n`` sequential round trips to the bare echo on one connection."""
    out = []
    call = {"tool_name": "slack_x", "arguments": {"amount": 10**6}}
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(20):
            await http.post(f"{url}/echo", json=call)
        for _ in range(n):
            t0 = time.perf_counter()
            (await http.post(f"{url}/echo", json=call)).raise_for_status()
            out.append((time.perf_counter() - t0) * 1000)
    return out


def pct(values: list[float], q: float) -> float:
    return wake_latency.pct(values, q)


@dataclass
class Run:
    tree: str
    db: str
    click: list[float]
    api: list[float]
    echo: list[float]
    fsync: list[float]

    @property
    def floor(self) -> float:
        return pct(self.echo, 50) + pct(self.fsync, 50)


@dataclass
class Results:
    runs: list[Run] = field(default_factory=list)

    def of(self, tree: str, db: str) -> list[Run]:
        return [r for r in self.runs if r.tree == tree and r.db == db]


def one_run(tree: str, db: str, env: dict[str, str], slack: str, echo: str, rounds: int) -> Run:
    with signoff_database(db, config=config_with_slack(slack), extra_env=env) as s:
        s.start()
        click = asyncio.run(wake_latency.measure(s, rounds, verbose=False, via="slack", slack=slack))
        api = asyncio.run(wake_latency.measure(s, rounds, verbose=False, via="api"))
        e = asyncio.run(echo_ms(echo, rounds))
        f = fsync_ms(s.tmp, rounds)  # the scratch database's directory
    return Run(tree, db, click.send_to_return, api.send_to_return, e, f)


def summary(runs: list[Run], series: str) -> str:
    """p50 / p99 over every sample of ``runs``, and the spread of the runs' own p50s."""
    values = [v for r in runs for v in getattr(r, series)]
    p50s = [pct(getattr(r, series), 50) for r in runs]
    return f"{pct(values, 50):.1f} / {pct(values, 99):.1f} ms (run p50s {min(p50s):.1f} to {max(p50s):.1f})"


def ratio(runs: list[Run], series: str) -> str:
    ratios = [pct(getattr(r, series), 50) / r.floor for r in runs]
    return f"{statistics.median(ratios):.1f} ({min(ratios):.1f} to {max(ratios):.1f})"


def table(results: Results) -> str:
    """The Markdown table of ``results``: per database, figure and tree, every run together."""
    lines = [
        "| figure | db | tree | p50 / p99 (run p50s) | floor p50 (echo + fsync) | ratio p50 / floor |",
        "|---|---|---|---|---|---|",
    ]
    labels = (("click", "signed Slack click → waiter"), ("api", "operator API decision → waiter"))
    for db in dict.fromkeys(r.db for r in results.runs):
        for series, label in labels:
            for tree in dict.fromkeys(r.tree for r in results.runs):
                runs = results.of(tree, db)
                if not runs:
                    continue
                floors = [r.floor for r in runs]
                echo_p50 = statistics.median(pct(r.echo, 50) for r in runs)
                fsync_p50 = statistics.median(pct(r.fsync, 50) for r in runs)
                floor = f"{statistics.median(floors):.2f} ms ({echo_p50:.2f} + {fsync_p50:.2f})"
                figures = f"{summary(runs, series)} | {floor} | {ratio(runs, series)}"
                lines.append(f"| {label} | {db} | {tree} | {figures} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", default="d909199")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--alternate", type=int, default=3)
    p.add_argument("--db", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"])
    p.add_argument("--json", type=Path, help="write every sample here")
    p.add_argument("--report", type=Path, help="only print the table of a --json file")
    args = p.parse_args()
    if args.report:
        print(table(Results([Run(**r) for r in json.loads(args.report.read_text())])))
        return
    results = Results()
    with (
        source_tree(args.before) as before_env,
        fake_slack() as slack,
        baseline("echo") as (echo, _),
    ):
        trees = {f"before ({args.before})": before_env, "after": {}}
        for db in args.db:
            for i in range(args.alternate):
                for tree, env in trees.items():
                    print(f"[click-latency] {db} {tree} run {i + 1}/{args.alternate}", file=sys.stderr)
                    run = one_run(tree, db, env, slack, echo, args.rounds)
                    results.runs.append(run)
                    print(
                        f"[click-latency]   click p50 {pct(run.click, 50):.1f} p99 {pct(run.click, 99):.1f}, "
                        f"api p50 {pct(run.api, 50):.1f} p99 {pct(run.api, 99):.1f}, "
                        f"echo p50 {pct(run.echo, 50):.2f}, fsync p50 {pct(run.fsync, 50):.2f} ms",
                        file=sys.stderr,
                    )
                    if args.json:  # after every run: a cut-short run keeps what it measured
                        args.json.write_text(json.dumps([r.__dict__ for r in results.runs]))
    print(table(results))


if __name__ == "__main__":
    main()
