"""A synchronous gate client over the standard library's ``http.client``, for ``http://`` URLs.

The Claude Code hook is a new process for every gated tool call, so what it imports is
what the user waits for: this shell keeps one keep-alive connection and needs neither
httpx nor an SSL context. ``https://`` URLs go through :class:`signoff.hooks.client.GateClient`.
"""

from __future__ import annotations

import http.client
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

__all__ = ["PlainGateClient"]


class PlainGateClient(SyncGateClient):
    """:class:`~signoff.hooks.client.GateClient`'s behaviour over ``http.client`` (``http://`` only)."""

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
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, call: HttpCall) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            conn = http.client.HTTPConnection(
                self._host, self._port, timeout=min(CONNECT_TIMEOUT, call.timeout)
            )
            conn.connect()
            self._conn = conn
        if conn.sock is not None:
            conn.sock.settimeout(call.timeout)
        return conn

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        path = self._prefix + call.path
        if call.params:
            path += "?" + urlencode(dict(call.params))
        try:
            conn = self._connection(call)
            conn.request(call.method, path, body=call.body, headers=self.call_headers(call))
            response = conn.getresponse()
            body = response.read()
            if response.will_close:
                self.close()
            return HttpReply(response.status, body, parse_retry_after(response.getheader("retry-after")))
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return transport_failure(exc)
        except BaseException:
            self.close()  # interrupted mid-exchange (a signal): the connection's state is unknown
            raise

    def close(self) -> None:
        """Close the connection."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
