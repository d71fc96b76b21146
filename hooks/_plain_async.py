"""An asynchronous gate client over asyncio streams, for ``http://`` URLs.

:class:`AsyncPlainGateClient` behaves as :class:`~signoff.hooks.client.AsyncGateClient`
(which it is) but speaks the little HTTP/1.1 the gate needs itself, as the Claude Code
hook's :mod:`signoff.hooks._plain` does: each request goes out in one write, each
answer is framed by the same :class:`~signoff.hooks._plain.ResponseParser` (a
``Content-Length``, chunked or to the close), and connections are kept alive in a
small pool (one per exchange in flight). For a process that asks
Signoff about every call it relays, such as the MCP proxy, that costs a fraction of
httpx's per-request work. ``https://`` URLs go through httpx, unchanged.
"""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

from signoff.hooks._base import parse_retry_after
from signoff.hooks._gate import (
    CONNECT_TIMEOUT,
    DEFAULT_DEADLINE,
    DEFAULT_POLL_TIMEOUT,
    GateConfigError,
    HttpCall,
    HttpReply,
    TransportFailure,
)
from signoff.hooks._plain import BadResponse, ResponseParser, request_bytes
from signoff.hooks.client import AsyncGateClient, _failure

__all__ = ["AsyncPlainGateClient"]

MAX_IDLE = 8
"""Idle keep-alive connections kept for the next exchanges."""
READ_SIZE = 65536

_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Stale(Exception):
    """A kept-alive connection the server had closed before answering: try a fresh one."""


class AsyncPlainGateClient(AsyncGateClient):
    """:class:`~signoff.hooks.client.AsyncGateClient` over asyncio streams for ``http://`` URLs.

    Same arguments (but ``transport``), same behaviour; ``https://`` goes through httpx.
    """

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
        self._plain = parts.scheme == "http" and bool(parts.hostname)
        try:
            self._port = parts.port or 80
        except ValueError as exc:
            raise GateConfigError(f"bad port in {self.url!r}: {exc}") from None
        self._host = parts.hostname or ""
        self._host_header = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self._idle: list[_Connection] = []

    async def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        if not self._plain:
            return await super()._exchange(call)
        request = request_bytes(call, self._prefix, self._host_header, self.call_headers(call))
        try:
            async with asyncio.timeout(call.timeout):
                while self._idle:
                    kept = self._idle.pop()
                    if kept[0].at_eof():
                        kept[1].close()
                        continue
                    try:
                        return await self._over(kept, request, reused=True)
                    except _Stale:
                        continue
                return await self._over(await self._open(call.timeout), request, reused=False)
        except (OSError, BadResponse, TimeoutError, _Stale) as exc:
            return _failure(exc if not isinstance(exc, _Stale) else BadResponse("connection closed"))

    async def _open(self, timeout: float) -> _Connection:
        async with asyncio.timeout(min(CONNECT_TIMEOUT, timeout)):
            reader, writer = await asyncio.open_connection(self._host, self._port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _over(self, connection: _Connection, request: bytes, *, reused: bool) -> HttpReply:
        """One exchange on ``connection``; raises :class:`_Stale` if a reused one was found closed."""
        reader, writer = connection
        parser = ResponseParser()
        try:
            writer.write(request)
            while True:
                chunk = await reader.read(READ_SIZE)
                if chunk:
                    if parser.feed(chunk):
                        break
                elif parser.started:
                    parser.feed_eof()
                    break
                else:
                    raise _Stale()  # closed before any byte of an answer
        except (_Stale, ConnectionError) as exc:
            writer.close()
            if reused:
                raise _Stale() from exc
            raise BadResponse("connection closed before the answer") from exc
        except BaseException:
            writer.close()  # failed or interrupted mid-exchange: the connection's state is unknown
            raise
        headers = parser.headers
        if parser.old or "close" in headers.get("connection", "").lower() or len(self._idle) >= MAX_IDLE:
            writer.close()
        else:
            self._idle.append(connection)
        return HttpReply(parser.status, parser.body, parse_retry_after(headers.get("retry-after")))

    async def aclose(self) -> None:
        """Close the connections."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        await super().aclose()
