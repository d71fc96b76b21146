"""Restart with many pending requests: time until serving again, and memory.

A database migrated by ``signoff db upgrade`` gets ``pending`` requests (each
with its card already posted) in bulk; then ``signoff serve`` starts (as an
operator would run it: migrations checked first) and the clock runs from
spawning the process until ``/readyz`` answers 200 and until a pre-tool-use
call that creates a new pending request succeeds. RSS is read once the
process has served and its background loops (expiry sweep, outbox) have run.
The same is done with no pending rows, so the two memory figures compare.

    python -m bench.restart [--db sqlite|postgres] [--pending 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass

import httpx

from bench._data import insert_pending
from bench._server import signoff_database


@dataclass
class RestartResult:
    pending: int
    ready_seconds: float
    serving_seconds: float
    rss_mib: float
    insert_seconds: float


def measure_one(db: str, pending: int, *, settle: float = 2.0) -> RestartResult:
    with signoff_database(db, name="signoff_bench_restart") as s:
        t = time.monotonic()
        if pending:
            insert_pending(s.database_url, pending)
        inserted = time.monotonic() - t
        t0 = time.monotonic()
        proc = s.start(migrate=True, wait=False)
        ready = serving = 0.0
        body = {"tool_name": "pay_x", "arguments": {"amount": 10**6}, "idempotency_key": "after-restart"}
        with httpx.Client(base_url=s.url, timeout=10) as c:
            while not serving:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}; see {s.log}")
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("not serving after 60 s")
                with contextlib.suppress(httpx.HTTPError):
                    if not ready:
                        if c.get("/readyz").status_code == 200:
                            ready = time.monotonic() - t0
                    if ready:
                        r = c.post("/v1/hooks/pre-tool-use", json=body, headers=s.agent_headers)
                        if r.status_code == 200 and r.json()["decision"] == "pending":
                            serving = time.monotonic() - t0
                            break
                time.sleep(0.005)
            time.sleep(settle)
            c.get(f"/v1/requests/{r.json()['request_id']}", headers=s.agent_headers)
        rss = s.rss_mib()
    return RestartResult(pending, ready, serving, rss, inserted)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--pending", type=int, default=100_000)
    args = p.parse_args()
    for n in (0, args.pending):
        r = measure_one(args.db, n)
        print(
            f"{args.db}, {n} pending (inserted in {r.insert_seconds:.1f} s): "
            f"ready in {r.ready_seconds:.2f} s, serving in {r.serving_seconds:.2f} s, "
            f"RSS {r.rss_mib:.0f} MiB",
            file=sys.stdout,
        )


if __name__ == "__main__":
    main()
