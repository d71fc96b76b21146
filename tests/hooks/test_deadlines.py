"""Every client gives up by its own deadline, whatever the server does: silent, trickling a byte
at a time through the head or the body, or answering garbage slowly."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from signoff.hooks._plain import PlainGateClient
from signoff.hooks.client import AsyncGateClient, GateClient, GateFailure
from signoff.hooks.decorator import gate

DEADLINE = 0.5
MARGIN = 1.0
"""Beyond the deadline: the scheduling of a loaded machine (no exchange outlives the deadline)."""

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
BEHAVIOURS = {
    "silent": b"",
    "trickled-head": HEAD,
    "trickled-body": HEAD[:-4] + b"\r\n\r\n" + b"{" * 100000,
}


class Misbehaving:
    """A loopback server that reads a request, then sends ``script`` one byte per ``gap``."""

    def __init__(self, script: bytes, gap: float = 0.1) -> None:
        self.script, self.gap = script, gap
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                if not self.script:
                    self.stopped.wait()
                for byte in self.script:
                    if self.stopped.wait(self.gap):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.fixture(params=list(BEHAVIOURS), ids=list(BEHAVIOURS))
def misbehaving(request: pytest.FixtureRequest) -> Iterator[Misbehaving]:
    server = Misbehaving(BEHAVIOURS[request.param])
    yield server
    server.close()


FAST = {"backoff_initial": 0.05, "backoff_max": 0.1}


def test_the_sync_client_gives_up_by_its_deadline(misbehaving: Misbehaving) -> None:
    started = time.monotonic()
    with GateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST) as client:
        decision = client.pre_tool_use("pay_invoice", {"amount": 90000})
    assert time.monotonic() - started <= DEADLINE + MARGIN
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE


def test_the_plain_client_gives_up_by_its_deadline(misbehaving: Misbehaving) -> None:
    started = time.monotonic()
    with PlainGateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST) as client:
        decision = client.pre_tool_use("pay_invoice", {"amount": 90000})
    assert time.monotonic() - started <= DEADLINE + MARGIN
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE


async def test_the_async_client_gives_up_by_its_deadline(misbehaving: Misbehaving) -> None:
    started = time.monotonic()
    async with AsyncGateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST) as client:
        decision = await client.pre_tool_use("pay_invoice", {"amount": 90000})
    assert time.monotonic() - started <= DEADLINE + MARGIN
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE


def test_a_gated_function_never_runs_against_a_misbehaving_server(misbehaving: Misbehaving) -> None:
    ran: list[int] = []
    client = GateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST)

    @gate(client)
    def pay_invoice(amount: int) -> None:
        ran.append(amount)

    started = time.monotonic()
    with pytest.raises(Exception, match="Signoff"):
        pay_invoice(amount=90000)
    assert time.monotonic() - started <= DEADLINE + MARGIN
    assert ran == []
    client.close()


def test_a_sync_client_shared_by_threads_recovers_after_an_aborted_exchange(misbehaving: Misbehaving) -> None:
    # The watchdog closes the client's connections; the same client must still work afterwards.
    with GateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST) as client:
        first = client.pre_tool_use("t", {})
        second = client.pre_tool_use("t", {})
    assert first.failure is second.failure is GateFailure.UNAVAILABLE


async def test_many_async_calls_at_once_all_give_up(misbehaving: Misbehaving) -> None:
    started = time.monotonic()
    async with AsyncGateClient(misbehaving.url, "k", deadline=DEADLINE, **FAST) as client:
        decisions = await asyncio.gather(*(client.pre_tool_use("t", {"i": i}) for i in range(10)))
    assert time.monotonic() - started <= DEADLINE + MARGIN
    assert not any(d.allowed for d in decisions)
