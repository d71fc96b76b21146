"""What ``signoff-mcp-proxy`` adds to an ungated ``tools/call``, against calling the same upstream directly.

One run, one machine, two stdio connections from the ``mcp`` SDK's own client:

- baseline: the client → the upstream MCP server (``bench._mcp_upstream``), directly;
- subject: the client → ``signoff-mcp-proxy --name bench -- <the same upstream>``, which
  asks a running Signoff (``signoff serve`` on SQLite) about every call: here a tool no
  gate matches, answered ``allow``, then forwarded; the report of the executed call is
  sent in the background.

Calls alternate between the two (baseline, subject, baseline, …) so that a change in
the machine's load hits both. The figure is subject p50 - baseline p50 (target ≤ 3 ms), on
both protocol paths: the SDK client's default (the current protocol) and the initialize
handshake.

    python -m bench.mcp_proxy [--calls 500] [--db sqlite|postgres] [--protocol current|handshake]
        [--before REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._server import CONFIG, Signoff, running_server
from bench.replicas import tree

GATE = """
      - type: confirmation_gate
        tools: ["mcp__bench__pay_*"]
        channel: web
        approvers: [alice]
        timeout: 30m
"""
UPSTREAM = [sys.executable, "-m", "bench._mcp_upstream"]
WARMUP = 30


@dataclass
class ProxyResult:
    direct_p50: float
    direct_p99: float
    proxied_p50: float
    proxied_p99: float
    calls: int
    signoff_p50: float
    """The proxy's own question to Signoff alone (its client, the same call), same run."""

    @property
    def added_p50(self) -> float:
        return self.proxied_p50 - self.direct_p50


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000


async def _measure(s: Signoff, calls: int, mode: str, env_extra: dict[str, str] | None) -> ProxyResult:
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "SIGNOFF_URL": s.url, "SIGNOFF_API_KEY": s.key, **(env_extra or {})}
    direct = StdioServerParameters(command=UPSTREAM[0], args=UPSTREAM[1:], env=env)
    proxied = StdioServerParameters(
        command=sys.executable,
        args=["-m", "signoff.hooks.mcp_proxy", "--name", "bench", "--", *UPSTREAM],
        env=env,
    )
    times: dict[str, list[float]] = {"direct": [], "proxied": []}
    async with (
        Client(direct, mode=mode, cache=None) as to_upstream,
        Client(proxied, mode=mode, cache=None) as through_proxy,
    ):
        for client in (to_upstream, through_proxy):
            await client.list_tools()
        for i in range(calls + WARMUP):
            for label, client in (("direct", to_upstream), ("proxied", through_proxy)):
                started = time.perf_counter()
                result = await client.call_tool("lookup", {"key": f"k{i}"})
                took = time.perf_counter() - started
                if result.is_error:
                    raise RuntimeError(f"{label} call failed: {result.content}")
                if i >= WARMUP:
                    times[label].append(took)
    return ProxyResult(
        statistics.median(times["direct"]) * 1000,
        _pct(times["direct"], 0.99),
        statistics.median(times["proxied"]) * 1000,
        _pct(times["proxied"], 0.99),
        calls,
        await _signoff_alone(s, calls),
    )


async def _signoff_alone(s: Signoff, calls: int) -> float:
    from signoff.hooks._plain_async import AsyncPlainGateClient

    took: list[float] = []
    async with AsyncPlainGateClient(s.url, s.key, runtime="mcp") as gate:
        for i in range(calls + WARMUP):
            started = time.perf_counter()
            decision = await gate.pre_tool_use("mcp__bench__lookup", {"key": f"k{i}"}, session_id="bench")
            if i >= WARMUP:
                took.append(time.perf_counter() - started)
            if not decision.allowed:
                raise RuntimeError(f"Signoff did not allow the ungated call: {decision.reason}")
    return statistics.median(took) * 1000


MODES = {"current": "auto", "handshake": "legacy"}
"""The two protocol paths, by the ``mcp`` SDK client's ``mode``: its default (the current
protocol, discovered) and the older initialize handshake."""


def measure(
    s: Signoff, calls: int, protocol: str = "handshake", env: dict[str, str] | None = None
) -> ProxyResult:
    """Against a running Signoff whose config gates ``mcp__bench__pay_*`` (see :data:`GATE`);
    ``protocol`` is a key of :data:`MODES`; ``env`` is added to the proxy's environment."""
    return asyncio.run(_measure(s, calls, MODES[protocol], env))


def config() -> str:
    return CONFIG.rstrip() + GATE


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--protocol", choices=sorted(MODES), action="append")
    p.add_argument("--before", help="a revision whose proxy to measure alongside, alternating (e.g. main)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    with running_server(args.db, config=config()) as s, tempfile.TemporaryDirectory() as tmp:
        trees: dict[str, dict[str, str] | None] = {"this tree": None}
        if args.before:
            trees = {f"before ({args.before})": tree(args.before, Path(tmp)), "this tree": None}
        for n in range(args.rounds):
            for protocol in args.protocol or sorted(MODES):
                for label, env in trees.items():
                    r = measure(s, args.calls, protocol, env)
                    print(
                        f"[round {n + 1}, {protocol} protocol, {label}] ungated tools/call, {r.calls} calls: "
                        f"direct p50 {r.direct_p50:.2f} ms (p99 {r.direct_p99:.2f}); through the proxy p50 "
                        f"{r.proxied_p50:.2f} ms (p99 {r.proxied_p99:.2f}); added p50 {r.added_p50:.2f} ms "
                        f"(target ≤ 3); asking Signoff alone p50 {r.signoff_p50:.2f} ms",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
