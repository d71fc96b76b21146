"""``signoff-hook claude-code`` as Claude Code runs it: a new process for every matched call.

- baseline: ``python -c pass`` with the same interpreter and environment, the least any
  Python hook can cost;
- subject: ``signoff-hook claude-code`` for a tool no gate matches, against a running
  server (stdin in, the answer on stdout, exit 0).

Runs alternate (baseline, subject, baseline, …) so that a change in the machine's load
hits both. The ratio is subject median / baseline median (target ≤ 5).

    python -m bench.hook_startup [--db sqlite|postgres] [--runs 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench._server import Signoff, running_server

HOOK = Path(sys.executable).with_name("signoff-hook")
UNGATED = json.dumps(
    {
        "session_id": "bench",
        "hook_event_name": "PreToolUse",
        "tool_name": "read_file",
        "tool_input": {"path": "/etc/hosts"},
        "tool_use_id": "toolu_bench",
    }
)


@dataclass
class StartupResult:
    hook_median_ms: float
    python_median_ms: float
    hook_p90_ms: float

    @property
    def ratio(self) -> float:
        return self.hook_median_ms / self.python_median_ms


def _timed(args: list[str], env: dict[str, str], stdin: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {done.returncode}: {done.stderr.strip()}")
    return took


def measure(s: Signoff, runs: int) -> StartupResult:
    env = {**os.environ, "SIGNOFF_URL": s.url, "SIGNOFF_API_KEY": s.key}
    hook: list[float] = []
    bare: list[float] = []
    for i in range(runs + 3):
        b = _timed([sys.executable, "-c", "pass"], env, "")
        h = _timed([str(HOOK), "claude-code"], env, UNGATED)
        if i >= 3:  # the first runs warm the page cache
            bare.append(b)
            hook.append(h)
    hook.sort()
    return StartupResult(
        statistics.median(hook) * 1000,
        statistics.median(bare) * 1000,
        hook[int(len(hook) * 0.9)] * 1000,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--runs", type=int, default=40)
    args = p.parse_args()
    with running_server(args.db) as s:
        r = measure(s, args.runs)
    print(
        f"signoff-hook claude-code: {r.hook_median_ms:.1f} ms median (p90 {r.hook_p90_ms:.1f}); "
        f"python -c pass: {r.python_median_ms:.1f} ms; ratio {r.ratio:.2f} (target ≤ 5)"
    )


if __name__ == "__main__":
    main()
