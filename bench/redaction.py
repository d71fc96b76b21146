"""What redaction costs per request: ``Redactor.value`` on typical gated calls' arguments.

Every request's arguments are redacted once, in the server's process, before anything is
stored, so the figure is in-process CPU time per call (no server, no database):

- baseline: ``json.loads`` of the same arguments as the agent sends them, the least work
  any request does with them;
- subject: the default redactor on the parsed arguments (built and warmed first, as in a
  running server).

Timings are CPU time (``time.process_time``: the time other processes take the core is not
counted) and alternate (baseline, subject, baseline, …) so that a change in the machine's
load hits both; each figure is the median over rounds, and the ratio is subject / baseline.
``--against REV`` also times ``app/redaction.py`` as it was at a git revision (loaded on
its own, with the same words), alternating with the current one.

    python -m bench.redaction [--rounds 15] [--against main]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._report import Row, text_table
from bench._server import ROOT
from signoff.app.config import DEFAULT_REDACT
from signoff.app.redaction import redactor

CALLS: dict[str, dict[str, Any]] = {
    "Bash, curl with a password": {
        "command": "curl -u alice:S3cr3tPassw0rd -H 'Accept: application/json' "
        "https://api.example.com/v1/items?page=2 | jq '.items[] | .id'",
        "description": "List the items",
        "timeout": 120000,
    },
    "Bash, a command with no secret": {
        "command": "git log --oneline -20 && .venv/bin/pytest -q -x tests/app/test_x.py -k 'slow and not db'",
        "description": "Run the slow tests",
    },
    "payment, text and headers": {
        "amount": 90000,
        "currency": "EUR",
        "vendor": "ACME GmbH",
        "memo": "Invoice 2026-114 for the October consulting work, see https://erp.example.com/inv/2026-114",
        "headers": {"Authorization": "Bearer 0a1b2c3d4e5f6a7b8c9d", "Accept": "application/json"},
    },
    "argv list": {
        "argv": [
            "docker",
            "run",
            "--rm",
            "-e",
            "MODE=prod",
            "-v",
            "/srv:/srv",
            "registry.example.com/app:1.4",
        ],
    },
}
WORDS = frozenset(DEFAULT_REDACT)


def _per_call(fn: Callable[[], Any], number: int) -> float:
    return timeit.timeit(fn, number=number, timer=time.process_time) / number * 1e6


def alternate(subjects: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, float]:
    """Median µs per call of each of ``subjects``, timed in turn in every round."""
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for fn in subjects.values():
        fn()
    for _ in range(rounds):
        for name, fn in subjects.items():
            times[name].append(_per_call(fn, number))
    return {name: statistics.median(t) for name, t in times.items()}


def _module_at(rev: str) -> Any:
    """``app/redaction.py`` as it was at ``rev``, loaded as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:app/redaction.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "redaction_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("redaction_at_rev", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measure(rounds: int = 15, number: int = 2000, against: str | None = None) -> list[Row]:
    current = redactor(WORDS)
    before = _module_at(against).Redactor(WORDS) if against else None
    rows = []
    for label, arguments in CALLS.items():
        body = json.dumps(arguments)
        subjects: dict[str, Callable[[], Any]] = {
            "json": lambda body=body: json.loads(body),
            "now": lambda a=arguments: current.value(a),
        }
        if before is not None:
            subjects["before"] = lambda a=arguments: before.value(a)
        t = alternate(subjects, rounds, number)
        note = f"{rounds} rounds of {number} calls, median; ratio = redaction / json.loads"
        if before is not None:
            note += f"; at {against}: {t['before']:.1f} µs ({t['now'] / t['before']:.2f}x now / then)"
        rows.append(
            Row(
                f"redaction per call: {label}",
                "none",
                f"{t['now']:.1f} µs",
                f"{t['json']:.1f} µs (json.loads of the arguments)",
                t["now"] / t["json"],
                "",
                None,
                note,
            )
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--number", type=int, default=2000)
    p.add_argument("--against", help="also time app/redaction.py at this git revision")
    args = p.parse_args()
    rows = measure(args.rounds, args.number, args.against)
    print(text_table(rows))
    for r in rows:
        print(f"- {r.figure}: {r.note}")


if __name__ == "__main__":
    main()
