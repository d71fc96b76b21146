"""``signoff --help`` beside ``python -c pass``: what the command line costs before it does
anything (it imports nothing of the server it does not use).

Runs alternate (baseline, subject, baseline, …) in the same run, so that a change in the
machine's load hits both; the ratio is subject median / baseline median (target ≤ 6).

    python -m bench.cli_startup [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TARGET = 6.0


@dataclass
class CliStartup:
    cli_median_ms: float
    python_median_ms: float
    cli_p90_ms: float

    @property
    def ratio(self) -> float:
        return self.cli_median_ms / self.python_median_ms


def _timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} exited {done.returncode}: {done.stderr.strip()}")
    return took


def measure(runs: int) -> CliStartup:
    python = Path(sys.executable)
    signoff = python.with_name("signoff")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    cli: list[float] = []
    bare: list[float] = []
    for i in range(runs + 3):
        b = _timed([str(python), "-c", "pass"], env)
        c = _timed([str(signoff), "--help"], env)
        if i >= 3:  # the first runs warm the page cache
            bare.append(b)
            cli.append(c)
    cli.sort()
    return CliStartup(
        statistics.median(cli) * 1000, statistics.median(bare) * 1000, cli[int(len(cli) * 0.9)] * 1000
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    r = measure(args.runs)
    print(
        f"signoff --help {r.cli_median_ms:.1f} ms median (p90 {r.cli_p90_ms:.1f}); "
        f"python -c pass {r.python_median_ms:.1f} ms; ratio {r.ratio:.2f} (target ≤ {TARGET:g})"
    )


if __name__ == "__main__":
    main()
