"""Rows of the benchmark table, the machine they ran on, and the Markdown they become."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Row:
    figure: str
    db: str
    measured: str
    baseline: str
    ratio: float | None
    target: str
    met: bool | None
    note: str = ""

    def cells(self) -> list[str]:
        ratio = "" if self.ratio is None else f"{self.ratio:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[self.met]
        return [self.figure, self.db, self.measured, self.baseline, ratio, self.target, met]


HEADER = ["figure", "db", "measured", "baseline (same run)", "ratio", "target", "met"]


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = ""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, capture_output=True, text=True, check=False).stdout.strip()
        if commit and dirty:
            commit += " with uncommitted changes"
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "commit": commit,
        "argv": " ".join(["python -m bench", *sys.argv[1:]]),
    }


def markdown(rows: list[Row], info: dict[str, str]) -> str:
    lines = [
        f"Run {info['date']} on {info['nproc']} x {info['cpu']}, Python {info['python']}, "
        f"{info['os']}, commit {info['commit'] or '?'} (`{info['argv']}`).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    notes = [f"- {r.figure} ({r.db}): {r.note}" for r in rows if r.note]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def text_table(rows: list[Row]) -> str:
    table = [HEADER, *(r.cells() for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    out = []
    for n, row in enumerate(table):
        out.append("  ".join(cell.replace("**", "").ljust(w) for cell, w in zip(row, widths, strict=True)))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def dump_json(rows: list[Row], info: dict[str, str], path: Path) -> None:
    path.write_text(json.dumps({"machine": info, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
