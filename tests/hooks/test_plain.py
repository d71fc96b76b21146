"""The plain HTTP shells, against a raw loopback server that answers with exactly the bytes each
test scripts (split, chunked, slow, broken): the socket one the Claude Code hook uses, and the
asyncio one the MCP proxy uses."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signoff.hooks._gate import HttpCall, HttpReply, TransportFailure
from signoff.hooks._plain import BadResponse, PlainGateClient, ResponseParser
from signoff.hooks._plain_async import AsyncPlainGateClient


class Raw:
    """Accepts connections; for each request read, sends the next scripted answer in pieces."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/base"
        self.answers: list[list[bytes]] = []
        self.pause = 0.0
        self.hang_up = False
        """Close each connection after one answer, as a server whose keep-alive timed out."""
        self.requests: list[bytes] = []
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            while self.answers:
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(h.split(b":")[1])
                            for h in head.split(b"\r\n")
                            if h.lower().startswith(b"content-length")
                        ),
                        0,
                    )
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + rest)
                    pieces = self.answers.pop(0)
                    for piece in pieces:
                        conn.sendall(piece)
                        if self.pause:
                            time.sleep(self.pause)
                    if not pieces:
                        return  # close without answering
                    answer = b"".join(pieces)
                    if answer.startswith(b"HTTP/1.0") or b"Connection: close" in answer or self.hang_up:
                        return  # a body read to the close ends with the connection
                except OSError:
                    return

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # the accept returns at once, not at its timeout
        self._thread.join()
        self.listener.close()


@pytest.fixture
def raw() -> Iterator[Raw]:
    server = Raw()
    yield server
    server.close()


Exchange = Callable[[HttpCall], HttpReply | TransportFailure]
Connect = Callable[[str], AbstractContextManager[Exchange]]


@contextmanager
def sync_shell(url: str) -> Iterator[Exchange]:
    with PlainGateClient(url, "key-1", backoff_initial=0.01, backoff_max=0.02) as c:
        yield c._exchange


@contextmanager
def async_shell(url: str) -> Iterator[Exchange]:
    """The asyncio shell, each exchange run to its end on one event loop (connections kept)."""
    loop = asyncio.new_event_loop()
    c = AsyncPlainGateClient(url, "key-1", backoff_initial=0.01, backoff_max=0.02)
    try:
        yield lambda call: loop.run_until_complete(c._exchange(call))
    finally:
        loop.run_until_complete(c.aclose())
        loop.close()


@pytest.fixture(params=["sync", "async"])
def client(request: pytest.FixtureRequest) -> Connect:
    return sync_shell if request.param == "sync" else async_shell


POST = HttpCall("POST", "/v1/hooks/pre-tool-use", 5.0, body=b'{"tool_name": "t"}')


def test_a_request_carries_the_key_the_body_and_the_path_prefix(raw: Raw, client: Connect) -> None:
    raw.answers = [[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]]
    with client(raw.url) as exchange:
        reply = exchange(POST)
    assert reply == HttpReply(200, b"{}", None)
    head = raw.requests[0].decode()
    assert head.startswith("POST /base/v1/hooks/pre-tool-use HTTP/1.1\r\n")
    assert "Authorization: Bearer key-1\r\n" in head
    assert "Content-Length: 18\r\n" in head
    assert raw.requests[0].endswith(b'\r\n\r\n{"tool_name": "t"}')


