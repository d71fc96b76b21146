"""A session grant given to one 2026-07-28 client of a listening MCP proxy, reaching another.

Over HTTP, the proxy names its session to Signoff as its process and the client's own
session (``Mcp-Session-Id``). A 2026-07-28 client has none: each of its requests is one
self-contained POST, and any other client of the proxy sends the same. An approver's
"this session, 1 hour" on one such client's call is not a grant to every agent that
connects to the proxy: a call made in no session is offered no session grant and never
covered by one, so the second client's payment is asked of the approvers, and does not run.
"""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from signoff.app.config import SignoffConfig, parse_config
from tests.conftest import DEFAULT_CONFIG, Server, free_port
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (the upstream's fork server, a fixture)
    FORKED,
    GATE,
    PROXY,
    REPO,
    forkserver,
    logged,
    process,
    proxy_env,
    text,
)
from tests.redteam.support import decide
from tests.redteam.test_mcp_wire_shapes import ran


@pytest.fixture
def config() -> SignoffConfig:
    gate = {**GATE, "grants": [{"scope": "session", "for": "1h"}]}
    raw = copy.deepcopy(DEFAULT_CONFIG)
    return parse_config({**raw, "agents": {"finance-bot": {"hooks": [gate]}}}, source="test.yaml")


@contextmanager
def listening(tmp_path: Path, signoff: str, key: str) -> Iterator[str]:
    port = free_port()
    env = proxy_env(signoff, key)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), str(REPO)] if p)
    options = [
        "--name",
        "up",
        "--hold",
        "0.3",
        "--listen",
        f"127.0.0.1:{port}",
        "--",
        *FORKED,
        *logged(tmp_path),
    ]
    with (
        (tmp_path / "proxy.err").open("a") as errlog,
        process([*PROXY, *options], env=env, stderr=errlog) as proxy,
    ):
        deadline = time.monotonic() + 30
        while True:
            assert proxy.poll() is None, f"the proxy exited with {proxy.returncode}"
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the proxy did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"


@asynccontextmanager
async def client_of(url: str, mode: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient() as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client,
    ):
        yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_session_grant_to_one_client_of_a_listening_proxy_does_not_cover_another(
    server: Server, agent_key: str, admin_headers: dict[str, str], tmp_path: Path, mode: str
) -> None:
    first = {"invoice_id": "inv-1", "amount": 90_000}
    second = {"invoice_id": "inv-2", "amount": 95_000}
    async with httpx.AsyncClient(base_url=server.url, headers=admin_headers) as admin:

        async def pending() -> list[dict[str, Any]]:
            return list((await admin.get("/v1/admin/requests?status=pending")).json())

        with listening(tmp_path, server.url, agent_key) as url:
            async with client_of(url, mode) as one, client_of(url, mode) as other:
                assert one.protocol_version == other.protocol_version
                assert (await one.call_tool("pay_invoice", first)).is_error
                (asked,) = await pending()
                granted = await decide(admin, asked["id"], grant={"scope": "session", "for": "1h"})
                if mode == "auto":  # a call in no session: no session grant to give
                    assert asked["session_id"] is None
                    assert granted.status_code == 409, granted.text
                    assert "names no session" in granted.json()["detail"]
                    granted = await decide(admin, asked["id"])
                assert granted.status_code == 200, granted.text
                assert text(await one.call_tool("pay_invoice", first)) == "paid inv-1: 90000"
                by_other = await other.call_tool("pay_invoice", second)
                assert by_other.is_error, text(by_other)
                assert "is waiting for approval" in text(by_other)
                assert [r["arguments"] for r in await pending()] == [second]

                for _ in range(250):  # the proxy reports the call that ran, in the background
                    record = (await admin.get(f"/v1/admin/requests/{asked['id']}")).json()
                    if record["executed_at"] is not None:
                        break
                    await asyncio.sleep(0.02)
                assert record["executed_at"] is not None
    assert [c["arguments"]["invoice_id"] for c in ran(tmp_path)] == ["inv-1"]
