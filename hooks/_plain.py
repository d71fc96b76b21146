"""A synchronous gate client over a plain socket, for ``http://`` URLs.

The Claude Code hook is a new process for every gated tool call, so what it imports
is what the user waits for. httpx, and even the standard library's ``http.client``
(which pulls in the ``email`` package and ``ssl``), cost several times a bare Python
start-up on the machines measured in ``bench/``; so this shell speaks the little
HTTP/1.1 the gate needs itself: one keep-alive connection, requests with a
``Content-Length``, responses with a ``Content-Length``, chunked or read to the close.
Every exchange is bounded as a whole by its timeout, however slowly the server
answers. ``https://`` URLs go through :class:`signoff.hooks.client.GateClient`.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlencode, urlsplit

from signoff.hooks._base import SyncGateClient, parse_retry_after
from signoff.hooks._gate import (
    CONNECT_TIMEOUT,
    DEFAULT_DEADLINE,
    DEFAULT_POLL_TIMEOUT,
    GateConfigError,
    HttpCall,
    HttpReply,
    TransportFailure,
    transport_failure,
)

__all__ = ["MAX_BODY", "MAX_HEAD", "BadResponse", "PlainGateClient", "parse_head", "request_bytes"]

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response this client can read."""


class _Reader:
    """Reads one response from a socket, never past ``deadline`` (a monotonic time)."""

    def __init__(self, sock: socket.socket, deadline: float, pending: bytes = b"") -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = pending

    def _fill(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("Signoff's answer did not arrive in time")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def until(self, marker: bytes, limit: int) -> bytes:
        while (end := self.buffer.find(marker)) < 0:
            if len(self.buffer) > limit:
                raise BadResponse("response head too large")
            if not self._fill():
                raise BadResponse("connection closed mid-response")
        line, self.buffer = self.buffer[:end], self.buffer[end + len(marker) :]
        return line

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise BadResponse("connection closed mid-body")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def to_close(self) -> bytes:
        while self._fill():
            if len(self.buffer) > MAX_BODY:
                raise BadResponse("response body too large")
        data, self.buffer = self.buffer, b""
        return data


def _head(reader: _Reader) -> tuple[int, bool, dict[str, str]]:
    return parse_head(reader.until(b"\r\n\r\n", MAX_HEAD))


def parse_head(raw: bytes) -> tuple[int, bool, dict[str, str]]:
    """Status, whether HTTP/1.0, and the lower-cased headers of a response head (no blank line)."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadResponse(f"malformed header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(code), version == "HTTP/1.0", headers


def _body(reader: _Reader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = reader.until(b"\r\n", 1024).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise BadResponse(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                while reader.until(b"\r\n", MAX_HEAD):  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise BadResponse("response body too large")
            parts.append(reader.exactly(size))
            reader.exactly(2)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_BODY:
            raise BadResponse(f"bad Content-Length {length[:20]!r}")
        return reader.exactly(int(length))
    return reader.to_close()


def request_bytes(call: HttpCall, prefix: str, host: str, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 request, head and body in one piece (one write on the wire)."""
    target = prefix + call.path
    if call.params:
        target += "?" + urlencode(dict(call.params))
    lines = [f"{call.method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    body = call.body or b""
    if call.body is not None or call.method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class PlainGateClient(SyncGateClient):
    """:class:`~signoff.hooks.client.GateClient`'s behaviour over a plain socket (``http://`` only)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        deadline: float = DEFAULT_DEADLINE,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        cancel_on_deadline: bool = False,
        runtime: str = "python",
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        submit_deadline: float | None = None,
    ) -> None:
        super().__init__(
            url,
            api_key,
            deadline=deadline,
            poll_timeout=poll_timeout,
            cancel_on_deadline=cancel_on_deadline,
            runtime=runtime,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            submit_deadline=submit_deadline,
        )
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise GateConfigError(f"PlainGateClient needs an http:// URL, got {self.url!r}")
        try:
            self._port = parts.port or 80
        except ValueError as exc:
            raise GateConfigError(f"bad port in {self.url!r}: {exc}") from None
        self._host = parts.hostname
        self._host_header = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self._sock: socket.socket | None = None
        self._leftover = b""

    def _request(self, call: HttpCall) -> bytes:
        return request_bytes(call, self._prefix, self._host_header, self.call_headers(call))

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        deadline = time.monotonic() + call.timeout
        try:
            if self._sock is None:
                self._sock = socket.create_connection(
                    (self._host, self._port), timeout=min(CONNECT_TIMEOUT, call.timeout)
                )
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = self._sock
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(self._request(call))
            reader = _Reader(sock, deadline, self._leftover)
            status, old, headers = _head(reader)
            while 100 <= status < 200:  # an interim answer: the real one follows
                status, old, headers = _head(reader)
            body = _body(reader, headers)
            self._leftover = reader.buffer
            if old or "close" in headers.get("connection", "").lower():
                self.close()
            return HttpReply(status, body, parse_retry_after(headers.get("retry-after")))
        except (OSError, BadResponse) as exc:
            self.close()
            return transport_failure(exc)
        except BaseException:
            self.close()  # interrupted mid-exchange (a signal): the connection's state is unknown
            raise

    def close(self) -> None:
        """Close the connection."""
        sock, self._sock, self._leftover = self._sock, None, b""
        if sock is not None:
            sock.close()
