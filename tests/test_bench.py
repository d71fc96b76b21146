"""The benchmarks still measure what they say: a bench whose requests no one may decide any
more measures nothing (its waiters are never woken). Behaviour only; the figures are the
bench's own (docs/benchmarks.md)."""

from __future__ import annotations

from bench.waiters import measure


def test_the_waiters_bench_wakes_every_waiter_by_its_decision() -> None:
    result = measure("sqlite", 40, verbose=False)
    assert (result.woken_correctly, result.wrong, result.failed, result.problems) == (40, 0, 0, [])
