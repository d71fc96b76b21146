"""Profile a hot path of a real ``signoff serve`` process under load with py-spy.

    python -m bench.profile allow|pending [--db sqlite|postgres] [--seconds 10] [--top 40]

Starts the server, drives the path with :mod:`bench._load` (32 connections),
samples the server with ``py-spy record --format raw`` (needs ``py-spy`` and
ptrace rights), and prints the functions with the largest share of samples,
inclusive ("total") and exclusive ("self"). ``--out FILE`` keeps the collapsed
stacks (for flamegraph tools or speedscope).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench._server import ALLOW_BODY, PENDING_BODY, running_server
from bench.throughput import load


def summarise(raw: Path, top: int) -> str:
    total: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = stack.split(";")
        samples += n
        seen = set()
        for f in frames:
            if f not in seen:
                total[f] += n
                seen.add(f)
        own[frames[-1]] += n
    out = [f"{samples} samples", "", "inclusive:"]
    out += [f"{100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    out += ["", "self:"]
    out += [f"{100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path", choices=["allow", "pending"])
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--out", type=Path)
    p.add_argument("--gil", action="store_true", help="only samples holding the GIL (CPU in Python)")
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        sys.exit("bench.profile needs py-spy, which is not installed: pip install py-spy (into this venv)")
    with running_server(args.db) as s, tempfile.TemporaryDirectory() as tmp:
        raw = args.out or Path(tmp) / "raw.txt"
        body = ALLOW_BODY if args.path == "allow" else PENDING_BODY
        expect = '"decision":"allow"' if args.path == "allow" else '"decision":"pending"'
        driver = threading.Thread(
            target=load,
            args=(f"{s.url}/v1/hooks/pre-tool-use", body),
            kwargs={
                "headers": s.agent_headers,
                "concurrency": 32,
                "duration": args.seconds + 1,
                "warmup": 0.5,
                "expect": expect,
            },
        )
        driver.start()
        assert s.proc is not None
        cmd = [spy, "record", "--pid", str(s.proc.pid), "--duration", str(int(args.seconds)), "--rate", "400"]
        cmd += ["--format", "raw", "--output", str(raw), "--nonblocking"]
        if args.gil:
            cmd.append("--gil")
        subprocess.run(cmd, check=True, capture_output=True)
        driver.join()
        print(summarise(raw, args.top))


if __name__ == "__main__":
    main()
