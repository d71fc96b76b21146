"""A Signoff that takes the connection and then says nothing: the call is refused in time, never run.

Signoff's address may answer TCP and then hang (a wedged server, a proxy in front of a
stopped one) or send its answer a byte at a time. The proxy's question is bounded by its
``--submit-deadline``, and a call Signoff said waits is bounded by ``--hold`` even when
the long-poll that follows never answers: the agent hears the refusal (why, and that the
call was not forwarded) well within the client's own timeout, and the upstream sees nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.hooks.signoff_fakes import KEY, LiveSignoff
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (the upstream's fork server, a fixture)
    BIG,
    forkserver,
    proxied,
    text,
)
from tests.redteam.test_mcp_wire_shapes import ran


@contextmanager
def wedged(how: str) -> Iterator[str]:
    """An address that accepts connections and never finishes an answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.05)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)
            if how == "trickle":
                threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    def trickle(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
            while not stop.wait(0.05):
                conn.sendall(b" ")
        except OSError:
            return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("how", ["silent", "trickle"])
async def test_a_signoff_that_never_answers_is_refused_within_the_submit_deadline(
    tmp_path: Path, how: str
) -> None:
    with wedged(how) as url:
        async with proxied(tmp_path, url, KEY, "--submit-deadline", "0.5", "--hold", "0.5") as client:
            started = time.monotonic()
            result = await client.call_tool("echo", {"text": "hi"})
            took = time.monotonic() - started
    assert result.is_error
    assert result.meta == {"signoff/decision": "unavailable"}
    assert text(result).startswith("mcp__up__echo was not run: Signoff could not confirm it")
    assert "The call was not forwarded to the server." in text(result)
    assert took < 3, took
    assert ran(tmp_path) == []


class SilentOnWait(LiveSignoff):
    """Says a call waits, then holds every long-poll open without a word until it stops."""

    def _wait(self, rid: str, timeout: float) -> tuple[int, dict[str, Any]]:
        with self._cond:
            server = self._server
            self._cond.wait_for(lambda: self._server is not server)
        raise ConnectionAbortedError("server stopping")


async def test_a_pending_call_whose_wait_goes_silent_is_answered_within_the_hold(tmp_path: Path) -> None:
    live = SilentOnWait().start()
    try:
        async with proxied(tmp_path, live.url, KEY, "--hold", "1") as client:
            started = time.monotonic()
            result = await client.call_tool("pay_invoice", BIG)
            took = time.monotonic() - started
    finally:
        live.stop()
    (rid,) = live.requests
    assert result.is_error
    assert result.meta == {"signoff/decision": "pending", "signoff/request_id": rid}, text(result)
    assert "the tool has not run" in text(result)
    assert took < 3, took
    assert ran(tmp_path) == []
