"""Throughput against bare baselines, one database at a time.

Four servers run side by side, each a real uvicorn process with one worker and
the options of ``signoff serve``: Signoff, a bare FastAPI echo, and a bare
FastAPI endpoint doing one insert (aiosqlite, or asyncpg on PostgreSQL). A
separate load process (:mod:`bench._load`) keeps ``concurrency`` connections
busy for ``duration`` seconds against each in turn; the rounds alternate
baseline and subject, and each ratio is the median of the per-round ratios,
so slow drift on a shared machine falls out.

- pending creation: ``POST /v1/hooks/pre-tool-use`` for a gated call with a
  fresh idempotency key each time (as the client library sends), answered
  ``pending`` — vs the bare insert;
- allow path: the same endpoint for a call no gate matches — vs the bare echo.

    python -m bench.throughput [--db sqlite|postgres] [--duration 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
from typing import Any

from bench._report import Row, text_table
from bench._server import (
    ALLOW_BODY,
    INSERT_BODY,
    PENDING_BODY,
    ROOT,
    Signoff,
    baseline,
    drop_pg_database,
    fresh_pg_database,
    running_server,
)


def load(
    url: str,
    body: str,
    *,
    headers: dict[str, str] | None = None,
    concurrency: int,
    duration: float,
    warmup: float,
    expect: str | None = None,
) -> dict[str, Any]:
    args = [
        sys.executable,
        "-m",
        "bench._load",
        "--url",
        url,
        "--body",
        body,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration),
        "--warmup",
        str(warmup),
    ]
    for k, v in (headers or {}).items():
        args += ["--header", f"{k}: {v}"]
    if expect:
        args += ["--expect", expect]
    out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.stdout)
    if result["errors"]:
        raise RuntimeError(f"{url}: {result['errors']} bad answers, first: {result['first_error']}")
    return result


def measure(
    db: str,
    *,
    duration: float,
    rounds: int,
    concurrency: int,
    warmup: float,
    server: Signoff | None = None,
    echo: str | None = None,
    verbose: bool = True,
) -> list[Row]:
    """Throughput rows for ``db``; starts its own Signoff and echo unless given them."""
    with contextlib.ExitStack() as stack:
        s = server or stack.enter_context(running_server(db))
        echo = echo or stack.enter_context(baseline("echo"))[0]
        base_db = "signoff_bench_baseline"
        if db == "postgres":
            database = fresh_pg_database(base_db)
            stack.callback(drop_pg_database, base_db)
        else:
            database = str(s.tmp / "baseline.db")
        insert = stack.enter_context(baseline(db, database))[0]
        kw: dict[str, Any] = {"concurrency": concurrency, "duration": duration, "warmup": warmup}
        pairs: dict[str, list[float]] = {"allow": [], "pending": []}
        results: dict[str, list[float]] = {"echo": [], "allow": [], "insert": [], "pending": []}
        for r in range(rounds):
            e = load(f"{echo}/echo", ALLOW_BODY, **kw)["rps"]
            a = load(
                f"{s.url}/v1/hooks/pre-tool-use",
                ALLOW_BODY,
                headers=s.agent_headers,
                expect='"decision":"allow"',
                **kw,
            )["rps"]
            i = load(f"{insert}/insert", INSERT_BODY, **kw)["rps"]
            p = load(
                f"{s.url}/v1/hooks/pre-tool-use",
                PENDING_BODY.replace("%N%", f"r{r}-%N%"),
                headers=s.agent_headers,
                expect='"decision":"pending"',
                **kw,
            )["rps"]
            for name, v in (("echo", e), ("allow", a), ("insert", i), ("pending", p)):
                results[name].append(v)
            pairs["allow"].append(a / e)
            pairs["pending"].append(p / i)
            if verbose:
                print(
                    f"  [{db} round {r + 1}/{rounds}] echo {e:.0f}/s allow {a:.0f}/s "
                    f"insert {i:.0f}/s pending {p:.0f}/s",
                    file=sys.stderr,
                )
    med = {k: statistics.median(v) for k, v in results.items()}
    allow_ratio = statistics.median(pairs["allow"])
    pending_ratio = statistics.median(pairs["pending"])
    insert_name = "aiosqlite insert" if db == "sqlite" else "asyncpg insert"
    note = (
        f"{concurrency} connections, {rounds} x {duration:g} s per figure; ratio = median of per-round ratios"
    )
    return [
        Row(
            "pending creation (req/s)",
            db,
            f"{med['pending']:.0f}/s",
            f"{med['insert']:.0f}/s ({insert_name})",
            pending_ratio,
            "≥ 0.70",  # with durability on (DESIGN.md's targets; issue 26)
            pending_ratio >= 0.7,
            note,
        ),
        Row(
            "allow path (req/s)",
            db,
            f"{med['allow']:.0f}/s",
            f"{med['echo']:.0f}/s (echo)",
            allow_ratio,
            "≥ 0.75",
            allow_ratio >= 0.75,
        ),
    ]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], action="append")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    rows: list[Row] = []
    for db in args.db or ["sqlite", "postgres"]:
        rows += measure(
            db, duration=args.duration, rounds=args.rounds, concurrency=args.concurrency, warmup=args.warmup
        )
    print(text_table(rows))


if __name__ == "__main__":
    main()
