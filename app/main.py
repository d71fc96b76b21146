"""The application factory and its lifespan (sweep, outbox, cross-process wake-ups)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import sqlalchemy as sa
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError
from sqlmodel import select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from signoff.app import receipt_keys, refusals, version
from signoff.app.bodies import storable
from signoff.app.console import mount as console
from signoff.app.db import RETRY_AFTER_SECONDS, UNAVAILABLE, is_sqlite, log_failure, transaction
from signoff.app.drain import STOPPING, AnswerCancelled, Drain
from signoff.app.logs import RequestId
from signoff.app.outbox import Dispatcher
from signoff.app.readiness import UNAVAILABLE as UNAVAILABLE_REASON
from signoff.app.replicas import REPORT_SECONDS
from signoff.app.requests.states import NOTIFY_CHANNEL, expire_overdue
from signoff.app.routers import admin, agent, approve, callbacks, ops, personal, receipts
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings, get_settings
from signoff.app.waiters import Draining, listen_for_decisions
from signoff.hooks import ServiceUnavailable

__all__ = ["create_app"]

log = logging.getLogger("signoff")


_NUL_IN_URL = (
    b'{"detail":[{"type":"value_error","loc":["path"],"msg":"the URL must not contain NUL characters"}]}'
)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413, whether or not Content-Length is sent, and
    URLs carrying NUL characters with 422 (no database can store or match them)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not storable(scope.get("path", "")) or b"%00" in scope.get("query_string", b""):
            # Shaped like FastAPI's own validation errors, as the schema documents 422.
            await _answer(send, 422, _NUL_IN_URL)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit():
                declared = int(value)
            elif name == b"transfer-encoding":
                declared = -1  # chunked: count what arrives
                break
        if declared is not None and declared > self.limit:
            await self._too_large(send)
            return
        if declared is None or declared >= 0:
            # The server reads no more than the declared length, and a request declaring
            # neither a length nor chunks has no body (RFC 9112, 6.3): nothing to count (a
            # parked long-poll holds no counting closures).
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        detail = {"detail": _TooLarge(self.limit).detail}
        await _answer(send, 413, json.dumps(detail, separators=(",", ":")).encode())


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """Raised as a body being read passes the limit. An HTTPException, so that FastAPI's
    routes let it through as they read the body, and the app's handler answers it 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than {limit} bytes")


async def _job(work: Callable[[], Awaitable[None]]) -> None:
    """A scheduled job. Cancelled by the server's stop, it ends without a word: what it was
    writing is rolled back, and the next run (here after a restart, or on another replica)
    does it."""
    with contextlib.suppress(asyncio.CancelledError):
        await work()


async def sweep(runtime: Runtime) -> None:
    """Expire overdue requests (APScheduler job; every replica runs it safely)."""
    try:
        while True:
            async with transaction(runtime.sessions) as session:
                expired = await expire_overdue(session)
            if len(expired) < 500:
                return
    except Exception:
        log_failure(log, "expiry sweep failed")


def _decision_listener(runtime: Runtime, settings: Settings) -> Coroutine[Any, Any, None] | None:
    """The LISTEN for decisions other processes commit, on SIGNOFF_LISTEN_DATABASE_URL (else
    SIGNOFF_DATABASE_URL unless it is pooled); None, with one warning, when there is none."""
    url = settings.listen_database_url
    if url is None and settings.database_pooling == "transaction":
        log.warning(
            "decisions made by other processes wake waiters only by the %g s poll: "
            "SIGNOFF_DATABASE_POOLING=transaction and no SIGNOFF_LISTEN_DATABASE_URL (LISTEN needs "
            "a session of its own); set it to PostgreSQL itself",
            settings.cross_process_poll_seconds,
        )
        return None
    dsn = make_url(url or settings.database_url).set(drivername="postgresql")

    async def probe(payload: str) -> None:
        async with transaction(runtime.sessions) as session:
            await session.exec(select(sa.func.pg_notify(NOTIFY_CHANNEL, payload)))

    return listen_for_decisions(
        dsn.render_as_string(hide_password=False),
        runtime.hub,
        NOTIFY_CHANNEL,
        probe=probe,
        poll_seconds=settings.cross_process_poll_seconds,
    )


