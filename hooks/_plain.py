"""A synchronous gate client over a plain socket, for ``http://`` URLs.

The Claude Code hook is a new process for every gated tool call, so what it imports
is what the user waits for. httpx, and even the standard library's ``http.client``
(which pulls in the ``email`` package and ``ssl``), cost several times a bare Python
start-up on the machines measured in ``bench/``; so this shell speaks the little
HTTP/1.1 the gate needs itself: one keep-alive connection, requests with a
``Content-Length``, responses with a ``Content-Length``, chunked or read to the close
(framed by :class:`ResponseParser`, which the asyncio shell shares). Every exchange is
bounded as a whole by its timeout, however slowly the server answers. ``https://`` URLs
go through :class:`signoff.hooks.client.GateClient`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

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

__all__ = [
    "MAX_BODY",
    "MAX_HEAD",
    "BadResponse",
    "PlainGateClient",
    "ResponseParser",
    "parse_head",
    "request_bytes",
]

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response this client can read."""


class ResponseParser:
    """One HTTP/1.1 response, parsed from the bytes fed to it, without I/O.

    Both plain shells feed it what they read (the socket one here, the asyncio one in
    :mod:`signoff.hooks._plain_async`) until :meth:`feed` says the response is complete.
    Interim (1xx) answers are skipped; the body is framed by ``Transfer-Encoding:
    chunked``, a ``Content-Length`` or the end of the connection (:meth:`feed_eof`).
    Bytes past the response, the start of a pipelined one, stay in :attr:`leftover`.
    """

    def __init__(self) -> None:
        self.status = 0
        self.old = False
        """Whether the server answered HTTP/1.0 (no keep-alive)."""
        self.headers: dict[str, str] = {}
        self.started = False
        """Whether any byte of the answer has arrived."""
        self._buffer = b""
        self._parts: list[bytes] = []
        self._total = 0
        self._need = 0
        self._step: Callable[[], bool] | None = self._head
        """What the parser waits for (each step says whether it advanced); ``None`` once complete."""

    @property
    def body(self) -> bytes:
        return b"".join(self._parts)

    @property
    def leftover(self) -> bytes:
        return self._buffer

    def feed(self, data: bytes) -> bool:
        """Take the next bytes read; whether the response is now complete.

        Raises:
            BadResponse: The bytes are not a response this parser can read.
        """
        if data:
            self.started = True
            self._buffer += data
        while self._step is not None:
            if not self._step():
                return False
        return True

    def feed_eof(self) -> bool:
        """The connection closed: that ends a body read to the close (True), and is an error elsewhere.

        Raises:
            BadResponse: The response was not complete.
        """
        if self._step == self._to_close:
            self._parts.append(self._buffer)
            self._buffer = b""
            self._step = None
        elif self._step is not None:
            where = "response" if self._step == self._head else "body"
            raise BadResponse(f"connection closed mid-{where}")
        return True

    def _line(self, limit: int, what: str) -> bytes | None:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > limit:
                raise BadResponse(f"{what} too large")
            return None
        line, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
        return line

    def _head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise BadResponse("response head too large")
            return False
        raw, self._buffer = self._buffer[:end], self._buffer[end + 4 :]
        self.status, self.old, self.headers = parse_head(raw)
        if 100 <= self.status < 200:
            return True  # an interim answer: the real one follows
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._step = self._chunk_size
        elif (length := self.headers.get("content-length")) is not None:
            if not length.isdigit() or int(length) > MAX_BODY:
                raise BadResponse(f"bad Content-Length {length[:20]!r}")
            self._need = int(length)
            self._step = self._sized
        else:
            self._step = self._to_close
        return True

    def _sized(self) -> bool:
        if len(self._buffer) < self._need:
            return False
        self._parts.append(self._buffer[: self._need])
        self._buffer = self._buffer[self._need :]
        self._step = None
        return True

    def _chunk_size(self) -> bool:
        line = self._line(1024, "chunk size line")
        if line is None:
            return False
        size_line = line.split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise BadResponse(f"bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            self._step = self._trailers
            return True
        self._total += size
        if self._total > MAX_BODY:
            raise BadResponse("response body too large")
        self._need = size
        self._step = self._chunk
        return True

    def _chunk(self) -> bool:
        if len(self._buffer) < self._need + 2:
            return False
        self._parts.append(self._buffer[: self._need])
        self._buffer = self._buffer[self._need + 2 :]
        self._step = self._chunk_size
        return True

    def _trailers(self) -> bool:
        line = self._line(MAX_HEAD, "trailers")
        if line is None:
            return False
        if not line:  # the empty line ends the trailers, and the response
            self._step = None
        return True

    def _to_close(self) -> bool:
        if len(self._buffer) > MAX_BODY:
            raise BadResponse("response body too large")
        return False


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


def _plain_http(url: str) -> tuple[str, int, str, str] | None:
    """(host, port, host header, path) of a URL of the form ``http://host[:port][/path]``, as
    ``urlsplit`` reads it; None for any other (read by ``urlsplit``, which says what is
    wrong). Spares the common case the import of urllib.parse (and of ipaddress with it)."""
    if not url.startswith("http://") or not url.isascii() or not url.isprintable() or " " in url:
        return None
    netloc, slash, path = url[len("http://") :].partition("/")
    if not netloc or any(c in netloc for c in "@[]?#\\") or any(c in path for c in "?#;"):
        return None
    host, colon, port = netloc.partition(":")
    if not host or (colon and not (port.isdigit() and int(port) <= 65535)):
        return None
    return host.lower(), (int(port) if port else 0) or 80, netloc, slash + path


def request_bytes(call: HttpCall, prefix: str, host: str, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 request, head and body in one piece (one write on the wire)."""
    target = prefix + call.path
    if call.params:
        from urllib.parse import urlencode  # a long-poll's: an allowed call has no parameters

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
        plain = _plain_http(self.url)
        if plain is not None:
            self._host, self._port, self._host_header, path = plain
        else:
            from urllib.parse import urlsplit

            parts = urlsplit(self.url)
            if parts.scheme != "http" or not parts.hostname:
                raise GateConfigError(f"PlainGateClient needs an http:// URL, got {self.url!r}")
            try:
                self._port = parts.port or 80
            except ValueError as exc:
                raise GateConfigError(f"bad port in {self.url!r}: {exc}") from None
            self._host = parts.hostname
            self._host_header = parts.netloc.rpartition("@")[2]
            path = parts.path
        self._prefix = path.rstrip("/")
        # An ASCII name is given to the resolver as bytes: a str is encoded by the idna codec
        # first, whose import is a share of a hook's start-up.
        self._address: str | bytes = self._host.encode() if self._host.isascii() else self._host
        self._sock: socket.socket | None = None
        self._leftover = b""

    def _request(self, call: HttpCall) -> bytes:
        return request_bytes(call, self._prefix, self._host_header, self.call_headers(call))

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        deadline = time.monotonic() + call.timeout
        try:
            if self._sock is None:
                self._sock = socket.create_connection(
                    (self._address, self._port),  # type: ignore[arg-type]  # bytes: see __init__
                    timeout=min(CONNECT_TIMEOUT, call.timeout),
                )
                self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = self._sock
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(self._request(call))
            parser = ResponseParser()
            done = parser.feed(self._leftover)
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("Signoff's answer did not arrive in time")
                sock.settimeout(left)
                chunk = sock.recv(65536)
                done = parser.feed(chunk) if chunk else parser.feed_eof()
            self._leftover = parser.leftover
            status, headers = parser.status, parser.headers
            if parser.old or "close" in headers.get("connection", "").lower():
                self.close()
            return HttpReply(status, parser.body, parse_retry_after(headers.get("retry-after")))
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
