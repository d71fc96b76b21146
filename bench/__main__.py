"""Every benchmark figure with its same-run baseline and ratio: ``python -m bench`` (``make bench``).

    python -m bench [--quick] [--db sqlite|postgres ...] [--only SECTION ...] [--no-write]

Sections: ``cli`` (``signoff --help`` start-up), ``hook`` (``signoff-hook claude-code``
start-up, editable and as a wheel),
``client`` (agent-side overhead through the client library),
``latency`` (decision → waiter), ``throughput`` (pending creation and the allow
path vs bare FastAPI baselines), ``waiters`` (many concurrent long-polls),
``restart`` (many pending requests), ``mcp`` (what ``signoff-mcp-proxy`` adds to an
ungated ``tools/call``; one database), ``redaction`` (its CPU time per call,
in-process). ``--quick`` runs each briefly (for CI; well under a minute). The table is
printed and, unless ``--no-write``, written between the markers in ``docs/benchmarks.md``
(with the machine it ran on) and as JSON to ``bench/last-run.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import (
    cli_startup,
    client_overhead,
    hook_startup,
    mcp_proxy,
    redaction,
    restart,
    throughput,
    waiters,
    wake_latency,
)
from bench._report import Row, dump_json, machine, markdown, text_table
from bench._server import ROOT, Signoff, baseline, config_with_slack, fake_slack, running_server

SECTIONS = ["cli", "hook", "client", "latency", "throughput", "waiters", "restart", "mcp", "redaction"]
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


@dataclass(frozen=True)
class Plan:
    duration: float
    warmup: float
    rounds: int
    concurrency: int
    wake_rounds: int
    client_calls: int
    hook_runs: int
    waiters: int
    waiter_dbs: tuple[str, ...]
    pending: int
    restart_dbs: tuple[str, ...]
    mcp_calls: int
    redaction_rounds: int


FULL = Plan(
    5.0, 1.0, 3, 32, 300, 500, 40, 10_000, ("sqlite", "postgres"), 100_000, ("sqlite", "postgres"), 1000, 15
)
QUICK = Plan(1.0, 0.3, 1, 32, 30, 50, 10, 300, ("sqlite",), 3_000, ("sqlite",), 50, 3)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def server_sections(db: str, plan: Plan, only: set[str]) -> list[Row]:
    """Client overhead, wake latency and throughput share one server per database."""
    rows: list[Row] = []
    with (
        fake_slack() as slack,
        running_server(db, config=config_with_slack(slack)) as s,
        baseline("echo") as (echo, _),
    ):
        echo_lat = None
        if "hook" in only and db == "sqlite":
            rows += hook_rows(s, plan.hook_runs)
        if "client" in only or "latency" in only:
            log(f"{db}: client overhead ({plan.client_calls} calls)")
            c = client_overhead.measure(s, echo, plan.client_calls)
            echo_lat = c.echo_async
            if "client" in only:
                for label, gate, bare in (
                    ("agent allow call, AsyncGateClient", c.gate_async, c.echo_async),
                    ("agent allow call, GateClient (sync)", c.gate_sync, c.echo_sync),
                ):
                    rows.append(
                        Row(
                            f"{label} p50 / p99",
                            db,
                            f"{gate.p50:.2f} / {gate.p99:.2f} ms",
                            f"{bare.p50:.2f} / {bare.p99:.2f} ms (httpx → echo)",
                            bare.p50 / gate.p50,
                            "",
                            None,
                            "one connection, sequential calls; ratio = echo p50 / gate p50; plain httpx to "
                            f"the same endpoint: {c.raw_async.p50:.2f} ms p50"
                            if "Async" in label
                            else "",
                        )
                    )
        if "latency" in only:
            log(f"{db}: decision → waiter ({plan.wake_rounds} rounds, Slack click and operator API)")
            w = asyncio.run(
                wake_latency.measure(s, plan.wake_rounds, verbose=False, via="slack", slack=slack)
            )
            o = asyncio.run(wake_latency.measure(s, plan.wake_rounds, verbose=False, via="api"))
            assert echo_lat is not None
            p = wake_latency.pct
            for label, v, note in (
                (
                    "signed Slack click → waiter, send → return",
                    w.send_to_return,
                    "the target's definition: from sending the callback to the waiter's full answer; "
                    "includes the callback's own processing "
                    f"(its round trip: p50 {p(w.decision_rtt, 50):.1f} ms)",
                ),
                (
                    "signed Slack click → waiter, commit → return",
                    w.commit_to_return,
                    "from the `approved` audit event's timestamp (taken inside the deciding transaction, "
                    "just before it commits) to the waiter's full answer",
                ),
                (
                    "operator API decision → waiter, send → return",
                    o.send_to_return,
                    "the operator API answers with the request's audit trail, so its round trip is longer "
                    f"(p50 {p(o.decision_rtt, 50):.1f} ms)",
                ),
            ):
                rows.append(
                    Row(
                        f"{label} p50 / p99",
                        db,
                        f"{p(v, 50):.1f} / {p(v, 99):.1f} ms",
                        f"{echo_lat.p50:.1f} / {echo_lat.p99:.1f} ms (echo round trip)",
                        p(v, 50) / echo_lat.p50,
                        "≤ 10 / ≤ 50 ms",
                        p(v, 50) <= 10 and p(v, 99) <= 50,
                        note,
                    )
                )
        if "throughput" in only:
            log(f"{db}: throughput ({plan.rounds} x {plan.duration:g} s per figure)")
            rows += throughput.measure(
                db,
                duration=plan.duration,
                rounds=plan.rounds,
                concurrency=plan.concurrency,
                warmup=plan.warmup,
                server=s,
                echo=echo,
            )
    return rows


def hook_rows(s: Signoff, runs: int) -> list[Row]:
    log(f"hook start-up ({runs} runs each, editable and wheel)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, python in (
            ("editable install", None),
            ("wheel, fresh virtualenv", hook_startup.wheel_venv(Path(tmp))),
        ):
            r = hook_startup.measure(s, runs, python)
            rows.append(
                Row(
                    f"signoff-hook claude-code, ungated tool, median ({label})",
                    "sqlite",
                    f"{r.hook_median_ms:.1f} ms (p90 {r.hook_p90_ms:.1f})",
                    f"{r.python_median_ms:.1f} ms (python -c pass)",
                    r.ratio,
                    "ratio ≤ 3",
                    r.ratio <= 3,
                    "a new process per call, as Claude Code runs it; ratio = hook / python -c pass",
                )
            )
    return rows


def cli_rows(runs: int) -> list[Row]:
    log(f"signoff --help start-up ({runs} runs each)")
    r = cli_startup.measure(runs)
    return [
        Row(
            "signoff --help, median (editable install)",
            "-",
            f"{r.cli_median_ms:.1f} ms (p90 {r.cli_p90_ms:.1f})",
            f"{r.python_median_ms:.1f} ms (python -c pass)",
            r.ratio,
            f"ratio ≤ {cli_startup.TARGET:g}",
            r.ratio <= cli_startup.TARGET,
            "the command line imports nothing of the server it does not use; "
            "ratio = signoff / python -c pass",
        )
    ]


def waiter_rows(db: str, count: int) -> list[Row]:
    log(f"{db}: {count} concurrent waiters")
    r = waiters.measure(db, count, verbose=False)
    label = f"{count // 1000}k" if count >= 1000 else str(count)
    return [
        Row(
            f"{label} concurrent waiters woken correctly",
            db,
            f"{r.woken_correctly} / {r.count}",
            "",
            None,
            "all",
            r.woken_correctly == r.count and not r.problems,
            f"parked in {r.park_seconds:.1f} s, all decided in {r.decide_seconds:.1f} s; "
            + ("; ".join(r.problems[:3]) if r.problems else "no failures"),
        ),
        Row(
            f"{label} concurrent waiters: server RSS",
            db,
            f"{r.rss_parked:.0f} MiB parked ({r.per_waiter_kib:.1f} KiB / waiter)",
            f"{r.rss_before:.0f} MiB idle",
            r.rss_parked / r.rss_before,
            "",
            None,
            f"{r.rss_after:.0f} MiB after all returned",
        ),
    ]


def restart_rows(db: str, pending: int) -> list[Row]:
    log(f"{db}: restart with 0 and {pending} pending")
    zero = restart.measure_one(db, 0)
    many = restart.measure_one(db, pending)
    label = f"{pending // 1000}k" if pending >= 1000 else str(pending)
    return [
        Row(
            f"restart with {label} pending: serving again",
            db,
            f"{many.serving_seconds:.2f} s (ready {many.ready_seconds:.2f} s)",
            f"{zero.serving_seconds:.2f} s with 0 pending",
            many.serving_seconds / zero.serving_seconds,
            "≤ 2 s",
            many.serving_seconds <= 2.0,
            "from spawning `signoff serve` (migrations checked) to a pre-tool-use call creating a request",
        ),
        Row(
            f"restart with {label} pending: RSS",
            db,
            f"{many.rss_mib:.0f} MiB",
            f"{zero.rss_mib:.0f} MiB with 0 pending",
            many.rss_mib / zero.rss_mib,
            "no growth (≤ 1.05)",
            many.rss_mib / zero.rss_mib <= 1.05,
        ),
    ]


def mcp_rows(db: str, calls: int) -> list[Row]:
    log(f"{db}: MCP proxy, {calls} ungated tools/call each way")
    rows = []
    with running_server(db, config=mcp_proxy.config()) as s:
        for protocol in ("current", "handshake"):
            r = mcp_proxy.measure(s, calls, protocol)
            rows.append(
                Row(
                    f"signoff-mcp-proxy: added to an ungated tools/call, p50 ({protocol} protocol)",
                    db,
                    f"{r.added_p50:.2f} ms (proxied {r.proxied_p50:.2f} / {r.proxied_p99:.2f} ms p50 / p99)",
                    f"{r.direct_p50:.2f} / {r.direct_p99:.2f} ms (client → upstream directly)",
                    r.proxied_p50 / r.direct_p50,
                    "≤ 3 ms added",
                    r.added_p50 <= 3,
                    "mcp SDK client over stdio, calls alternating; the proxy asks Signoff (answered allow) "
                    "and reports the call in the background; asking Signoff alone: "
                    f"{r.signoff_p50:.2f} ms p50",
                )
            )
    return rows


def write_doc(table: str) -> None:
    text = DOC.read_text() if DOC.exists() else f"# Benchmarks\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n{START}\n{END}\n"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{table}{END}{tail}")


def main() -> None:
    p = argparse.ArgumentParser(description="Signoff benchmarks against same-run bare baselines.")
    p.add_argument("--quick", action="store_true", help="a short run (CI)")
    p.add_argument("--db", choices=["sqlite", "postgres"], action="append")
    p.add_argument("--only", choices=SECTIONS, action="append")
    p.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = p.parse_args()
    plan = QUICK if args.quick else FULL
    dbs = args.db or ["sqlite", "postgres"]
    only = set(args.only or SECTIONS)
    t0 = time.monotonic()
    rows: list[Row] = []
    if "cli" in only:
        rows += cli_rows(plan.hook_runs)
    for db in dbs:
        if only & {"hook", "client", "latency", "throughput"}:
            rows += server_sections(db, plan, only)
    for db in dbs:
        if "waiters" in only and db in (plan.waiter_dbs if not args.db else dbs):
            rows += waiter_rows(db, plan.waiters)
    for db in dbs:
        if "restart" in only and db in (plan.restart_dbs if not args.db else dbs):
            rows += restart_rows(db, plan.pending)
    if "mcp" in only:
        rows += mcp_rows(dbs[0], plan.mcp_calls)
    if "redaction" in only:
        log(f"redaction per call ({plan.redaction_rounds} rounds)")
        rows += redaction.measure(plan.redaction_rounds)
    info = machine()
    print(text_table(rows))
    log(f"done in {time.monotonic() - t0:.0f} s")
    if not args.no_write:
        write_doc(markdown(rows, info))
        dump_json(rows, info, ROOT / "bench" / "last-run.json")
        log(f"wrote {DOC.relative_to(ROOT)} and bench/last-run.json")
    missed = [r for r in rows if r.met is False]
    if missed:
        log("targets missed: " + "; ".join(f"{r.figure} ({r.db}): {r.measured}" for r in missed))


if __name__ == "__main__":
    main()
