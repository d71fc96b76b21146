"""``signoff-hook claude-code`` as Claude Code runs it: a new process for every matched call.

- baseline: ``python -c pass`` with the same interpreter and environment, the least any
  Python hook can cost;
- subject: ``signoff-hook claude-code`` for a tool no gate matches, against a running
  server (stdin in, the answer on stdout, exit 0).

Measured twice: as installed in this checkout's virtualenv (editable: the import hook
of the editable install slows every start-up, the baseline's too), and as an agent
installs it, the ``signoff-hooks`` wheel alone in a fresh virtualenv.

Runs alternate (baseline, subject, baseline, …) so that a change in the machine's load
hits both. The ratio is subject median / baseline median (target ≤ 3 for the wheel).

    python -m bench.hook_startup [--db sqlite|postgres] [--runs 40] [--before REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._server import ROOT, Signoff, running_server

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


def wheel_venv(where: Path, source: Path = ROOT) -> Path:
    """A fresh virtualenv with only the ``signoff-hooks`` wheel built from ``source`` (this
    checkout, or a revision's files)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(where / "dist"),
            str(source / "hooks"),
        ],
        check=True,
        timeout=600,
    )
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=300)
    python = where / "venv" / "bin" / "python"
    wheels = [str(w) for w in (where / "dist").glob("signoff_hooks-*.whl")]
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wheels], check=True, timeout=600)
    return python


def measure(s: Signoff, runs: int, python: Path | None = None) -> StartupResult:
    python = python or Path(sys.executable)
    hook_path = python.with_name("signoff-hook")
    env = {**os.environ, "SIGNOFF_URL": s.url, "SIGNOFF_API_KEY": s.key}
    hook: list[float] = []
    bare: list[float] = []
    for i in range(runs + 3):
        b = _timed([str(python), "-c", "pass"], env, "")
        h = _timed([str(hook_path), "claude-code"], env, UNGATED)
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
    p.add_argument("--before", help="a revision whose wheel to measure alongside, alternating (e.g. main)")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    with running_server(args.db) as s, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        subjects: list[tuple[str, Path | None]] = []
        if args.before:
            source = tmp / "before"
            source.mkdir()
            archive = subprocess.run(
                ["git", "archive", args.before, "hooks"], cwd=ROOT, check=True, capture_output=True
            )
            subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
            subjects.append((f"wheel of {args.before}", wheel_venv(tmp / "before-wheel", source)))
        else:
            subjects.append(("editable", None))
        subjects.append(("wheel", wheel_venv(tmp / "wheel")))
        for round_no in range(1, args.rounds + 1):
            for label, python in subjects:
                r = measure(s, args.runs, python)
                print(
                    f"[round {round_no}] {label}: signoff-hook claude-code {r.hook_median_ms:.1f} ms median "
                    f"(p90 {r.hook_p90_ms:.1f}); python -c pass {r.python_median_ms:.1f} ms; "
                    f"ratio {r.ratio:.2f} (target ≤ 3)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
