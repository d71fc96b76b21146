"""What the attacks in tests/redteam share: a configuration with a gate for each kind of call
they try (payments, wires, MCP tools, transfers, sends with edits, a treasury, an escalating
deploy; each on tools of its own), and the calls an agent and an operator make over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from sqlmodel import col, func, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, ConfirmationRequest
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, free_port

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FUNCTION_SCOPED = [HealthCheck.function_scoped_fixture]
"""Hypothesis examples share the test's server and database: each example makes rows of its own."""


def property_test(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=FUNCTION_SCOPED)


MCP_TOOL = "mcp__github__create_issue"

CONFIG: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
CONFIG["agents"]["finance-bot"]["hooks"] += [
    {
        "type": "confirmation_gate",
        "name": "github",
        "tools": ["mcp__github__*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "grants": [{"scope": "agent", "for": "1h"}],
    },
    {
        "type": "confirmation_gate",
        "name": "transfers",
        "tools": ["transfer_*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "grants": [{"scope": "session", "for": "1h", "same": ["to"]}],
    },
    {
        "type": "confirmation_gate",
        "name": "sends",
        "tools": ["send_*"],
        "when": "args.amount >= 1000",
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "editable": ["amount", "memo", "to"],
        "grants": [{"scope": "session", "for": "1h", "same": ["to"]}],
    },
    {
        "type": "confirmation_gate",
        "name": "treasury",
        "tools": ["send_*"],
        "when": "args.amount >= 1000000",
        "channel": "chat",
        "approvers": ["carol"],
        "timeout": "30m",
    },
    {
        "type": "confirmation_gate",
        "name": "escalating",
        "tools": ["deploy_*"],
        "channel": "chat",
        "approvers": ["alice"],
        "timeout": "30m",
        "escalate": [{"after": "10m", "channel": "chat", "approvers": ["carol"]}],
    },
]


def attack_config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def agent(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(http: httpx.AsyncClient, key: str, call: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(PRE, json=call, headers=agent(key))
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def pending(http: httpx.AsyncClient, key: str, call: dict[str, Any]) -> str:
    r = await http.post(PRE, json=call, headers=agent(key))
    assert r.json()["decision"] == "pending", r.text
    return str(r.json()["request_id"])


async def decide(http: httpx.AsyncClient, rid: str, **body: Any) -> httpx.Response:
    return await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": "alice", **body},
        headers=ADMIN,
    )


def send(amount: Any = 90000, **extra: Any) -> dict[str, Any]:
    """A payment the 'sends' gate catches (and, from 1,000,000, 'treasury' too)."""
    return {
        "tool_name": "send_payment",
        "arguments": {"to": "acme", "amount": amount, "memo": "invoice 7"},
        "session_id": "s-1",
        "idempotency_key": f"pay-{uuid.uuid4().hex}",
        **extra,
    }


async def request_count(runtime: Runtime) -> int:
    async with runtime.sessions() as s:
        return int((await s.exec(select(func.count()).select_from(ConfirmationRequest))).one())


async def status(runtime: Runtime, rid: str) -> str:
    async with runtime.sessions() as s:
        req = (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid))).one()
        return str(req.status.value if hasattr(req.status, "value") else req.status)


async def actions(runtime: Runtime, rid: str) -> list[str]:
    async with runtime.sessions() as s:
        stmt = select(AuditEvent).where(col(AuditEvent.request_id) == rid).order_by(col(AuditEvent.seq))
        return [str(e.action) for e in (await s.exec(stmt)).all()]


async def age(runtime: Runtime, rid: str, by: timedelta) -> None:
    """Move the request's creation back by ``by``, as if that much time had passed."""
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        (created,) = (await session.exec(sa.select(table.c.created_at).where(table.c.id == rid))).one()
        await session.exec(sa.update(table).where(table.c.id == rid).values(created_at=created - by))


@contextlib.asynccontextmanager
async def scripted_signoff(answer: Callable[[str], bytes]) -> AsyncIterator[str]:
    """A loopback HTTP/1.1 server standing in for Signoff: each request is answered 200 with the
    JSON ``answer(path)`` gives, its body read and ignored; its base URL."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(":") for h in head[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                body = answer(head[0].split(" ")[1])
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
