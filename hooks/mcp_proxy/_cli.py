"""The ``signoff-mcp-proxy`` console script: read the command line, connect, serve, stop cleanly.

Exit status: 0 when the client went away (or on SIGTERM / SIGINT), 1 when the upstream
server exited under the proxy, 2 when the proxy could not start (one line on stderr
naming the cause; a traceback only with ``SIGNOFF_DEBUG=1``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from signoff.hooks.mcp_proxy._config import PROG, ConfigError, ProxyConfig, parse_args

if TYPE_CHECKING:
    from signoff.hooks.mcp_proxy._proxy import GatingProxy, Upstream

__all__ = ["EXIT_STARTUP", "EXIT_UPSTREAM_GONE", "main", "run"]

EXIT_UPSTREAM_GONE = 1
EXIT_STARTUP = 2
UPSTREAM_GONE_GRACE = 0.25
"""Seconds for the answers to in-flight calls to reach the client once the upstream is gone."""


def _say(message: str) -> None:
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


def _debug() -> bool:
    return os.environ.get("SIGNOFF_DEBUG", "").strip() not in ("", "0")


async def _watch_signals(stop: Callable[[], None]) -> None:
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            stop()
            return


async def _serve_stdio(proxy: GatingProxy) -> None:
    from signoff.hooks.mcp_proxy._stdio import serve_streams

    async with serve_streams() as (read, write):
        await proxy.server.run(read, write, proxy.server.create_initialization_options())


def _listening_socket(host: str, port: int) -> socket.socket:
    from signoff.hooks.mcp_proxy._proxy import StartupError

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


async def _serve_http(proxy: GatingProxy, config: ProxyConfig, stopper: list[Callable[[], None]]) -> None:
    import anyio
    import uvicorn

    from signoff.hooks.mcp_proxy._http import bearer_only, loopback_guard

    assert config.listen is not None
    host, port = config.listen
    sock = _listening_socket(host, port)
    app = proxy.server.streamable_http_app(host=host, transport_security=loopback_guard(host))
    asgi = bearer_only(app, config.listen_token) if config.listen_token else app

    class Server(uvicorn.Server):
        # The proxy handles SIGTERM itself: uvicorn's handler would re-raise the signal after
        # shutting down, killing the process before the upstream is stopped.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    settings = uvicorn.Config(asgi, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = Server(settings)

    def stop() -> None:
        server.should_exit = True

    async def announce() -> None:
        while not server.started:
            await anyio.sleep(0.05)
        shown = f"[{host}]" if ":" in host else host
        _say(f"serving {config.describe_upstream()} as {config.name!r} on http://{shown}:{port}/mcp")

    stopper.append(stop)
    with sock:
        async with anyio.create_task_group() as tg:
            tg.start_soon(announce)
            await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()


async def _watch_upstream(upstream: Upstream, stop: Callable[[], None], exit_code: list[int]) -> None:
    import anyio

    await upstream.gone.wait()
    _say(f"{upstream.description} exited; stopping (calls in flight were answered with an error)")
    exit_code[0] = EXIT_UPSTREAM_GONE
    await anyio.sleep(UPSTREAM_GONE_GRACE)
    stop()


async def run(config: ProxyConfig) -> int:
    """Run the proxy until its client goes away, a signal, or the upstream exits; the exit status."""
    import anyio

    from signoff.hooks._plain_async import AsyncPlainGateClient
    from signoff.hooks.mcp_proxy._clients import Clients
    from signoff.hooks.mcp_proxy._proxy import GatingProxy, connect_upstream

    # Asked about every call it relays: the lean HTTP/1.1 shell for http://, httpx for https://.
    gate = AsyncPlainGateClient(runtime="mcp", submit_deadline=config.submit_deadline)
    clients = Clients()
    stoppers: list[Callable[[], None]] = []
    exit_code = [0]

    # Signals are watched from the start, so that one arriving while the upstream starts
    # still stops it cleanly.
    async with gate, anyio.create_task_group() as tg:

        def stop() -> None:
            if stoppers:
                stoppers[0]()
            else:
                tg.cancel_scope.cancel()

        tg.start_soon(_watch_signals, stop)
        async with connect_upstream(config, clients) as upstream:
            proxy = GatingProxy(config, upstream, gate, clients)
            async with proxy.running():
                tg.start_soon(_watch_upstream, upstream, stop, exit_code)
                if config.listen is not None:
                    await _serve_http(proxy, config, stoppers)
                else:
                    await _serve_stdio(proxy)
        tg.cancel_scope.cancel()
    return exit_code[0]


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc`` or the groups it is wrapped in."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _find(inner, kinds)) is not None:
                return found
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """``signoff-mcp-proxy --name NAME [--hold S] -- COMMAND [ARG ...]`` (or ``--url URL``)."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if _debug() else logging.WARNING,
        format=f"{PROG}: %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        _say(str(exc))
        sys.exit(EXIT_STARTUP)
    try:
        from signoff.hooks.mcp_proxy._proxy import StartupError  # names the extra when the SDK is missing
    except ImportError as exc:
        _say(str(exc))
        sys.exit(EXIT_STARTUP)
    import anyio
    from mcp.shared.exceptions import MCPDeprecationWarning

    from signoff.hooks._gate import GateConfigError

    # The proxy relays deprecated features (logging, roots) on purpose.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    try:
        code = anyio.run(run, config)
    except KeyboardInterrupt:
        code = 0
    except BaseException as exc:
        if _debug():
            raise
        _say(_explain(exc, config, GateConfigError, StartupError))
        code = EXIT_STARTUP
    sys.exit(code)


def _explain(
    exc: BaseException, config: ProxyConfig, config_error: type[Exception], startup_error: type[Exception]
) -> str:
    """One line for what stopped the proxy."""
    import httpx2

    if (found := _find(exc, (config_error,))) is not None:
        return re.sub(r" \(or pass \w+=\.\.\.\)", " in the proxy's environment", str(found))
    if (found := _find(exc, (startup_error,))) is not None:
        return str(found)
    if (found := _find(exc, (httpx2.HTTPError,))) is not None:
        return f"cannot reach {config.describe_upstream()}: {type(found).__name__}: {found}"
    if (found := _find(exc, (OSError,))) is not None:
        return f"{type(found).__name__}: {found}"
    leaf = _find(exc, (Exception,)) or exc
    return f"stopped by an error ({type(leaf).__name__}: {leaf}); SIGNOFF_DEBUG=1 shows the traceback"
