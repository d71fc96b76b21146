"""The remote gate client: ask Signoff before a tool runs, and wait for a human if needed.

``GateClient`` (sync, :class:`httpx.Client`) and ``AsyncGateClient`` (async,
:class:`httpx.AsyncClient`) are thin drivers of one sans-I/O state machine
(:mod:`signoff.hooks._gate`). ``pre_tool_use(...)`` sends the call to
``POST /v1/hooks/pre-tool-use``; when the answer is *pending* it long-polls
``GET /v1/requests/{id}/wait`` (25 s per poll by default), re-attaching by
request id after dropped connections, 5xx answers or a server restart, until
the request is decided or the client's own deadline passes.

It fails closed: a missing configuration, an unreachable server, a 401, a
malformed answer, the deadline, or a bug in this module all give a deny with a
reason the agent can show, never an allow. ``require(...)`` raises
:class:`GateDenied` (or its subclasses :class:`GateTimeout` and
:class:`GateUnavailable`) instead of returning a deny.

On its deadline the client does **not** cancel the pending request unless
``cancel_on_deadline=True``: the request stays open until a person decides or
the server's own expiry, so a retried hook with the same idempotency key
re-attaches to it (Claude Code ``defer`` + ``--resume``, LangGraph resume,
Pydantic AI re-runs) instead of asking the approvers twice.

The idempotency key is ``<runtime>:<session>:<tool_call_id>`` when both ids
are given, else a fresh random key per call (which still makes the call's own
retries idempotent).

An approval covers one call, once: after the tool has run, ``post_tool_use(...)``
reports it (``POST /v1/hooks/post-tool-use``) under the same key, with the arguments
it ran with, and the approval is used.

Configuration: ``url`` / ``api_key`` arguments, else ``SIGNOFF_URL`` /
``SIGNOFF_API_KEY`` from the environment; neither → :class:`GateConfigError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

from signoff.hooks._base import (
    ENV_API_KEY,
    ENV_SUBMIT_DEADLINE,
    ENV_URL,
    ClientBase,
    SyncGateClient,
    crashed,
    parse_retry_after,
    report_crashed,
)
from signoff.hooks._gate import (
    CONNECT_TIMEOUT,
    DEFAULT_DEADLINE,
    DEFAULT_POLL_TIMEOUT,
    GateConfigError,
    GateDecision,
    GateDenied,
    GateFailure,
    GateTimeout,
    GateUnavailable,
    HttpCall,
    HttpReply,
    Pause,
    ReportAnswer,
    TransportFailure,
    cancel_flow,
    make_idempotency_key,
    seconds_text,
    transport_failure,
)

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_POLL_TIMEOUT",
    "ENV_API_KEY",
    "ENV_SUBMIT_DEADLINE",
    "ENV_URL",
    "AsyncGateClient",
    "GateClient",
    "GateConfigError",
    "GateDecision",
    "GateDenied",
    "GateFailure",
    "GateTimeout",
    "GateUnavailable",
    "ReportAnswer",
    "make_idempotency_key",
]

if TYPE_CHECKING:
    from collections.abc import Generator
    from typing import TypeVar

    from signoff.hooks._gate import Outcome, Step

    T = TypeVar("T")

log = logging.getLogger("signoff.client")


def _to_reply(response: httpx.Response) -> HttpReply:
    if response.status_code >= 500:
        log.info("Signoff answered HTTP %s; will retry", response.status_code)
    return HttpReply(
        response.status_code, response.content, parse_retry_after(response.headers.get("retry-after"))
    )


def _failure(exc: Exception) -> TransportFailure:
    log.info("Signoff unreachable (%s); will retry", type(exc).__name__)
    return transport_failure(exc)


def _crashed(exc: Exception) -> GateDecision:
    log.exception("Signoff gate client failed; denying the call")
    return crashed(exc)


def _request_args(client: ClientBase, call: HttpCall) -> dict[str, Any]:
    return {
        "method": call.method,
        "url": client.url + call.path,
        "params": dict(call.params),
        "content": call.body,
        "headers": client.call_headers(call),
        "timeout": httpx.Timeout(call.timeout, connect=min(CONNECT_TIMEOUT, call.timeout)),
    }


class GateClient(SyncGateClient):
    """Synchronous Signoff gate client. Thread-safe; reuse one per process.

    Args:
        url: Signoff's base URL; default ``$SIGNOFF_URL``.
        api_key: The agent's API key; default ``$SIGNOFF_API_KEY``.
        deadline: Seconds one call may take in total, waiting for a person included.
        poll_timeout: Seconds per long-poll of ``/wait`` (the server caps it at 60).
        cancel_on_deadline: Cancel the pending request when the deadline passes
            (off: a retried hook re-attaches to it instead).
        runtime: First part of derived idempotency keys (``<runtime>:<session>:<call>``).
        transport: An httpx transport (tests pass :class:`httpx.MockTransport`).
        backoff_initial, backoff_max: Retry backoff bounds in seconds.

    Raises:
        GateConfigError: No URL or key, or invalid timing values.
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
        transport: httpx.BaseTransport | None = None,
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
        self._transport = transport if transport is not None else httpx.HTTPTransport()
        self._http = httpx.Client(transport=self._transport, follow_redirects=False)

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        # httpx's timeouts bound each read, so a server trickling a byte at a time would hold
        # the call forever: at the exchange's own timeout (never past the caller's deadline)
        # its connections are closed.
        overdue = threading.Event()

        def abort() -> None:
            overdue.set()
            self._transport.close()

        watchdog = threading.Timer(call.timeout, abort)
        watchdog.daemon = True
        watchdog.start()
        try:
            return _to_reply(self._http.request(**_request_args(self, call)))
        except httpx.RequestError as exc:
            if overdue.is_set():
                return TransportFailure(f"no complete answer within {seconds_text(call.timeout)}", "timeout")
            return _failure(exc)
        finally:
            watchdog.cancel()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


