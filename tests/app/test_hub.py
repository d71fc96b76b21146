"""The waiters of one process (``signoff.app.waiters.Hub``): every waiter is woken by its own
request's decision, by the drain, or by its timeout, which shares a timer with the others
ending in the same tick and never ends after the timeout it asked for; a waiter that leaves
leaves nothing behind."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from signoff.app.waiters import TICK, Hub

# (request, timeout or None, decided before its timeout, leaves early)
Waiter = tuple[str, float | None, bool, bool]
WAITERS = st.lists(
    st.tuples(
        st.sampled_from(["r1", "r2", "r3"]),
        st.one_of(st.none(), st.floats(0.001, 0.15)),
        st.booleans(),
        st.booleans(),
    ),
    max_size=12,
)


async def _run(waiters: list[Waiter]) -> None:
    hub: Hub[str] = Hub()
    loop = asyncio.get_running_loop()
    woke: dict[int, float] = {}
    subscribed = []
    for n, (rid, timeout, decided, leaves) in enumerate(waiters):
        woken, tick = hub.subscribe(rid, timeout)
        woken.add_done_callback(lambda _, n=n: woke.setdefault(n, loop.time()))
        subscribed.append((n, rid, timeout, decided, leaves, loop.time(), woken, tick))
    assert hub.waiting == len(waiters)
    timed = {tick for *_, tick in subscribed if tick is not None}
    assert set(hub._ticks) == timed  # one timer a tick, however many waits end in it

    # The ones leaving go now (their client hung up: the future is cancelled, then unsubscribed).
    for _, rid, _, _, leaves, _, woken, tick in subscribed:
        if leaves:
            woken.cancel()
            hub.unsubscribe(rid, woken, tick)
    staying = [w for w in subscribed if not w[4]]
    assert hub.waiting == len(staying)

    # Requests every staying waiter on which asked to be decided are decided now.
    decide = {rid for _, rid, _, decided, *_ in staying if decided}
    hub.notify(sorted(decide), {rid: f"answer {rid}" for rid in decide})
    for n, rid, timeout, _, _, start, woken, tick in staying:
        if rid in decide:
            assert woken.result() == f"answer {rid}"
        elif timeout is None:
            assert not woken.done()
        else:
            await woken
            await asyncio.sleep(0)  # its done callbacks run in the loop's next turn
            assert woken.result() is None
            waited = woke[n] - start
            assert waited <= timeout + 0.02, "a timeout ended after the time asked for"
            assert waited >= timeout - TICK - 0.02
        hub.unsubscribe(rid, woken, tick)
    assert hub.waiting == 0
    assert not hub._waiters
    await asyncio.sleep(max((w[1] or 0 for w in waiters), default=0) + TICK)
    assert not hub._ticks, "a tick outlived its timer"


@settings(max_examples=30, deadline=None)
@given(waiters=WAITERS)
def test_each_waiter_ends_by_its_decision_or_in_time_and_leaves_nothing_behind(waiters: list[Waiter]) -> None:
    asyncio.run(_run(waiters))


async def test_the_drain_wakes_lone_and_shared_waiters_and_parks_no_more() -> None:
    hub: Hub[str] = Hub()
    lone, _ = hub.subscribe("r1", 30)
    first, _ = hub.subscribe("r2")
    second, _ = hub.subscribe("r2", 30)
    assert hub.drain() == 3
    assert [lone.result(), first.result(), second.result()] == [None, None, None]
    late, _ = hub.subscribe("r3")
    assert late.done()


async def test_a_thousand_waits_ending_together_share_their_timers() -> None:
    hub: Hub[str] = Hub()
    subscribed = [hub.subscribe(f"r{n}", 5.0) for n in range(1000)]
    ticks = {tick for _, tick in subscribed}
    assert set(hub._ticks) == ticks
    assert sum(len(waits) for waits in hub._ticks.values()) == 1000
    for n, (woken, tick) in enumerate(subscribed):
        hub.unsubscribe(f"r{n}", woken, tick)
    assert hub.waiting == 0
