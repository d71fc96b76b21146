"""The gate as an agent sees it: one allow-path call through the client library vs a bare echo.

One agent, one connection, calls one after another (no concurrency):

- baseline: ``httpx`` posting the same call to the bare FastAPI echo
  (``bench.baselines``), the cost of any HTTP round trip from Python;
- subject: ``signoff.hooks.client.AsyncGateClient.pre_tool_use`` (and the sync
  ``GateClient``) for a call no gate matches, answered ``allow``.

The ratio is echo p50 / gate p50 (1.0 = the gate costs nothing beyond a round trip).

    python -m bench.client_overhead [--db sqlite|postgres] [--calls 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass

import httpx

from bench._server import ALLOW_BODY, Signoff, baseline, running_server


@dataclass
class Latency:
    p50: float
    p99: float

    @classmethod
    def of(cls, samples: list[float]) -> Latency:
        s = sorted(samples)
        return cls(statistics.median(s) * 1000, s[min(len(s) - 1, int(len(s) * 0.99))] * 1000)


@dataclass
class OverheadResult:
    echo_async: Latency
    gate_async: Latency
    echo_sync: Latency
    gate_sync: Latency
    raw_async: Latency


async def _async(s: Signoff, echo: str, calls: int) -> tuple[Latency, Latency, Latency]:
    from signoff.hooks.client import AsyncGateClient

    call = json.loads(ALLOW_BODY)
    echo_t: list[float] = []
    gate_t: list[float] = []
    raw_t: list[float] = []
    async with (
        httpx.AsyncClient(timeout=30) as http,
        AsyncGateClient(s.url, s.key, deadline=30) as gate,
    ):
        for i in range(calls + 20):
            t0 = time.perf_counter()
            r = await http.post(f"{echo}/echo", json=call)
            t1 = time.perf_counter()
            d = await gate.pre_tool_use(call["tool_name"], call["arguments"], session_id="bench")
            t2 = time.perf_counter()
            raw = await http.post(f"{s.url}/v1/hooks/pre-tool-use", json=call, headers=s.agent_headers)
            t3 = time.perf_counter()
            if r.status_code != 200 or not d.allowed or raw.json()["decision"] != "allow":
                raise RuntimeError(f"unexpected answers: echo {r.status_code}, gate {d}, raw {raw.text}")
            if i >= 20:  # warm-up
                echo_t.append(t1 - t0)
                gate_t.append(t2 - t1)
                raw_t.append(t3 - t2)
    return Latency.of(echo_t), Latency.of(gate_t), Latency.of(raw_t)


def _sync(s: Signoff, echo: str, calls: int) -> tuple[Latency, Latency]:
    from signoff.hooks.client import GateClient

    call = json.loads(ALLOW_BODY)
    echo_t: list[float] = []
    gate_t: list[float] = []
    with httpx.Client(timeout=30) as http, GateClient(s.url, s.key, deadline=30) as gate:
        for i in range(calls + 20):
            t0 = time.perf_counter()
            r = http.post(f"{echo}/echo", json=call)
            t1 = time.perf_counter()
            d = gate.pre_tool_use(call["tool_name"], call["arguments"], session_id="bench")
            t2 = time.perf_counter()
            if r.status_code != 200 or not d.allowed:
                raise RuntimeError(f"unexpected answers: echo {r.status_code}, gate {d}")
            if i >= 20:
                echo_t.append(t1 - t0)
                gate_t.append(t2 - t1)
    return Latency.of(echo_t), Latency.of(gate_t)


def measure(s: Signoff, echo: str, calls: int) -> OverheadResult:
    echo_a, gate_a, raw_a = asyncio.run(_async(s, echo, calls))
    echo_s, gate_s = _sync(s, echo, calls)
    return OverheadResult(echo_a, gate_a, echo_s, gate_s, raw_a)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args()
    with running_server(args.db) as s, baseline("echo") as (echo, _):
        r = measure(s, echo, args.calls)
    for name in ("echo_async", "gate_async", "raw_async", "echo_sync", "gate_sync"):
        lat = getattr(r, name)
        print(f"{name}: p50 {lat.p50:.2f} ms, p99 {lat.p99:.2f} ms")


if __name__ == "__main__":
    main()
