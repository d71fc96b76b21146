"""What the proxy adds to the SDK's streamable-HTTP app: an optional bearer token for its clients."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["bearer_only"]


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
