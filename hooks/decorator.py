"""Gate plain Python tools: the ``@gate`` decorator and the ``gated`` context managers.

```python
client = GateClient()  # SIGNOFF_URL / SIGNOFF_API_KEY


@gate(client, action="pay_invoice")
def pay_invoice(invoice_id: str, amount: int) -> str: ...


with gated(client, "drop_table", {"table": "users"}) as decision:
    drop_table(**decision.arguments({"table": "users"}))  # runs only when approved
```

The body runs only when Signoff allows. Otherwise :class:`~signoff.hooks.client.GateDenied`
is raised — or :class:`~signoff.hooks.client.GateTimeout` / :class:`~signoff.hooks.client.GateUnavailable`,
its subclasses, when the client failed closed — so ``except GateDenied`` catches every way
the call can be refused.

An approval covers one call, once. Once the body has run (returned or raised), the call
is reported to Signoff (``POST /v1/hooks/post-tool-use``) under the idempotency key it was
asked under, with the arguments it ran with, and the approval is used: calling again
asks again. Each call gets a fresh key unless you give one; a key you give (``key=``,
``idempotency_key=``) names the operation — ``key=lambda invoice_id, amount:
f"billing:{invoice_id}"`` — and the decorator appends a digest of the tool name and the
arguments (:func:`call_key`), so the same key with other arguments is another call that
needs its own approval, while a retry of the same call after a crash re-attaches to its
request instead of asking twice.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ParamSpec, TypeVar, cast

from signoff.hooks._gate import (
    GateDecision,
    GateUnavailable,
    describe_changes,
    key_digest,
    make_idempotency_key,
)
from signoff.hooks.client import AsyncGateClient, GateClient

__all__ = ["agated", "call_key", "gate", "gated"]

P = ParamSpec("P")
R = TypeVar("R")

_IMPLICIT = frozenset({"self", "cls"})


def call_key(key: str, action: str, arguments: Mapping[str, Any]) -> str:
    """The idempotency key sent for a call under a key you give: ``<key>:<digest of the call>``.

    The digest covers the tool name and the canonical arguments, so one key can never
    stand for two different calls. Use it to ask about the same call yourself (for
    example with ``wait=False`` first, to show who must decide).
    """
    return f"{key}:{key_digest(action, arguments)}"


def _key(
    client: GateClient | AsyncGateClient,
    given: str | None,
    action: str,
    arguments: Mapping[str, Any],
    session_id: str | None,
    tool_call_id: str | None,
) -> str:
    if given:
        return call_key(given, action, arguments)
    derived = make_idempotency_key(client.runtime, session_id, tool_call_id)
    return derived or f"{client.runtime}:auto:{uuid.uuid4().hex}"


def _call_arguments(bound: inspect.BoundArguments) -> dict[str, Any]:
    return {name: value for name, value in bound.arguments.items() if name not in _IMPLICIT}


def _error(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _apply(
    fn: Callable[..., Any], bound: inspect.BoundArguments, decision: GateDecision
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's (args, kwargs), with the approved arguments applied (``bound`` is updated)."""
    approved = decision.modified_arguments
    if approved is None:
        return bound.args, bound.kwargs
    params = inspect.signature(fn).parameters
    asked = _call_arguments(bound)
    if set(approved) - set(asked):
        raise GateUnavailable(
            f"Signoff approved {fn.__name__} only with arguments it does not take "
            f"({describe_changes(asked, {**asked, **approved})}); not running it",
            decision=decision,
        )
    for name, value in approved.items():
        kind = params[name].kind
        bound.arguments[name] = tuple(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
    return bound.args, bound.kwargs


def gate(
    client: GateClient | AsyncGateClient,
    *,
    action: str | None = None,
    key: str | Callable[..., str | None] | None = None,
    deadline: float | None = None,
    poll_timeout: float | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function only after Signoff allows the call; then report it.

    The call's bound arguments (``self``/``cls`` left out) are sent as the tool's
    arguments; arguments Signoff approved instead (``modified_arguments``) replace
    them. Once the function has returned or raised, the call is reported with the
    arguments it ran with, which uses up its approval.

    Args:
        client: A :class:`GateClient`, or for coroutine functions an :class:`AsyncGateClient`
            (a sync client also works there; it waits in a worker thread).
        action: The tool name Signoff sees; default the function's ``__name__``.
        key: Names the operation for retries: a string, or a callable taking the
            function's arguments and returning one. A digest of the call is always
            appended (:func:`call_key`). Default: a fresh key per call.
        deadline: Seconds the whole call may take, waiting for a person included;
            default the client's.
        poll_timeout: Seconds per long-poll; default the client's.
        session_id, user_id, metadata: Sent with every call.

    Raises:
        TypeError: A sync function with an :class:`AsyncGateClient`.
        GateDenied: (at call time) denied; ``GateTimeout`` / ``GateUnavailable`` on failures.
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(fn)
        name = action or fn.__name__
        is_async = inspect.iscoroutinefunction(fn)
        if not is_async and isinstance(client, AsyncGateClient):
            raise TypeError(f"@gate on sync function {name!r} needs a GateClient, not an AsyncGateClient")

        def request(
            args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[inspect.BoundArguments, dict[str, Any], dict[str, Any]]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = _call_arguments(bound)
            given = key(*args, **kwargs) if callable(key) else key
            call: dict[str, Any] = {
                "session_id": session_id,
                "user_id": user_id,
                "metadata": metadata,
                "idempotency_key": _key(client, given, name, arguments, session_id, None),
            }
            return bound, arguments, call

        waits: dict[str, Any] = {"deadline": deadline, "poll_timeout": poll_timeout}

        if is_async:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                bound, arguments, call = request(args, kwargs)
                if isinstance(client, AsyncGateClient):
                    decision = await client.require(name, arguments, **call, **waits)
                else:
                    ask = functools.partial(client.require, name, arguments, **call, **waits)
                    decision = await asyncio.to_thread(ask)
                call_args, call_kwargs = _apply(fn, bound, decision)
                ran = _call_arguments(bound)
                try:
                    result = await cast(Callable[..., Any], fn)(*call_args, **call_kwargs)
                except Exception as exc:
                    await _areport(client, name, ran, None, _error(exc), call)
                    raise
                await _areport(client, name, ran, result, None, call)
                return result

            return cast(Callable[P, R], async_wrapper)

        sync_client = cast(GateClient, client)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound, arguments, call = request(args, kwargs)
            decision = sync_client.require(name, arguments, **call, **waits)
            call_args, call_kwargs = _apply(fn, bound, decision)
            ran = _call_arguments(bound)
            try:
                result = fn(*call_args, **call_kwargs)
            except Exception as exc:
                sync_client.post_tool_use(name, ran, None, error=_error(exc), **call)
                raise
            sync_client.post_tool_use(name, ran, result, **call)
            return result

        return cast(Callable[P, R], wrapper)

    return decorate


async def _areport(
    client: GateClient | AsyncGateClient,
    action: str,
    arguments: dict[str, Any],
    result: Any,
    error: str | None,
    call: dict[str, Any],
) -> None:
    if isinstance(client, AsyncGateClient):
        await client.post_tool_use(action, arguments, result, error=error, **call)
    else:
        report = functools.partial(client.post_tool_use, action, arguments, result, error=error, **call)
        await asyncio.to_thread(report)


def _context_call(
    client: GateClient | AsyncGateClient,
    action: str,
    arguments: Mapping[str, Any],
    idempotency_key: str | None,
    session_id: str | None,
    tool_call_id: str | None,
    user_id: str | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What the ask and the report of one ``gated`` call both send."""
    return {
        "session_id": session_id,
        "tool_call_id": tool_call_id,
        "user_id": user_id,
        "metadata": metadata,
        "idempotency_key": _key(client, idempotency_key, action, arguments, session_id, tool_call_id),
    }


@contextmanager
def gated(
    client: GateClient,
    action: str,
    args: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    session_id: str | None = None,
    tool_call_id: str | None = None,
    user_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    poll_timeout: float | None = None,
) -> Iterator[GateDecision]:
    """``with gated(client, "tool", {...}) as decision:`` — the body runs only when allowed.

    Yields the allowing :class:`GateDecision`; run the tool with ``decision.arguments(args)``
    (the approved arguments). Raises :class:`GateDenied` (or a subclass) on entry otherwise,
    so the body never runs. On exit the call is reported with those arguments (and the
    error, if the body raised). An ``idempotency_key`` you give gets a digest of the call
    appended (:func:`call_key`); without one, ``session_id`` and ``tool_call_id`` give
    ``python:<session>:<call>``, else each call gets a fresh key.
    """
    arguments = dict(args or {})
    call = _context_call(
        client, action, arguments, idempotency_key, session_id, tool_call_id, user_id, metadata
    )
    decision = client.require(action, arguments, **call, deadline=deadline, poll_timeout=poll_timeout)
    ran = decision.arguments(arguments)
    try:
        yield decision
    except Exception as exc:
        client.post_tool_use(action, ran, None, error=_error(exc), **call)
        raise
    client.post_tool_use(action, ran, None, **call)


@asynccontextmanager
async def agated(
    client: AsyncGateClient,
    action: str,
    args: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    session_id: str | None = None,
    tool_call_id: str | None = None,
    user_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    poll_timeout: float | None = None,
) -> AsyncIterator[GateDecision]:
    """``async with agated(client, "tool", {...}) as decision:`` — async :func:`gated`."""
    arguments = dict(args or {})
    call = _context_call(
        client, action, arguments, idempotency_key, session_id, tool_call_id, user_id, metadata
    )
    decision = await client.require(action, arguments, **call, deadline=deadline, poll_timeout=poll_timeout)
    ran = decision.arguments(arguments)
    try:
        yield decision
    except Exception as exc:
        await client.post_tool_use(action, ran, None, error=_error(exc), **call)
        raise
    await client.post_tool_use(action, ran, None, **call)
