"""The MCP proxy listening on a loopback address without a token, reached from a web page.

``--listen`` needs no token on a loopback address, since only this machine reaches it. A web
page in the user's browser reaches it too once its own name resolves to that address (DNS
rebinding): its requests then name the page's host, not a loopback one. Whatever loopback
address the proxy listens on (``127.0.0.2``, a long spelling of ``::1``), such a request is
refused before it reaches the upstream, while an MCP client on the machine is served.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import free_port
from tests.hooks.signoff_fakes import KEY, LiveSignoff
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (the upstream's fork server, a fixture)
    FORKED,
    PROXY,
    REPO,
    forkserver,
    logged,
    process,
    proxy_env,
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "page", "version": "1"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def _bindable(host: str) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


@contextmanager
def _listening(tmp_path: Path, host: str) -> Iterator[str]:
    """The real proxy process serving streamable HTTP on ``host`` (no token), in front of the test
    upstream, asking a stand-in Signoff that allows every call."""
    live = LiveSignoff(policy=lambda tool, args: "allow").start()
    port = free_port()
    shown = f"[{host}]" if ":" in host else host
    env = proxy_env(live.url, KEY)
    # The proxy imports signoff as this test run does, and the tests' upstream from the checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), str(REPO)] if p)
    options = ["--name", "up", "--listen", f"{shown}:{port}", "--", *FORKED, *logged(tmp_path)]
    try:
        with process([*PROXY, *options], env=env) as proxy:
            deadline = time.monotonic() + 30
            while True:
                assert proxy.poll() is None, f"the proxy exited with {proxy.returncode}"
                try:
                    socket.create_connection((host, port), 0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the proxy did not listen"
                    time.sleep(0.05)
            yield f"http://{shown}:{port}/mcp"
    finally:
        live.stop()


@pytest.mark.parametrize("host", ["127.0.0.2", "0:0:0:0:0:0:0:1"])
async def test_a_web_page_rebound_to_the_proxys_loopback_address_is_refused(
    tmp_path: Path,
    host: str,
    forkserver: None,  # noqa: F811
) -> None:
    if not _bindable(host):
        pytest.skip(f"{host} cannot be bound here")
    with _listening(tmp_path, host) as url:
        port = url.rsplit(":", 1)[1].split("/")[0]
        page = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
        rebound = httpx.post(url, json=INITIALIZE, headers={**ACCEPT, **page})
        assert rebound.status_code in (400, 403, 421), rebound.text
        no_origin = httpx.post(url, json=INITIALIZE, headers={**ACCEPT, "Host": f"attacker.example:{port}"})
        assert no_origin.status_code in (400, 403, 421), no_origin.text
        # An MCP client of this machine is still served.
        async with (
            httpx2.AsyncClient() as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
        ):
            result = await client.call_tool("echo", {"text": "here"})
        assert not result.is_error
