"""SIGTERM drains a real ``signoff serve``: agents parked on a wait are answered at once with a
503 and ``Retry-After`` (never a 500), the webhook it is sending is sent and recorded, and the
process exits; the client library re-attaches to the next server on the same port and
database and gets its decision there. No traceback reaches the log."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
import uvicorn
import yaml
from sqlalchemy.engine import make_url
from starlette.types import Receive, Scope, Send

from signoff.app.audit import Actor
from signoff.app.db import create_engine, migrate, sessionmaker, transaction
from signoff.app.drain import STOPPING
from signoff.app.keys import create_key
from signoff.app.runtime import Runtime
from signoff.hooks.client import AsyncGateClient
from tests.app.serving import Served, environment, serve
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server, free_port

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
CLIENTS = 3


@dataclass
class SlowReceiver:
    """A webhook receiver that takes ``stall`` seconds to answer each delivery."""

    stall: float
    port: int = field(default_factory=free_port)
    arrived: list[bytes] = field(default_factory=list)
    answered: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.arrived.append(body)
        await asyncio.sleep(self.stall)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        self.answered += 1


@pytest.fixture
async def receiver() -> AsyncIterator[SlowReceiver]:
    rx = SlowReceiver(stall=2.0)
    server = uvicorn.Server(
        uvicorn.Config(rx, host="127.0.0.1", port=rx.port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield rx
    server.should_exit = True
    await task


async def _key(url: str) -> str:
    engine = create_engine(url)
    try:
        async with transaction(sessionmaker(engine)) as session:
            _, token = await create_key(session, "finance-bot", actor=Actor("test"))
        return token
    finally:
        await engine.dispose()


async def _webhook_rows(url: str) -> list[tuple[str, int]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT status, attempts FROM delivery WHERE kind = 'webhook'"))
            return [(str(s), int(n)) for s, n in rows]
    finally:
        await engine.dispose()


async def _waiting(http: httpx.AsyncClient, served: Served, count: int) -> None:
    """Until ``count`` agents are parked on waits at ``served`` (its ``signoff_waiters``)."""
    for _ in range(600):
        with contextlib.suppress(httpx.HTTPError):
            metrics = (await http.get(f"{served.url}/metrics")).text
            found = re.search(r"^signoff_waiters (\S+)$", metrics, re.M)
            if found and float(found.group(1)) == count:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} waiters never parked at {served.url}")


def _clean(log: str) -> None:
    assert "Traceback" not in log, log
    assert "Exception in ASGI application" not in log, log
    assert "timeout graceful shutdown exceeded" not in log, log


@pytest.mark.postgres
async def test_sigterm_hands_waiting_agents_to_the_next_server(
    empty_url: str, tmp_path: Path, receiver: SlowReceiver
) -> None:
    await asyncio.to_thread(migrate, empty_url)
    key = await _key(empty_url)
    agent = {"Authorization": f"Bearer {key}"}
    raw = copy.deepcopy(DEFAULT_CONFIG)
    raw["webhooks"] = {
        "sink": {
            "url": f"http://127.0.0.1:{receiver.port}/hook",
            "secret": SECRET,
            "events": ["request.decided"],
        }
    }
    (tmp_path / "signoff.yaml").write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    env = environment(tmp_path, empty_url, SIGNOFF_SHUTDOWN_SECONDS="20")
    port = free_port()

    with contextlib.ExitStack() as stack:
        first = await asyncio.to_thread(stack.enter_context, serve(env, tmp_path / "first.log", port=port))
        async with (
            httpx.AsyncClient(base_url=first.url, timeout=60) as http,
            AsyncGateClient(
                first.url, key, deadline=300, poll_timeout=25, backoff_initial=0.2, backoff_max=1
            ) as client,
        ):
            clients = [
                asyncio.create_task(client.pre_tool_use(f"pay_vendor_{i}", {"amount": 60000 + i}))
                for i in range(CLIENTS)
            ]
            asked = {"tool_name": "pay_parked", "arguments": {"amount": 70000}}
            parked_id = (await http.post("/v1/hooks/pre-tool-use", json=asked, headers=agent)).json()[
                "request_id"
            ]
            parked = asyncio.create_task(
                http.get(f"/v1/requests/{parked_id}/wait", params={"timeout": 50}, headers=agent)
            )
            await _waiting(http, first, CLIENTS + 1)

            # A decision whose webhook is being sent when the stop begins.
            sent = {"tool_name": "pay_webhook", "arguments": {"amount": 80000}}
            decided = (await http.post("/v1/hooks/pre-tool-use", json=sent, headers=agent)).json()[
                "request_id"
            ]
            approve = {"verdict": "approve", "operator": "alice"}
            assert (
                await http.post(f"/v1/admin/requests/{decided}/decision", json=approve, headers=ADMIN)
            ).is_success
            for _ in range(300):
                if receiver.arrived:
                    break
                await asyncio.sleep(0.05)
            assert receiver.arrived
            assert not receiver.answered

            first.process.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(parked, 30)
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["detail"] == STOPPING
            code = await asyncio.to_thread(first.process.wait, 60)
            assert code in (0, -signal.SIGTERM), first.output()

            # The webhook in flight was sent once and recorded as sent, not left to its lease.
            assert (len(receiver.arrived), receiver.answered) == (1, 1)
            assert await _webhook_rows(empty_url) == [("sent", 1)]
            _clean(first.output())
            assert not any(t.done() for t in clients), [t.result() for t in clients if t.done()]

            # The next server on the same port and database: the clients wait there, and are answered.
            second = await asyncio.to_thread(
                stack.enter_context, serve(env, tmp_path / "second.log", port=port)
            )
            await _waiting(http, second, CLIENTS)
            pending = (
                await http.get("/v1/admin/requests", params={"status": "pending"}, headers=ADMIN)
            ).json()
            assert len(pending) == CLIENTS + 1
            for request in pending:
                decision = await http.post(
                    f"/v1/admin/requests/{request['id']}/decision", json=approve, headers=ADMIN
                )
                assert decision.is_success, decision.text
            outcomes = await asyncio.wait_for(asyncio.gather(*clients), 60)
            assert [o.allowed for o in outcomes] == [True] * CLIENTS, outcomes
        assert await asyncio.to_thread(second.stop) in (0, -signal.SIGTERM)
        _clean(second.output())


async def _blocked_on_lock(url: str) -> None:
    """Until a statement of the server waits for the table lock the test holds."""
    u = make_url(url)
    conn = await asyncpg.connect(
        user=u.username or "postgres", host=u.host, port=u.port or 5432, database=u.database
    )
    try:
        for _ in range(600):
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                u.database,
            )
            if waiting:
                return
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise AssertionError("the server's write never waited for the lock")


@contextlib.asynccontextmanager
async def _table_locked(url: str) -> AsyncIterator[None]:
    u = make_url(url)
    conn = await asyncpg.connect(
        user=u.username or "postgres", host=u.host, port=u.port or 5432, database=u.database
    )
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE confirmation_request IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_writes_in_flight_finish_and_past_the_bound_are_a_503(
    postgres_empty_url: str, tmp_path: Path
) -> None:
    """On PostgreSQL, where the test can hold a lock the server's write waits for and see it wait."""
    url = postgres_empty_url
    await asyncio.to_thread(migrate, url)
    agent = {"Authorization": f"Bearer {await _key(url)}"}
    call = {"tool_name": "pay_locked", "arguments": {"amount": 60000}}

    # Within the bound: the write waits for the lock, the stop waits for the write.
    env = environment(tmp_path, url, SIGNOFF_SHUTDOWN_SECONDS="60")
    with serve(env, tmp_path / "patient.log") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=90) as http:
            async with _table_locked(url):
                asking = asyncio.create_task(http.post("/v1/hooks/pre-tool-use", json=call, headers=agent))
                await _blocked_on_lock(url)
                served.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(4)  # longer than any fixed grace a server might give
                assert served.process.poll() is None  # still finishing the write in flight
            answer = await asyncio.wait_for(asking, 60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["decision"] == "pending"
        assert await asyncio.to_thread(served.process.wait, 60) in (0, -signal.SIGTERM)
    _clean(served.output())

    # Past the bound: the write is cancelled and rolled back, and the agent told to retry.
    env = environment(tmp_path, url, SIGNOFF_SHUTDOWN_SECONDS="1")
    with serve(env, tmp_path / "hasty.log") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=90) as http, _table_locked(url):
            asking = asyncio.create_task(
                http.post("/v1/hooks/pre-tool-use", json={**call, "tool_name": "pay_cut"}, headers=agent)
            )
            await _blocked_on_lock(url)
            served.process.send_signal(signal.SIGTERM)
            answer = await asyncio.wait_for(asking, 60)
            assert answer.status_code == 503, answer.text
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["detail"] == STOPPING
        assert await asyncio.to_thread(served.process.wait, 60) in (0, -signal.SIGTERM)
    log = served.output()
    assert "Traceback" not in log, log
    assert "Exception in ASGI application" not in log, log


async def test_while_stopping_a_wait_answers_a_decision_and_never_parks(
    runtime: Runtime, agent_key: str, admin_headers: dict[str, str]
) -> None:
    agent = {"Authorization": f"Bearer {agent_key}"}
    async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:

        async def ask(tool: str) -> str:
            body = {"tool_name": tool, "arguments": {"amount": 60000}}
            rid: str = (await http.post("/v1/hooks/pre-tool-use", json=body, headers=agent)).json()[
                "request_id"
            ]
            return rid

        pending, decided = await ask("pay_later"), await ask("pay_now")
        approve = {"verdict": "approve", "operator": "alice"}
        assert (
            await http.post(f"/v1/admin/requests/{decided}/decision", json=approve, headers=admin_headers)
        ).is_success
        server.app.state.drain.begin()

        refused = await http.get(f"/v1/requests/{pending}/wait", params={"timeout": 30}, headers=agent)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["detail"] == STOPPING
        answered = await http.get(f"/v1/requests/{decided}/wait", params={"timeout": 30}, headers=agent)
        assert answered.json()["status"] == "approved"
        assert runtime.hub.waiting == 0
