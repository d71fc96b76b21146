"""Signoff's own middlewares (the drain, the request id, the body limit, the agents' hot
paths) run outside FastAPI's, built once with the app (``signoff.app.main._with_edge``): what
reaches them still gets its answer, through a real server."""

from __future__ import annotations

import httpx
import pytest
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware

from signoff.app.main import create_app
from signoff.app.routers import agent as agent_router
from signoff.app.runtime import Runtime
from tests.conftest import Server

CALL = {"tool_name": "pay_x", "arguments": {"amount": 90000}}


async def test_an_error_no_handler_answers_in_a_hot_path_is_a_500_and_the_server_serves_on(
    runtime: Runtime, agent_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside FastAPI's error layer, uvicorn answers it 500 (and logs it); the next call and
    the next wait are answered as ever, each with its request id."""
    headers = {"Authorization": f"Bearer {agent_key}"}
    real = agent_router.answer_pre_tool_use

    async def broken(request: object) -> object:
        raise RuntimeError("a bug")

    async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        monkeypatch.setattr(agent_router, "answer_pre_tool_use", broken)
        failed = await http.post("/v1/hooks/pre-tool-use", json=CALL, headers=headers)
        assert failed.status_code == 500
        monkeypatch.setattr(agent_router, "answer_pre_tool_use", real)
        asked = await http.post("/v1/hooks/pre-tool-use", json=CALL, headers=headers)
        assert asked.status_code == 200
        assert asked.json()["decision"] == "pending"
        assert asked.headers["x-request-id"]
        rid = asked.json()["request_id"]
        waited = await http.get(f"/v1/requests/{rid}/wait", params={"timeout": 0}, headers=headers)
        assert waited.status_code == 200
        assert waited.json()["status"] == "pending"
        given = await http.get(
            f"/v1/requests/{rid}/wait", params={"timeout": 0}, headers={**headers, "X-Request-ID": "abc"}
        )
        assert given.headers["x-request-id"] == "abc"


async def test_a_middleware_added_after_the_app_is_built_is_refused(runtime: Runtime) -> None:
    """It would run inside FastAPI's layers, not where it was meant to: Starlette refuses it."""
    app = create_app(runtime, background=False)
    with pytest.raises(RuntimeError, match="Cannot add middleware"):
        app.add_middleware(BaseHTTPMiddleware)


async def test_a_500_from_a_route_carries_its_request_id(runtime: Runtime) -> None:
    """FastAPI's error layer now answers inside the request id's: an operator can find the
    log lines of the request that failed."""
    app = create_app(runtime, background=False)

    @app.get("/fails")
    async def fails() -> None:
        raise RuntimeError("a bug")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as http:
        r = await http.get("/fails", headers={"X-Request-ID": "trace-7"})
    assert r.status_code == 500
    assert r.headers["x-request-id"] == "trace-7"


class _Late(Exception):
    pass


async def test_an_exception_handler_registered_after_create_app_answers_for_the_routes(
    runtime: Runtime,
) -> None:
    """FastAPI's own stack is built at the first request, as Starlette builds one: a handler
    registered before serving answers a route's error as the hot paths' errors are answered
    (they look handlers up as they go)."""
    app = create_app(runtime, background=False)

    async def late(request: object, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": "late"}, status_code=409)

    app.add_exception_handler(_Late, late)

    @app.get("/late")
    async def raises() -> None:
        raise _Late

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as http:
        r = await http.get("/late")
    assert (r.status_code, r.json()) == (409, {"detail": "late"})