def test_one_connection_is_kept_for_the_calls_that_follow(raw: Raw, client: Connect) -> None:
    answer = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    raw.answers = [answer, answer, answer]
    with client(raw.url) as exchange:
        replies = [exchange(POST) for _ in range(3)]
    assert all(r == HttpReply(200, b"{}", None) for r in replies)
    assert raw.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{}",
        b"HTTP/1.0 200 OK\r\n\r\n{}",
    ],
    ids=["connection-close", "http-1.0"],
)
def test_a_response_read_to_the_close(raw: Raw, client: Connect, answer: bytes) -> None:
    raw.answers = [[answer], [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]"]]
    with client(raw.url) as exchange:
        assert exchange(POST) == HttpReply(200, b"{}", None)
        assert exchange(POST) == HttpReply(200, b"[]", None)
    assert raw.connections == 2


@pytest.mark.parametrize("settle", [0.05, 0.0], ids=["closed-while-idle", "closing-as-reused"])
def test_a_kept_connection_the_server_closed_is_replaced_at_once(raw: Raw, settle: float) -> None:
    raw.hang_up = True
    answer = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    raw.answers = [answer, answer, answer]
    with async_shell(raw.url) as exchange:
        for _ in range(3):
            assert exchange(POST) == HttpReply(200, b"{}", None)
            time.sleep(settle)
    assert raw.connections == 3


def test_retry_after_and_an_interim_answer(raw: Raw, client: Connect) -> None:
    raw.answers = [
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"]
    ]
    with client(raw.url) as exchange:
        assert exchange(POST) == HttpReply(503, b"", 7.0)


@pytest.mark.parametrize(
    "answer",
    [
        [],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}"],
        [b"SSH-2.0-OpenSSH_9\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
        [b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 * 1024)],
    ],
    ids=["closed", "short-body", "not-http", "bad-header", "bad-length", "bad-chunk", "huge-head"],
)
def test_broken_answers_are_transport_failures(raw: Raw, client: Connect, answer: list[bytes]) -> None:
    raw.answers = [answer]
    with client(raw.url) as exchange:
        reply = exchange(POST)
    assert isinstance(reply, TransportFailure)


def test_an_exchange_is_bounded_as_a_whole(raw: Raw, client: Connect) -> None:
    raw.answers = [[bytes([b]) for b in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]]
    raw.pause = 0.1  # every byte within a socket timeout, the whole far beyond the exchange's
    started = time.monotonic()
    with client(raw.url) as exchange:
        reply = exchange(HttpCall("GET", "/v1/requests/r/wait", 1.0))
    assert isinstance(reply, TransportFailure)
    assert reply.kind == "timeout"
    assert time.monotonic() - started < 2.0


def test_nothing_listening_is_refused(client: Connect) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with client(f"http://127.0.0.1:{port}") as exchange:
        reply = exchange(POST)
    assert isinstance(reply, TransportFailure)
    assert reply.kind == "refused"


def encode_chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = b"", 0
    for size in sizes:
        piece = body[at : at + size]
        if not piece:
            break
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
        at += len(piece)
    if at < len(body):
        out += f"{len(body) - at:X}\r\n".encode() + body[at:] + b"\r\n"
    return out + b"0\r\nTrailer: x\r\n\r\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=3000),
    chunked=st.booleans(),
    sizes=st.lists(st.integers(1, 700), max_size=8),
    cuts=st.lists(st.integers(1, 4000), max_size=6),
)
def test_any_framing_and_any_split_gives_the_same_body(
    raw: Raw, client: Connect, body: bytes, chunked: bool, sizes: list[int], cuts: list[int]
) -> None:
    if chunked:
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + encode_chunked(body, sizes)
    else:
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    points = sorted({c for c in cuts if c < len(wire)})
    pieces = [wire[a:b] for a, b in zip([0, *points], [*points, len(wire)], strict=True)]
    raw.answers = [pieces, [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]]
    with client(raw.url) as exchange:
        assert exchange(POST) == HttpReply(200, body, None)
        assert exchange(POST) == HttpReply(200, b"ok", None), "the next answer on the same connection"


def test_the_shared_parser_frames_a_response_fed_a_byte_at_a_time() -> None:
    """Without any I/O: an interim answer skipped, a chunked body, the next pipelined answer kept."""
    body = encode_chunked(b"hello world", [5, 1])
    wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    parser = ResponseParser()
    complete = [parser.feed(wire[i : i + 1]) for i in range(len(wire))]
    assert complete == [False] * (len(wire) - 1) + [True]
    assert parser.feed(b"HTTP/1.1 204")
    assert (parser.status, parser.body, parser.leftover) == (200, b"hello world", b"HTTP/1.1 204")

    to_close = ResponseParser()
    assert not to_close.feed(b"HTTP/1.0 200 OK\r\n\r\n{}")
    assert to_close.feed_eof()
    assert (to_close.old, to_close.body) == (True, b"{}")

    cut = ResponseParser()
    assert not cut.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}")
    with pytest.raises(BadResponse, match="connection closed mid-body"):
        cut.feed_eof()