def _reload_on_sighup(runtime: Runtime) -> None:
    """``kill -HUP`` reloads ``SIGNOFF_CONFIG`` (each replica its own file)."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[object]] = set()

    def reload() -> None:
        task = loop.create_task(runtime.reload(), name="config-reload")
        pending.add(task)
        task.add_done_callback(pending.discard)

    try:
        loop.add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        log.warning("SIGHUP cannot reload the configuration here; use POST /v1/admin/config/reload")


async def _prepare_receipts(runtime: Runtime) -> None:
    """The receipts' key in use: the operator's (``SIGNOFF_RECEIPT_KEY[_FILE]``), or the
    database's own, made now on the first start."""
    s = runtime.settings
    secret = s.receipt_key.get_secret_value() if s.receipt_key is not None else None
    try:
        kid = await receipt_keys.prepare(
            runtime.sessions, receipt_keys.operator_key(secret, s.receipt_key_file)
        )
    except receipt_keys.KeyUnavailable as exc:
        # (`signoff serve` refuses to start then.) Decisions fail closed: none is made unsigned.
        log.error("%s", exc)
        return
    except Exception as exc:
        # The database may be down at start: the first receipt makes or reads the key then.
        log.warning("the receipts' key was not read at start (%s: %s)", type(exc).__name__, exc)
        return
    log.info("receipts are signed with key %s (GET /v1/receipts/keys)", kid)


