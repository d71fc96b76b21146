"""Gate plain Python tools: the ``@gate`` decorator and the ``gated`` context managers.

```python
client = GateClient()  # SIGNOFF_URL / SIGNOFF_API_KEY


@gate(client, action="pay_invoice", key=lambda invoice_id, amount: f"pay:{invoice_id}")
def pay_invoice(invoice_id: str, amount: int) -> str: ...


with gated(client, "drop_table", {"table": "users"}) as decision:
    drop_table("users")  # runs only when approved
```

The body runs only when Signoff allows. Otherwise :class:`~signoff.hooks.client.GateDenied`
is raised — or :class:`~signoff.hooks.client.GateTimeout` / :class:`~signoff.hooks.client.GateUnavailable`,
its subclasses, when the client failed closed — so ``except GateDenied`` catches every way
the call can be refused.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ParamSpec, TypeVar, cast

from signoff.hooks._gate import GateDecision, GateUnavailable
from signoff.hooks.client import AsyncGateClient, GateClient

__all__ = ["agated", "gate", "gated"]

P = ParamSpec("P")
R = TypeVar("R")

_IMPLICIT = frozenset({"self", "cls"})


def _call_arguments(bound: inspect.BoundArguments) -> dict[str, Any]:
    return {name: value for name, value in bound.arguments.items() if name not in _IMPLICIT}


def _apply(
    fn: Callable[..., Any], bound: inspect.BoundArguments, decision: GateDecision
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's (args, kwargs), with the server's rewritten arguments applied."""
    if decision.modified_arguments is None:
        return bound.args, bound.kwargs
    params = inspect.signature(fn).parameters
    unknown = set(decision.modified_arguments) - (set(bound.arguments) - _IMPLICIT)
    if unknown:
        raise GateUnavailable(
            f"Signoff rewrote arguments {sorted(unknown)} that {fn.__name__} does not take; not running it",
            decision=decision,
        )
    for name, value in decision.modified_arguments.items():
        kind = params[name].kind
        bound.arguments[name] = tuple(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
    return bound.args, bound.kwargs


def gate(
    client: GateClient | AsyncGateClient,
    *,
    action: str | None = None,
    key: str | Callable[..., str | None] | None = None,
    timeout_s: float | None = None,
    poll_s: float | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function only after Signoff allows the call.

    The call's bound arguments (``self``/``cls`` left out) are sent as the tool's
    arguments; rewritten arguments from the server replace them.

    Args:
        client: A :class:`GateClient`, or for coroutine functions an :class:`AsyncGateClient`
            (a sync client also works there; it waits in a worker thread).
        action: The tool name Signoff sees; default the function's ``__name__``.
        key: The idempotency key, or a callable taking the function's arguments and
            returning it. Default: a fresh key per call.
        timeout_s: Deadline for the whole call in seconds; default the client's.
        poll_s: Seconds per long-poll; default the client's.
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

        def request(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[inspect.BoundArguments, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            idempotency_key = key(*args, **kwargs) if callable(key) else key
            options: dict[str, Any] = {
                "session_id": session_id,
                "user_id": user_id,
                "metadata": metadata,
                "idempotency_key": idempotency_key,
                "deadline": timeout_s,
                "poll_timeout": poll_s,
            }
            return bound, options

        if is_async:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                bound, options = request(args, kwargs)
                arguments = _call_arguments(bound)
                if isinstance(client, AsyncGateClient):
                    decision = await client.require(name, arguments, **options)
                else:
                    decision = await asyncio.to_thread(
                        functools.partial(client.require, name, arguments, **options)
                    )
                call_args, call_kwargs = _apply(fn, bound, decision)
                return await cast(Callable[..., Any], fn)(*call_args, **call_kwargs)

            return cast(Callable[P, R], async_wrapper)

        sync_client = cast(GateClient, client)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound, options = request(args, kwargs)
            decision = sync_client.require(name, _call_arguments(bound), **options)
            call_args, call_kwargs = _apply(fn, bound, decision)
            return fn(*call_args, **call_kwargs)

        return cast(Callable[P, R], wrapper)

    return decorate


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
    timeout_s: float | None = None,
    poll_s: float | None = None,
) -> Iterator[GateDecision]:
    """``with gated(client, "tool", {...}) as decision:`` — the body runs only when allowed.

    Yields the allowing :class:`GateDecision` (``decision.arguments(args)`` gives the
    arguments to use, rewrites applied). Raises :class:`GateDenied` (or a subclass)
    on entry otherwise, so the body never runs.
    """
    yield client.require(
        action,
        args,
        session_id=session_id,
        tool_call_id=tool_call_id,
        user_id=user_id,
        metadata=metadata,
        idempotency_key=idempotency_key,
        deadline=timeout_s,
        poll_timeout=poll_s,
    )


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
    timeout_s: float | None = None,
    poll_s: float | None = None,
) -> AsyncIterator[GateDecision]:
    """``async with agated(client, "tool", {...}) as decision:`` — async :func:`gated`."""
    yield await client.require(
        action,
        args,
        session_id=session_id,
        tool_call_id=tool_call_id,
        user_id=user_id,
        metadata=metadata,
        idempotency_key=idempotency_key,
        deadline=timeout_s,
        poll_timeout=poll_s,
    )
