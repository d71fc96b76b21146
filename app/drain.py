"""A graceful stop: on SIGTERM (or SIGINT) a server finishes what it holds and hands its
waiting agents on, within ``SIGNOFF_SHUTDOWN_SECONDS``.

When the stop begins (:meth:`Drain.begin`, called by :class:`Server` before uvicorn's own
shutdown):

1. uvicorn stops accepting connections and closes idle keep-alive ones;
2. every agent parked on ``GET /v1/requests/{id}/wait`` is answered at once — its request if
   decided, else 503 with ``Retry-After`` (:class:`signoff.app.waiters.Draining`) — and a wait
   arriving later does not park;
3. the outbox claims nothing more, and sends and records the deliveries it holds;
4. requests in flight (a gate call writing its request, a decision) finish.

uvicorn waits for them up to the bound, then cancels what is left: each such request is
answered 503 with ``Retry-After`` (:class:`AnswerCancelled`), never a 500, and what it was
writing is rolled back. The lifespan then waits for the outbox until the same deadline, and
closes the channels and the database. So the process exits within the bound plus the
time to close those.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from signoff.app.db import RETRY_AFTER_SECONDS

__all__ = ["STOPPING", "AnswerCancelled", "Drain", "Server"]

log = logging.getLogger("signoff")

STOPPING = "this server is stopping: try again (another server, or this one once restarted, will answer)"


class Drain:
    """One server's graceful stop, begun once; its steps run when it begins."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline: float | None = None
        self._steps: list[Callable[[], object]] = []

    def on_begin(self, step: Callable[[], object]) -> None:
        """Run ``step`` when the stop begins."""
        self._steps.append(step)

    @property
    def begun(self) -> bool:
        return self._deadline is not None

    def begin(self) -> None:
        """Begin the stop (again: nothing more happens)."""
        if self._deadline is not None:
            return
        self._deadline = time.monotonic() + self.seconds
        for step in self._steps:
            step()

    def remaining(self) -> float:
        """Seconds left of the bound (all of it before the stop begins)."""
        if self._deadline is None:
            return self.seconds
        return max(0.0, self._deadline - time.monotonic())


_STOPPING_BODY = json.dumps({"detail": STOPPING}).encode()


class AnswerCancelled:
    """ASGI middleware: a request uvicorn cancels at the end of a graceful stop is answered
    503 with ``Retry-After`` (the agent's client retries it elsewhere), not uvicorn's 500 and
    a traceback. Outside a stop, a cancellation goes on as it came."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not self.drain.begun or started:
                raise
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_STOPPING_BODY)).encode()),
                (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": _STOPPING_BODY})


class Server(uvicorn.Server):
    """uvicorn, beginning ``drain`` before its own graceful shutdown (SIGTERM, SIGINT)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._drain.begin()
        await super().shutdown(sockets)
