"""What the proxy adds to the SDK's streamable-HTTP app: an optional bearer token for its clients,
and the Host and Origin checks that keep web pages off a proxy listening on a loopback address."""

from __future__ import annotations

import hmac
import ipaddress

from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from signoff.hooks.mcp_proxy._config import loopback

__all__ = ["bearer_only", "loopback_guard"]

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def loopback_guard(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for a proxy listening on the loopback address ``host``: only
    requests naming a loopback address (``Host``, and ``Origin`` when a browser sends one) are
    served, so a web page whose name was made to resolve to that address cannot call the
    upstream's tools. The SDK turns it on by itself only for ``127.0.0.1``, ``localhost`` and
    ``::1`` as spelled so; any other loopback address (``127.0.0.2``, ``0:0:0:0:0:0:0:1``) gets
    it here. ``None`` for an address beyond loopback, which takes a bearer token instead."""
    if not loopback(host):
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        spellings = [host]  # localhost
    else:
        spellings = [
            f"[{s}]" if address.version == 6 else s for s in dict.fromkeys([host, address.compressed])
        ]
    names = list(dict.fromkeys([*spellings, *_LOOPBACK_NAMES]))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in names],
        allowed_origins=[f"http://{name}:*" for name in names],
    )


def bearer_only(app: ASGIApp, token: str) -> ASGIApp:
    """``app``, answering 401 to HTTP requests without ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, expected):
                refused = JSONResponse(
                    {"error": "this MCP proxy needs Authorization: Bearer <token>"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refused(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded
