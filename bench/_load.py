"""A small closed-loop HTTP/1.1 load generator, run in its own process.

``concurrency`` keep-alive connections each send one request, read the whole
response, and send the next, for ``duration`` seconds (after ``warmup``
seconds that are not counted). Requests are pre-encoded bytes; ``%N%`` in the
body is replaced by a number unique to the run, so every request can carry its
own idempotency key. It costs far less CPU per request than httpx or aiohttp,
which matters on a two-core machine where the client shares the CPU with the
server under test.

    python -m bench._load --url http://127.0.0.1:8000/v1/hooks/pre-tool-use \\
        --body '{"tool_name": "x"}' --header 'Authorization: Bearer …' \\
        --concurrency 32 --duration 5 --expect '"decision":"allow"'

Prints one JSON object: requests, errors, seconds, rps, latency p50 / p99 (ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Stats:
    ok: int = 0
    errors: int = 0
    first_error: str | None = None
    latencies: list[float] = field(default_factory=list)


class Connection:
    """One keep-alive connection; ``request`` returns (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None
        assert self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        chunked = False
        close = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            body = b""
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, body


def encode(method: str, url: str, body: bytes | None, headers: list[str]) -> bytes:
    u = urlsplit(url)
    path = u.path + (f"?{u.query}" if u.query else "")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {u.netloc}", *headers]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def run(
    url: str,
    *,
    method: str,
    body: str | None,
    headers: list[str],
    concurrency: int,
    duration: float,
    warmup: float,
    expect: str | None,
    expect_status: int,
) -> dict[str, object]:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    counter = itertools.count()
    templated = body is not None and "%N%" in body
    fixed = encode(method, url, body.encode() if body is not None else None, headers)
    expected = expect.encode() if expect else None
    stats = Stats()
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + warmup
    stop_at = measure_from + duration

    async def worker() -> None:
        conn = Connection(host, port)
        try:
            while True:
                t0 = loop.time()
                if t0 >= stop_at:
                    return
                raw = fixed
                if templated:
                    assert body is not None
                    raw = encode(method, url, body.replace("%N%", str(next(counter))).encode(), headers)
                try:
                    status, answer = await conn.request(raw)
                    good = status == expect_status and (expected is None or expected in answer)
                    problem = None if good else f"HTTP {status}: {answer[:300]!r}"
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    conn.close()
                    good, problem = False, f"{type(exc).__name__}: {exc}"
                t1 = loop.time()
                if t0 < measure_from:
                    continue
                if good:
                    stats.ok += 1
                    stats.latencies.append(t1 - t0)
                else:
                    stats.errors += 1
                    stats.first_error = stats.first_error or problem
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    lat = sorted(stats.latencies) or [0.0]
    return {
        "requests": stats.ok,
        "errors": stats.errors,
        "first_error": stats.first_error,
        "seconds": duration,
        "rps": stats.ok / duration,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--method", default="POST")
    p.add_argument("--body")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--expect", help="a byte string every good answer contains")
    p.add_argument("--expect-status", type=int, default=200)
    args = p.parse_args()
    runner = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    t = time.perf_counter()
    result = runner(
        run(
            args.url,
            method=args.method,
            body=args.body,
            headers=args.header,
            concurrency=args.concurrency,
            duration=args.duration,
            warmup=args.warmup,
            expect=args.expect,
            expect_status=args.expect_status,
        )
    )
    result["wall_seconds"] = time.perf_counter() - t
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
