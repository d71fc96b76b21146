"""The remote gate client: ask Signoff before a tool runs, and wait for a human if needed.

``GateClient`` (sync, :class:`httpx.Client`) and ``AsyncGateClient`` (async,
:class:`httpx.AsyncClient`) are thin drivers of one sans-I/O state machine
(:mod:`hooks._gate`). ``pre_tool_use(...)`` sends the call to
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

Configuration: ``url`` / ``api_key`` arguments, else ``SIGNOFF_URL`` /
``SIGNOFF_API_KEY`` from the environment; neither → :class:`GateConfigError`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Generator, Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from hooks._gate import (
    CONNECT_TIMEOUT,
    DEFAULT_DEADLINE,
    DEFAULT_POLL_TIMEOUT,
    DEFAULT_SUBMIT_DEADLINE,
    FlowSettings,
    GateConfigError,
    GateDecision,
    GateDenied,
    GateFailure,
    GateTimeout,
    GateUnavailable,
    HttpCall,
    HttpReply,
    Outcome,
    Pause,
    Step,
    ToolCall,
    TransportFailure,
    _unavailable,
    cancel_flow,
    gate_flow,
    make_idempotency_key,
)

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_POLL_TIMEOUT",
    "ENV_API_KEY",
    "ENV_URL",
    "AsyncGateClient",
    "GateClient",
    "GateConfigError",
    "GateDecision",
    "GateDenied",
    "GateFailure",
    "GateTimeout",
    "GateUnavailable",
    "make_idempotency_key",
]

log = logging.getLogger("signoff.client")

ENV_URL = "SIGNOFF_URL"
ENV_API_KEY = "SIGNOFF_API_KEY"
_USER_AGENT = "signoff-client/0.1"

Flow = Generator[Step, Outcome, GateDecision]


def _resolve(url: str | None, api_key: str | None) -> tuple[str, str]:
    url = (url if url is not None else os.environ.get(ENV_URL, "")).strip()
    api_key = (api_key if api_key is not None else os.environ.get(ENV_API_KEY, "")).strip()
    if not url:
        raise GateConfigError(f"Signoff is not configured: set {ENV_URL} (or pass url=...)")
    if not url.startswith(("http://", "https://")):
        raise GateConfigError(f"{ENV_URL} must start with http:// or https://, got {url!r}")
    if not api_key:
        raise GateConfigError(f"Signoff is not configured: set {ENV_API_KEY} (or pass api_key=...)")
    return url.rstrip("/"), api_key


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff
    return max(0.0, seconds)


def _to_reply(response: httpx.Response) -> HttpReply:
    if response.status_code >= 500:
        log.info("Signoff answered HTTP %s; will retry", response.status_code)
    return HttpReply(
        response.status_code, response.content, _retry_after(response.headers.get("retry-after"))
    )


def _failure(exc: Exception) -> TransportFailure:
    log.info("Signoff unreachable (%s); will retry", type(exc).__name__)
    text = str(exc)
    return TransportFailure(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _crashed(exc: Exception) -> GateDecision:
    log.exception("Signoff gate client failed; denying the call")
    return _unavailable(f"Signoff gate client error ({type(exc).__name__}: {exc}); denied to be safe")


class _Base:
    """Configuration and request building shared by both shells."""

    def __init__(
        self,
        url: str | None,
        api_key: str | None,
        *,
        deadline: float,
        poll_timeout: float,
        cancel_on_deadline: bool,
        runtime: str,
        backoff_initial: float,
        backoff_max: float,
        submit_deadline: float = DEFAULT_SUBMIT_DEADLINE,
    ) -> None:
        self.url, api_key = _resolve(url, api_key)
        if deadline <= 0 or poll_timeout <= 0 or backoff_initial < 0 or backoff_max < backoff_initial:
            raise GateConfigError(
                "deadline and poll_timeout must be > 0 and 0 <= backoff_initial <= backoff_max"
            )
        self.runtime = runtime
        self.settings = FlowSettings(
            deadline=deadline,
            poll_timeout=poll_timeout,
            cancel_on_deadline=cancel_on_deadline,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            submit_deadline=submit_deadline,
        )
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(url={self.url!r}, runtime={self.runtime!r})"

    def _flow(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None,
        *,
        session_id: str | None,
        tool_call_id: str | None,
        user_id: str | None,
        metadata: Mapping[str, Any] | None,
        idempotency_key: str | None,
        deadline: float | None,
        poll_timeout: float | None,
        wait: bool = True,
    ) -> Flow:
        call = ToolCall.build(
            tool_name,
            arguments,
            runtime=self.runtime,
            session_id=session_id,
            tool_call_id=tool_call_id,
            user_id=user_id,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        settings = self.settings
        if deadline is not None or poll_timeout is not None:
            settings = FlowSettings(
                deadline=deadline if deadline is not None else settings.deadline,
                poll_timeout=poll_timeout if poll_timeout is not None else settings.poll_timeout,
                cancel_on_deadline=settings.cancel_on_deadline,
                backoff_initial=settings.backoff_initial,
                backoff_max=settings.backoff_max,
                submit_deadline=settings.submit_deadline,
            )
        return gate_flow(call, settings, time.monotonic, wait=wait)

    def _request_args(self, call: HttpCall) -> dict[str, Any]:
        headers = dict(self._headers)
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        return {
            "method": call.method,
            "url": self.url + call.path,
            "params": dict(call.params),
            "content": call.body,
            "headers": headers,
            "timeout": httpx.Timeout(call.timeout, connect=min(CONNECT_TIMEOUT, call.timeout)),
        }


class GateClient(_Base):
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
        submit_deadline: float = DEFAULT_SUBMIT_DEADLINE,
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
        self._http = httpx.Client(transport=transport, follow_redirects=False)

    def pre_tool_use(
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
        """Ask Signoff whether ``tool_name(**arguments)`` may run; wait for a person if needed.

        Never raises for gate failures: anything but an explicit allow returns
        ``GateDecision(allowed=False, ...)``; ``failure`` tells a client-side
        failure (timeout, unavailable) from a decision. ``deadline`` and
        ``poll_timeout`` override the client's defaults for this call.

        ``wait=False`` only submits: a call that needs a person returns at once
        with ``pending=True`` (and ``allowed=False``); call again with the same
        idempotency key to wait for the outcome.
        """
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
            return self._drive(flow)
        except Exception as exc:
            return _crashed(exc)

    def require(
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
        """Like :meth:`pre_tool_use`, but raise unless allowed.

        Returns:
            The allowing decision (use ``decision.arguments(original)`` for rewrites).

        Raises:
            GateDenied: Denied by policy or a person.
            GateTimeout: No decision before the deadline (subclass of GateDenied).
            GateUnavailable: Signoff unreachable or unusable (subclass of GateDenied).
        """
        return self.pre_tool_use(
            tool_name,
            arguments,
            session_id=session_id,
            tool_call_id=tool_call_id,
            user_id=user_id,
            metadata=metadata,
            idempotency_key=idempotency_key,
            deadline=deadline,
            poll_timeout=poll_timeout,
        ).raise_for_denial()

    def cancel(self, request_id: str) -> GateDecision:
        """Withdraw a pending request (one attempt). Returns its final state as a decision.

        A request decided before the cancel landed keeps its outcome, and the
        decision says so (an approval allows). Never raises; failures deny.
        """
        try:
            return self._drive(cancel_flow(request_id))
        except Exception as exc:
            return _crashed(exc)

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        try:
            return _to_reply(self._http.request(**self._request_args(call)))
        except httpx.RequestError as exc:
            return _failure(exc)

    def _drive(self, flow: Flow) -> GateDecision:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    time.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(self._exchange(step))
        except StopIteration as stop:
            decision: GateDecision = stop.value
            return decision

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncGateClient(_Base):
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
        submit_deadline: float = DEFAULT_SUBMIT_DEADLINE,
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

    async def cancel(self, request_id: str) -> GateDecision:
        """Async :meth:`GateClient.cancel`."""
        try:
            return await self._drive(cancel_flow(request_id))
        except Exception as exc:
            return _crashed(exc)

    async def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        try:
            # httpx timeouts bound each read; this bounds the whole exchange.
            async with asyncio.timeout(call.timeout + 1.0):
                return _to_reply(await self._http.request(**self._request_args(call)))
        except (httpx.RequestError, TimeoutError) as exc:
            return _failure(exc)

    async def _drive(self, flow: Flow) -> GateDecision:
        try:
            step = next(flow)
            while True:
                if isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    step = flow.send(None)
                else:
                    step = flow.send(await self._exchange(step))
        except StopIteration as stop:
            decision: GateDecision = stop.value
            return decision

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