class AsyncGateClient(ClientBase):
    """Asynchronous Signoff gate client; same arguments and behaviour as :class:`GateClient`.

    ``transport`` is an :class:`httpx.AsyncBaseTransport`. Use one client per event loop.
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
        transport: httpx.AsyncBaseTransport | None = None,
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
        self._http = httpx.AsyncClient(transport=transport, follow_redirects=False)

    async def pre_tool_use(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        user_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        poll_timeout: float | None = None,
        wait: bool = True,
    ) -> GateDecision:
        """Async :meth:`GateClient.pre_tool_use`: never raises for gate failures, denies instead."""
        try:
            flow = self._flow(
                tool_name,
                arguments,
                session_id=session_id,
                tool_call_id=tool_call_id,
                user_id=user_id,
                metadata=metadata,
                idempotency_key=idempotency_key,
                deadline=deadline,
                poll_timeout=poll_timeout,
                wait=wait,
            )
            return await self._drive(flow)
        except Exception as exc:
            return _crashed(exc)

    async def require(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        user_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
        poll_timeout: float | None = None,
    ) -> GateDecision:
        """Async :meth:`GateClient.require`: return the allow, raise :class:`GateDenied` otherwise."""
        decision = await self.pre_tool_use(
            tool_name,
            arguments,
            session_id=session_id,
            tool_call_id=tool_call_id,
            user_id=user_id,
            metadata=metadata,
            idempotency_key=idempotency_key,
            deadline=deadline,
            poll_timeout=poll_timeout,
        )
        return decision.raise_for_denial()

    async def post_tool_use(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        result: Any,
        *,
        error: str | None = None,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        user_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        deadline: float | None = None,
    ) -> ReportAnswer:
        """Async :meth:`GateClient.post_tool_use`: never raises; ``delivered=False`` if lost."""
        try:
            flow = self._report_flow(
                tool_name,
                arguments,
                result,
                error=error,
                session_id=session_id,
                tool_call_id=tool_call_id,
                user_id=user_id,
                metadata=metadata,
                idempotency_key=idempotency_key,
                deadline=deadline,
            )
            return await self._drive(flow)
        except Exception as exc:
            return report_crashed(exc)

    async def cancel(self, request_id: str) -> GateDecision:
        """Async :meth:`GateClient.cancel`."""
        try:
            return await self._drive(cancel_flow(request_id))
        except Exception as exc:
            return _crashed(exc)

    async def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        try:
            # httpx timeouts bound each read; this bounds the whole exchange, by its timeout.
            async with asyncio.timeout(call.timeout):
                return _to_reply(await self._http.request(**_request_args(self, call)))
        except (httpx.RequestError, TimeoutError) as exc:
            return _failure(exc)

    async def _drive(self, flow: Generator[Step, Outcome, T]) -> T:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(await self._exchange(step))
        except StopIteration as stop:
            outcome: T = stop.value
            return outcome

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
