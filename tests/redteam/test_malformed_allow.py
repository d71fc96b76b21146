"""The Claude Code hook trusts only a well-formed approval.

An answer that says ``approved`` without naming the request it is about (a ``/wait`` record
with no ``id``), or an ``allow`` carrying a request record without a status, is not an
approval: the hook blocks the call (exit 2) as it does for every other malformed answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import free_port
from tests.hooks.test_claude_code_process import GATED, hook_env, start_hook


async def _serve(answers: dict[str, Any]) -> AsyncIterator[str]:
    """An HTTP/1.1 server answering each path prefix with a fixed JSON body."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(": ") for h in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                body = next(
                    json.dumps(b) for prefix, b in answers.items() if path.startswith(prefix)
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(
    params=[
        # /wait says "approved" without saying which request it is.
        {
            "/v1/hooks/pre-tool-use": {"decision": "pending", "request_id": "r1"},
            "/v1/requests/": {"status": "approved"},
        },
        # An allow whose own request record has no status.
        {"/v1/hooks/pre-tool-use": {"decision": "allow", "request_id": "r1", "request": {"id": "r1"}}},
    ],
    ids=["wait-without-id", "allow-record-without-status"],
)
async def malformed(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async for url in _serve(request.param):
        yield url


async def test_a_malformed_approval_blocks_the_call(malformed: str) -> None:
    proc = await start_hook(hook_env(malformed), GATED, "--timeout", "20")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, (out, err)
    assert b'"allow"' not in out
