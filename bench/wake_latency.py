"""Decision-to-waiter latency through a real server process.

Starts ``signoff serve`` on a scratch database, parks a long-poll on a pending
request, approves it through the operator API, and times from sending the
decision to the waiter's answer (an upper bound on commit-to-return: it
includes the decision's own HTTP round trip). Prints p50 / p99 in ms.

    python -m bench.wake_latency [--db sqlite|postgres] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import httpx

from bench._server import running_server


async def measure(url: str, key: str, admin: str, rounds: int) -> list[float]:
    agent = {"Authorization": f"Bearer {key}"}
    ops = {"Authorization": f"Bearer {admin}"}
    samples: list[float] = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as a,
        httpx.AsyncClient(base_url=url, timeout=30) as b,
    ):
        for i in range(rounds):
            r = await a.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "pay_x", "arguments": {"amount": 10**6}},
                headers=agent,
            )
            rid = r.json()["request_id"]
            waiter = asyncio.create_task(
                a.get(f"/v1/requests/{rid}/wait", params={"timeout": 20}, headers=agent)
            )
            await asyncio.sleep(0.02)  # let the long-poll park
            t0 = time.perf_counter()
            d = await b.post(
                f"/v1/admin/requests/{rid}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=ops,
            )
            d.raise_for_status()
            w = await waiter
            samples.append((time.perf_counter() - t0) * 1000)
            if w.status_code != 200 or w.json()["status"] != "approved":
                raise RuntimeError(f"waiter got {w.status_code}: {w.text}")
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{rounds}", file=sys.stderr)
    return samples


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    with running_server(args.db) as (url, key, admin):
        samples = asyncio.run(measure(url, key, admin, args.rounds))
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"decision → waiter ({args.db}, {len(samples)} rounds): p50 {p50:.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
