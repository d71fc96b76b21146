"""Receiving card callbacks over lark-oapi's WebSocket long connection.

lark-oapi 1.7.5's ``ws.Client`` runs on a module-level event loop
(``lark_oapi.ws.client.loop``, captured at import) and ``start()`` calls
``run_until_complete`` on it, which fails inside a running server
(oapi-sdk-python#119, #133). Every long connection in this process therefore
runs on one dedicated thread with its own loop, installed as that module-level
loop; the SDK's ``start()`` is replaced by the same steps (connect, reconnect
on failure, ping loop) driven from that loop. The SDK calls the event handler
synchronously on that thread; the handler hands the payload to the server's
loop and waits for the answer, which goes back to Feishu in the ACK frame.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["LongConnection"]

logger = logging.getLogger("signoff.channels.feishu")

WsHandle = Callable[[bytes], Awaitable[Mapping[str, Any] | None]]
_STOP_GRACE = 3.0


class _SharedLoop:
    """The one thread and event loop that all long connections of this process share."""

    _lock = threading.Lock()
    _current: _SharedLoop | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.users = 0
        self._sdk_loop_before: Any = None
        self._thread = threading.Thread(target=self._run, name="feishu-long-connection", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    @classmethod
    def acquire(cls) -> _SharedLoop:
        import lark_oapi.ws.client as sdk_ws

        with cls._lock:
            if cls._current is None:
                shared = cls()
                shared._sdk_loop_before = sdk_ws.loop
                sdk_ws.loop = shared.loop
                shared._thread.start()
                cls._current = shared
            cls._current.users += 1
            return cls._current

    async def release(self) -> None:
        import lark_oapi.ws.client as sdk_ws

        with self._lock:
            self.users -= 1
            if self.users:
                return
            type(self)._current = None
            sdk_ws.loop = self._sdk_loop_before
        await _within_grace(
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop), "cancelling its tasks"
        )
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, _STOP_GRACE)


async def _within_grace(future: concurrent.futures.Future[None], what: str) -> None:
    # The SDK makes blocking HTTP calls on the loop thread (endpoint discovery has no
    # timeout); shutting down must not hang on them. The thread is a daemon.
    try:
        await asyncio.wait_for(asyncio.wrap_future(future), 2 * _STOP_GRACE)
    except TimeoutError:
        logger.warning("Feishu long connection: gave up %s after %.0f s", what, 2 * _STOP_GRACE)


async def _cancel_all() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_STOP_GRACE)


def _belongs_to(task: asyncio.Task[Any], client: object) -> bool:
    # The SDK starts its receive and message tasks with bare loop.create_task calls
    # and keeps no handle; find them by the client their coroutine runs on.
    frame = getattr(task.get_coro(), "cr_frame", None)
    return frame is not None and frame.f_locals.get("self") is client


class _EventHandler:
    """Stands in for ``EventDispatcherHandler``: the SDK calls ``_do_without_validation``."""

    def __init__(self, handle: WsHandle, server_loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._handle = handle
        self._server_loop = server_loop
        self._timeout = timeout

    def _do_without_validation(self, payload: bytes) -> Mapping[str, Any] | None:
        async def run() -> Mapping[str, Any] | None:
            return await self._handle(payload)

        future = asyncio.run_coroutine_threadsafe(run(), self._server_loop)
        try:
            return future.result(timeout=self._timeout)
        except concurrent.futures.TimeoutError:
            # The ACK goes out with code 500; the click itself carries on in the server loop.
            logger.warning("Feishu long connection: no answer within %.1f s", self._timeout)
            raise


class LongConnection:
    """One app's long connection, delivering payloads to ``handle`` on the server's loop."""

    def __init__(
        self,
        *,
        channel_name: str,
        app_id: str,
        app_secret: str,
        origin: str,
        handle: WsHandle,
        answer_timeout: float,
    ) -> None:
        self._name = channel_name
        self._app_id = app_id
        self._app_secret = app_secret
        self._origin = origin
        self._handle = handle
        self._answer_timeout = answer_timeout
        self._shared: _SharedLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None

    async def start(self) -> None:
        """Connect in the background; failures are logged and retried by the SDK."""
        handler = _EventHandler(self._handle, asyncio.get_running_loop(), self._answer_timeout)
        self._shared = _SharedLoop.acquire()

        async def spawn() -> None:
            self._task = asyncio.create_task(self._run(handler))

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(spawn(), self._shared.loop))

    async def _run(self, handler: _EventHandler) -> None:
        import lark_oapi as lark
        from lark_oapi.ws.exception import ClientException

        # Built on the shared loop: its constructor starts a cache task on the current loop.
        client = lark.ws.Client(
            self._app_id, self._app_secret, event_handler=handler, domain=self._origin, auto_reconnect=True
        )
        self._client = client
        try:
            try:
                await client._connect()
            except ClientException:
                raise
            except Exception as exc:
                logger.warning("Feishu channel %s: connecting failed (%s); retrying", self._name, exc)
                await client._disconnect()
                await client._reconnect()
            logger.info("Feishu channel %s: long connection established", self._name)
            await client._ping_loop()
        except ClientException as exc:
            # Bad credentials or the 50-connection limit: retrying cannot help.
            logger.error("Feishu channel %s: long connection refused: %s", self._name, exc)
        except Exception as exc:
            logger.error("Feishu channel %s: long connection stopped: %s", self._name, exc)

    async def stop(self) -> None:
        """Close the connection and release the shared loop."""
        shared, self._shared = self._shared, None
        if shared is None:
            return
        await _within_grace(asyncio.run_coroutine_threadsafe(self._stop(), shared.loop), "closing")
        await shared.release()

    async def _stop(self) -> None:
        client = self._client
        tasks = [self._task] if self._task is not None else []
        if client is not None:
            client._auto_reconnect = False
            tasks += [task for task in asyncio.all_tasks() if _belongs_to(task, client)]
            client._cache._cron.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=_STOP_GRACE)
        if client is not None:
            await client._disconnect()
