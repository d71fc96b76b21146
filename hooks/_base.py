"""What every gate-client shell shares, with nothing but the standard library.

A shell turns the sans-I/O flow of :mod:`signoff.hooks._gate` into HTTP: the
httpx clients of :mod:`signoff.hooks.client`, and the plain ``http.client`` one
of :mod:`signoff.hooks._plain` that the Claude Code hook uses so that it starts
without importing httpx. Configuration, the request headers and the sync driver
live here once.
"""

from __future__ import annotations

import os
import time

from signoff.hooks._gate import (
    DEFAULT_SUBMIT_DEADLINE,
    FlowSettings,
    GateConfigError,
    GateDecision,
    HttpCall,
    HttpReply,
    Outcome,
    Pause,
    ReportAnswer,
    Step,
    ToolCall,
    TransportFailure,
    _unavailable,
    cancel_flow,
    gate_flow,
    make_idempotency_key,
    report_body,
    report_flow,
)

TYPE_CHECKING = False  # ``typing`` is not imported at run time (see signoff.hooks._records)
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Mapping
    from types import TracebackType
    from typing import Any, Self, TypeVar

    T = TypeVar("T")
    Flow = Generator[Step, Outcome, GateDecision]
    Exchange = Callable[[HttpCall], HttpReply | TransportFailure]

__all__ = [
    "ENV_API_KEY",
    "ENV_SUBMIT_DEADLINE",
    "ENV_URL",
    "ClientBase",
    "SyncGateClient",
    "crashed",
    "drive",
    "parse_retry_after",
]

ENV_URL = "SIGNOFF_URL"
ENV_API_KEY = "SIGNOFF_API_KEY"
ENV_SUBMIT_DEADLINE = "SIGNOFF_SUBMIT_DEADLINE"
USER_AGENT = "signoff-client/0.1"


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


def submit_deadline_from_env(value: float | None) -> float:
    """``value``, else ``$SIGNOFF_SUBMIT_DEADLINE``, else the default (5 s)."""
    if value is None:
        raw = os.environ.get(ENV_SUBMIT_DEADLINE, "").strip()
        if not raw:
            return DEFAULT_SUBMIT_DEADLINE
        try:
            value = float(raw)
        except ValueError:
            raise GateConfigError(f"{ENV_SUBMIT_DEADLINE} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise GateConfigError(f"the submit deadline must be > 0 seconds, got {value:g}")
    return value


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the HTTP-date form falls back to our own backoff)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return max(0.0, seconds)


def crashed(exc: BaseException) -> GateDecision:
    """The deny for a bug in a shell: never an allow."""
    return _unavailable(f"Signoff gate client error ({type(exc).__name__}: {exc}); denied to be safe")


def drive(
    flow: Generator[Step, Outcome, T], exchange: Exchange, sleep: Callable[[float], None] | None = None
) -> T:
    """Run a flow to its outcome, performing each step synchronously."""
    try:
        step = next(flow)
        while True:
            if isinstance(step, Pause):
                (sleep or time.sleep)(step.seconds)
                step = flow.send(None)
            else:
                step = flow.send(exchange(step))
    except StopIteration as stop:
        outcome: T = stop.value
        return outcome


def report_crashed(exc: BaseException) -> ReportAnswer:
    """The answer for a bug while reporting: not delivered, never raised (the call already ran)."""
    return ReportAnswer(False, f"Signoff report error ({type(exc).__name__}: {exc})")


class ClientBase:
    """Configuration and request building shared by every shell."""

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
        submit_deadline: float | None = None,
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
            submit_deadline=submit_deadline_from_env(submit_deadline),
        )
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(url={self.url!r}, runtime={self.runtime!r})"

    def call_headers(self, call: HttpCall) -> dict[str, str]:
        headers = dict(self.headers)
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        return headers

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
        return gate_flow(call, settings, time.monotonic, wait=wait, url=self.url)

    def _report_flow(
        self,
        tool_name: str,
        arguments: Mapping[str, Any],
        result: Any,
        *,
        error: str | None,
        session_id: str | None,
        tool_call_id: str | None,
        user_id: str | None,
        metadata: Mapping[str, Any] | None,
        idempotency_key: str | None,
        deadline: float | None = None,
    ) -> Generator[Step, Outcome, ReportAnswer]:
        body = report_body(
            tool_name,
            arguments,
            result,
            error=error,
            session_id=session_id,
            tool_call_id=tool_call_id,
            user_id=user_id,
            metadata=metadata,
            # The key the call was asked under, derived the same way as for pre_tool_use.
            idempotency_key=idempotency_key or make_idempotency_key(self.runtime, session_id, tool_call_id),
        )
        return report_flow(body, self.settings, time.monotonic, deadline=deadline)


class SyncGateClient(ClientBase):
    """The synchronous client's behaviour; a subclass supplies ``_exchange`` and ``close``."""

    def _exchange(self, call: HttpCall) -> HttpReply | TransportFailure:
        raise NotImplementedError

    def close(self) -> None:
        """Close the connections."""

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
        exchange: Exchange | None = None,
    ) -> GateDecision:
        """Ask Signoff whether ``tool_name(**arguments)`` may run; wait for a person if needed.

        Never raises for gate failures: anything but an explicit allow returns
        ``GateDecision(allowed=False, ...)``; ``failure`` tells a client-side
        failure (timeout, unavailable) from a decision. ``deadline`` and
        ``poll_timeout`` override the client's defaults for this call.

        ``wait=False`` only submits: a call that needs a person returns at once
        with ``pending=True`` (and ``allowed=False``); call again with the same
        idempotency key to wait for the outcome. ``exchange`` wraps this client's
        own sending (the Claude Code hook watches for the request id with it).
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
            return drive(flow, exchange or self._exchange)
        except Exception as exc:
            return crashed(exc)

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
            GateTimeout: No decision before the deadline, the client's or the request's
                (subclass of GateDenied).
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

    def post_tool_use(
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
        """Report a call that ran (``POST /v1/hooks/post-tool-use``), with the arguments it ran with.

        Send the ``idempotency_key`` the call was allowed under (or the same ``session_id``
        and ``tool_call_id``, from which the same key is derived): the report closes that
        approval. Retries an unreachable Signoff for ``deadline`` seconds (default 5); never
        raises (the call has already run), ``delivered=False`` says the report was lost.
        """
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
            return drive(flow, self._exchange)
        except Exception as exc:
            return report_crashed(exc)

    def cancel(self, request_id: str) -> GateDecision:
        """Withdraw a pending request (one attempt). Returns its final state as a decision.

        A request decided before the cancel landed keeps its outcome, and the
        decision says so (an approval allows). Never raises; failures deny.
        """
        try:
            return drive(cancel_flow(request_id), self._exchange)
        except Exception as exc:
            return crashed(exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
