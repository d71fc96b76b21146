"""``GET /v1/requests/{id}/wait`` is answered ahead of the router (``AgentHotPaths``) exactly as
the FastAPI route answers it: the same status, body and headers for every key, id and timeout,
decided, timed out, unknown, another agent's, refused and draining."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.keys import create_key, revoke_keys
from signoff.app.main import create_app
from signoff.app.operators import decide
from signoff.app.routers import agent as agent_router
from signoff.app.routers.agent import answer_wait
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.waiting import eventually

HEADERS = ("content-type", "retry-after", "www-authenticate")


def _routed_only(runtime: Runtime) -> FastAPI:
    """The app without Signoff's own middlewares, the hot paths among them: the route answers
    (the others add a request id and answer bodies and cancellations, none of a wait's)."""
    app = create_app(runtime, background=False)
    app.middleware_stack = app.build_middleware_stack()
    return app


@pytest.fixture
async def both(runtime: Runtime) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    fast = httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(runtime, background=False)), base_url="http://t"
    )
    routed = httpx.AsyncClient(transport=httpx.ASGITransport(_routed_only(runtime)), base_url="http://t")
    async with fast, routed:
        yield fast, routed


def _answer(r: httpx.Response) -> tuple[int, Any, dict[str, str | None]]:
    return r.status_code, r.json(), {h: r.headers.get(h) for h in HEADERS}


async def _pending(runtime: Runtime, http: httpx.AsyncClient, key: str, n: int) -> str:
    r = await http.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": "pay_x", "arguments": {"amount": 90000 + n}},
        headers={"Authorization": f"Bearer {key}"},
    )
    rid: str = r.json()["request_id"]
    return rid


async def test_every_wait_is_answered_as_the_route_answers_it(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient],
    runtime: Runtime,
    agent_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast, routed = both
    answered: list[str] = []

    async def counted(scope: Any, request_id: str) -> bytes:
        answered.append(request_id)
        return await answer_wait(scope, request_id)

    monkeypatch.setattr(agent_router, "answer_wait", counted)
    async with transaction(runtime.sessions) as s:
        _, other = await create_key(s, "other-bot", actor=Actor("test"))
        _, revoked = await create_key(s, "ghost", actor=Actor("test"))
    async with transaction(runtime.sessions) as s:
        await revoke_keys(s, agent_id="ghost", actor=Actor("test"))
    pending = await _pending(runtime, fast, agent_key, 1)
    decided = await _pending(runtime, fast, agent_key, 2)
    async with transaction(runtime.sessions) as s:
        await decide(s, decided, verdict=Verdict.REJECT, operator="alice", config=runtime.config, reason="no")
    keys = {
        "live": f"Bearer {agent_key}",
        "odd spelling": f"bearer  {agent_key}",
        "another agent's": f"Bearer {other}",
        "revoked": f"Bearer {revoked}",
        "another scheme": "Basic YWxpY2U6cHc=",
        "missing": None,
    }
    ids = {"pending": pending, "decided": decided, "unknown": "f" * 32, "too long": "x" * 40, "odd": "a%20b"}
    timeouts: dict[str, str | None] = {
        "default (decided)": None,
        "zero": "0",
        "short": "0.05",
        "text": "soon",
        "empty": "",
        "negative": "-1",
        "too long": "61",
        "infinite": "inf",
        "twice, last wins": "abc&timeout=0",
    }
    for key_name, authorization in keys.items():
        headers = {"Authorization": authorization} if authorization else {}
        for id_name, rid in ids.items():
            for t_name, t in timeouts.items():
                if t is None and id_name == "pending" and key_name in ("live", "odd spelling"):
                    continue  # would wait 30 s
                url = f"/v1/requests/{rid}/wait" + ("" if t is None else f"?timeout={t}")
                before = len(answered)
                got = await fast.get(url, headers=headers)
                assert len(answered) == before + 1, "answered ahead of the router"
                want = await routed.get(url, headers=headers)
                assert len(answered) == before + 1, "answered by the route"
                assert _answer(got) == _answer(want), (key_name, id_name, t_name)


async def test_a_waiter_is_woken_and_a_draining_one_told_to_wait_elsewhere_alike(
    both: tuple[httpx.AsyncClient, httpx.AsyncClient], runtime: Runtime, agent_key: str
) -> None:
    headers = {"Authorization": f"Bearer {agent_key}"}
    for http in both:
        rid = await _pending(runtime, http, agent_key, id(http) % 1000)
        waiter = asyncio.create_task(http.get(f"/v1/requests/{rid}/wait?timeout=20", headers=headers))
        await eventually(lambda: runtime.hub.waiting == 1)  # parked in its long-poll
        assert not waiter.done()
        async with transaction(runtime.sessions) as s:
            await decide(s, rid, verdict=Verdict.APPROVE, operator="alice", config=runtime.config)
        woken = await asyncio.wait_for(waiter, 10)
        assert (woken.status_code, woken.json()["status"]) == (200, "approved")

    fast, routed = both
    rids = [await _pending(runtime, fast, agent_key, 500 + i) for i in range(2)]
    waiters = [
        asyncio.create_task(http.get(f"/v1/requests/{rid}/wait?timeout=20", headers=headers))
        for http, rid in zip((fast, routed), rids, strict=True)
    ]
    await eventually(lambda: runtime.hub.waiting == 2)
    runtime.hub.drain()
    got, want = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert got.status_code == 503
    assert _answer(got) == _answer(want)
    assert got.headers["retry-after"]
