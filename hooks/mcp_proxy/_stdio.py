"""Serving MCP over the proxy's own stdin and stdout, without a thread per line.

The SDK's :func:`mcp.server.stdio.stdio_server` reads and writes through a worker
thread (``anyio.wrap_file``), which costs a thread hand-off for every line each way.
When stdin and stdout are pipes or sockets (as an MCP client spawns a server) the
proxy reads and writes them on the event loop instead; anything else (a terminal, a
file) goes through the SDK's transport. Either way fd 0 and fd 1 are pointed away from
the wire (to the null device and to stderr) once serving starts, so stray output can
never corrupt it; the fast path leaves them so until the process exits.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

__all__ = ["serve_streams"]

MAX_LINE = 64 * 1024 * 1024
"""Bytes one JSON-RPC message may take on the wire."""


def _pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def serve_streams() -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) stream pair of the client's connection over stdio."""
    if not (_pipe_or_socket(0) and _pipe_or_socket(1)):
        async with stdio_server() as streams:
            yield streams
        return
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    # The wire is served from the duplicates; fd 0 reads EOF and fd 1 goes to stderr.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=MAX_LINE)
    in_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
    )
    out_transport, out_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(out_transport, out_protocol, None, loop)

    to_server, from_client = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    to_client, from_server = anyio.create_memory_object_stream[SessionMessage](16)

    async def read_lines() -> None:
        async with to_server:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as end:
                    line = end.partial
                    if not line.strip():
                        return
                except asyncio.LimitOverrunError as exc:
                    await to_server.send(ValueError(f"a message longer than {MAX_LINE} bytes"))
                    await reader.readexactly(exc.consumed)
                    continue
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as exc:
                    await to_server.send(exc)
                    continue
                await to_server.send(SessionMessage(message))

    async def write_lines() -> None:
        async with from_server:
            async for item in from_server:
                writer.write(item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                await writer.drain()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_lines)
            tg.start_soon(write_lines)
            try:
                yield from_client, to_client
            finally:
                tg.cancel_scope.cancel()
    finally:
        in_transport.close()
        with suppress(ConnectionError, RuntimeError):
            await writer.drain()
        out_transport.close()