def create_app(
    runtime: Runtime | None = None, *, settings: Settings | None = None, background: bool = True
) -> FastAPI:
    """Build the app. Tests pass a ``runtime``; ``background=False`` skips sweep and outbox loops."""
    settings = settings or (runtime.settings if runtime else get_settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = runtime or Runtime.create(settings)
        app.state.runtime = rt
        drain: Drain = app.state.drain

        def stopping() -> None:
            parked = rt.hub.drain()
            log.info(
                "stopping: %d waiting agents told to wait again elsewhere; finishing the requests "
                "in flight and the outbox's sends (at most %g s)",
                parked,
                drain.seconds,
            )

        drain.on_begin(stopping)
        await _prepare_receipts(rt)
        tasks: list[asyncio.Task[None]] = []
        outbox: asyncio.Task[None] | None = None
        scheduler = AsyncIOScheduler()
        # Webhooks share one client (its connections); redirects are never followed.
        http = httpx.AsyncClient(follow_redirects=False)
        if background:
            await rt.start_channels()
            _reload_on_sighup(rt)
            scheduler.add_job(
                _job,
                "interval",
                args=[functools.partial(sweep, rt)],
                seconds=settings.sweep_interval_seconds,
                max_instances=1,
                coalesce=True,
                id="expiry-sweep",
                # At once on start, in the background: a backlog of overdue requests never
                # holds up serving.
                next_run_time=datetime.now(UTC),
            )
            scheduler.add_job(
                _job,
                "interval",
                args=[rt.report_replica],
                seconds=REPORT_SECONDS,
                max_instances=1,
                coalesce=True,
                id="replica-report",
                next_run_time=datetime.now(UTC),
            )
            scheduler.add_job(
                _job,
                "interval",
                args=[rt.observe_decisions],
                seconds=settings.cross_process_poll_seconds,
                max_instances=1,
                coalesce=True,
                id="decisions-elsewhere",
            )
            scheduler.add_job(
                rt.refusals.flush,
                "interval",
                seconds=refusals.WINDOW_SECONDS,
                max_instances=1,
                coalesce=True,
                id="refusals-flush",
            )
            scheduler.start()
            dispatcher = Dispatcher(
                rt.sessions,
                rt.channels,
                lambda: rt.config,
                wake=rt.outbox_wake,
                reads=rt.reads,
                poll_seconds=settings.outbox_poll_seconds,
                lease_seconds=settings.outbox_lease_seconds,
                http=http,
                public_url=settings.public_url,
            )
            outbox = asyncio.create_task(dispatcher.run(), name="outbox")
            tasks.append(outbox)
            drain.on_begin(dispatcher.stop)
            tasks.append(
                asyncio.create_task(
                    rt.hub.poll_other_processes(rt.recently_decided, settings.cross_process_poll_seconds),
                    name="wake-poller",
                )
            )
            if not is_sqlite(settings.database_url):
                listener = _decision_listener(rt, settings)
                if listener is not None:
                    tasks.append(asyncio.create_task(listener, name="decision-listener"))
        try:
            yield
        finally:
            drain.begin()  # begun already when uvicorn stopped on a signal (drain.Server)
            if background:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            if scheduler.running:
                scheduler.shutdown(wait=False)
            if outbox is not None:
                # The deliveries it holds are sent and recorded, not left to their lease.
                await asyncio.wait({outbox}, timeout=drain.remaining())
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await http.aclose()
            # The refusals tallied since the last flush go on record before the process ends.
            await rt.refusals.flush()
            if runtime is None:
                await rt.aclose()

    # /docs and /redoc load their scripts from the package, not a CDN: they work offline.
    app = FastAPIOffline(
        title="Signoff",
        summary="Human approval for AI agents' tool calls",
        version=version(),
        lifespan=lifespan,
        # Signoff exports Prometheus metrics, not OpenTelemetry: without this FastAPI asks
        # the OpenTelemetry globals (environment look-ups) on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    if runtime is not None:
        app.state.runtime = runtime
    app.state.drain = Drain(settings.shutdown_seconds)
    app.include_router(agent.router)
    app.include_router(admin.router)
    app.include_router(callbacks.router)
    app.include_router(approve.router)
    app.include_router(ops.router)
    app.include_router(receipts.router)
    app.include_router(personal.router)
    console.install(app, settings)

    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        cause = exc.__cause__ if isinstance(exc, ServiceUnavailable) and exc.__cause__ else exc
        rt: Runtime | None = getattr(request.app.state, "runtime", None)
        reason = await rt.readiness.explain(cause) if rt is not None else UNAVAILABLE_REASON
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        log.error("%s (on %s: %s: %s)", reason, request.url.path, type(cause).__name__, first)
        return JSONResponse({"detail": reason}, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    async def stopping(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": STOPPING}, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    async def unstorable(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "a value cannot be stored (out of range or not valid text)"}, 422)

    # Bad data reaching the database is the client's fault: 422, not "unavailable".
    app.add_exception_handler(DataError, unstorable)
    app.add_exception_handler(Draining, stopping)
    # A driver error, a refused connection or an exhausted pool, whether met by a route or by
    # a hook's services: the agent is told to retry (its client keeps trying within its own
    # deadline, then denies), never handed a final deny or a 500.
    for kind in (*UNAVAILABLE, ServiceUnavailable):
        app.add_exception_handler(kind, database_unavailable)

    app.middleware_stack = _with_edge(app, settings)
    return app


def _with_edge(app: FastAPI, settings: Settings) -> ASGIApp:
    """``app``'s middleware stack inside Signoff's own middlewares (a middleware added later
    is refused, as Starlette refuses one once serving; FastAPI's own stack is built at the
    first request that reaches it, with the exception handlers the app has by then).

    Starlette puts the middlewares an app adds inside FastAPI's own (its error page, its
    telemetry, its body limit); these go outside them, so a parked long-poll and every gated
    call skip those layers, a coroutine frame or two each held for as long as an agent waits
    (1.1 KiB of a parked waiter). Their errors are answered by the app's exception handlers
    (:class:`signoff.app.routers.agent.AgentHotPaths`); one that none answers reaches uvicorn,
    which logs it and answers 500, as FastAPI's error layer would. Innermost first: the
    agents' hot paths are answered within the body limit, the request id and the drain.
    """
    stack: ASGIApp = agent.AgentHotPaths(_FastAPIStack(app))
    stack = BodyLimit(stack, limit=settings.max_body_bytes)
    stack = RequestId(stack)
    return AnswerCancelled(stack, drain=app.state.drain)


class _FastAPIStack:
    """FastAPI's own middleware stack (its error page, its exception handlers, its router),
    built at the first request, as Starlette builds an app's stack: an exception handler
    registered after :func:`create_app` and before serving counts."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._stack: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._stack is None:
            self._stack = self._app.build_middleware_stack()
        await self._stack(scope, receive, send)
