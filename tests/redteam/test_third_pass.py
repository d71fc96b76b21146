"""Attacks on email links, grants, replays, webhooks and body parsing, through the real server.

Each test is an attempt to have a gated call run without the right people saying yes, to
decide as someone else, or to crash or poison the server; each must fail: the call is
refused or stays pending, the bad input gets a 4xx, the server keeps working."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlmodel import col, func, select

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import ConfirmationRequest, Delivery, Grant, OutboxStatus, Vote
from signoff.app.outbox import Dispatcher
from signoff.app.requests import grants
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.email import LinkSigner, LinkToken
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request
from tests.channels.smtp_server import LocalSmtp
from tests.channels.test_email_flow import PUBLIC, confirm, links, mail_to, token_of
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server, free_port

PRE = "/v1/hooks/pre-tool-use"
POST = "/v1/hooks/post-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PROPERTY = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
MCP_TOOL = "mcp__github__create_issue"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()

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
]


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="test.yaml")


def agent(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(http: httpx.AsyncClient, key: str, call: dict[str, Any]) -> dict[str, Any]:
    r = await http.post(PRE, json=call, headers=agent(key))
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def decide(http: httpx.AsyncClient, rid: str, **body: Any) -> httpx.Response:
    return await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "approve", "operator": "alice", **body},
        headers=ADMIN,
    )


async def request_count(runtime: Runtime) -> int:
    async with runtime.sessions() as s:
        return int((await s.exec(select(func.count()).select_from(ConfirmationRequest))).one())


async def age(runtime: Runtime, rid: str, by: timedelta) -> None:
    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        (created,) = (await session.exec(sa.select(table.c.created_at).where(table.c.id == rid))).one()
        await session.exec(sa.update(table).where(table.c.id == rid).values(created_at=created - by))


# --- bodies: numbers too large for a float -----------------------------------------------------

HUGE = st.builds(
    lambda sign, mantissa, exponent, plus: f"{sign}{mantissa}e{'+' if plus else ''}{exponent}",
    st.sampled_from(["", "-"]),
    st.sampled_from(["1", "9", "1.5", "0.9", "123456"]),
    st.integers(min_value=315, max_value=99999),
    st.booleans(),
) | st.integers(min_value=309, max_value=2000).map(lambda digits: "9" * digits + ".0")


@pytest.mark.postgres
@PROPERTY
@given(number=HUGE, where=st.sampled_from(["argument", "nested", "metadata"]))
async def test_a_number_too_large_for_a_float_is_refused_before_anything_is_written(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, number: str, where: str
) -> None:
    """``1e400`` is read as infinity: on SQLite approvers were shown ``null`` for a value the
    tool would get as infinity, on PostgreSQL the agent was told the database was down (503).
    It is a 422 naming the field, and nothing is stored."""
    arguments = {"to": "acme", "amount": "AMOUNT"}
    if where == "argument":
        raw_arguments = json.dumps(arguments).replace('"AMOUNT"', number)
        raw_metadata = "{}"
        named = "arguments.amount"
    elif where == "nested":
        raw_arguments = json.dumps({**arguments, "amount": ["AMOUNT"]}).replace('"AMOUNT"', number)
        raw_metadata = "{}"
        named = "arguments.amount[0]"
    else:
        raw_arguments = json.dumps({**arguments, "amount": 90000})
        raw_metadata = json.dumps({"limit": "AMOUNT"}).replace('"AMOUNT"', number)
        named = "metadata.limit"
    body = f'{{"tool_name": "pay_invoice", "arguments": {raw_arguments}, "metadata": {raw_metadata}}}'
    before = await request_count(runtime)
    r = await http.post(
        PRE, content=body.encode(), headers={**agent(agent_key), "content-type": "application/json"}
    )
    assert r.status_code == 422, (number, r.status_code, r.text)
    assert named in r.text, r.text
    assert await request_count(runtime) == before


@pytest.mark.postgres
async def test_numbers_near_the_float_limit_still_pass(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    headers = {**agent(agent_key), "content-type": "application/json"}
    for number in ("1e308", "1.7976931348623157e308", "-1e308", "1e-400", "9" * 400):
        body = f'{{"tool_name": "pay_invoice", "arguments": {{"amount": {number}, "e123": "e4567"}}}}'
        r = await http.post(PRE, content=body.encode(), headers=headers)
        assert r.status_code == 200, (number, r.text)


@pytest.mark.postgres
async def test_a_huge_number_is_refused_in_reports_and_decisions_too(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    headers = {**agent(agent_key), "content-type": "application/json"}
    report = b'{"tool_name": "pay_invoice", "arguments": {"amount": 1}, "result": {"paid": 1e999}}'
    r = await http.post(POST, content=report, headers=headers)
    assert r.status_code == 422, r.text
    rid = (await ask(http, agent_key, {"tool_name": "pay_invoice", "arguments": {"amount": 90000}}))[
        "request_id"
    ]
    decision = b'{"verdict": "approve", "operator": "alice", "reason": "ok", "arguments": {"amount": 1e999}}'
    r = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        content=decision,
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    shown = await http.get(f"/v1/requests/{rid}", headers=agent(agent_key))
    assert shown.json()["status"] == "pending"


# --- replays: another user, canonical spellings ----------------------------------------------


def payment(**extra: Any) -> dict[str, Any]:
    return {
        "tool_name": "pay_invoice",
        "arguments": {"amount": 60000, "to": "acme"},
        "user_id": "U_CAROL",
        "session_id": "s-1",
        "idempotency_key": f"pay-{uuid.uuid4().hex}",
        **extra,
    }


async def test_an_approved_key_replayed_on_behalf_of_someone_else_is_denied(
    http: httpx.AsyncClient, agent_key: str
) -> None:
    """Alice approved a payment made for Carol. The same key replayed for Alice herself would
    be a call she approved on her own behalf (which the gate forbids), for Bob or nobody a call
    nobody was asked about: each is denied. Carol under any of her ids still runs it."""
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    for user in ("U_ALICE", "alice", "Alice", "U_BOB", None, "mallory"):
        replay = await ask(http, agent_key, {**call, "user_id": user})
        assert replay["decision"] == "deny", (user, replay)
        assert "on behalf of another user" in replay["reason"], replay
    for user in ("U_CAROL", "carol", " CAROL", "u_carol"):
        replay = await ask(http, agent_key, {**call, "user_id": user})
        assert replay["decision"] == "allow", (user, replay)


async def test_a_pending_key_replayed_on_behalf_of_someone_else_does_not_attach(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    replay = await ask(http, agent_key, {**call, "user_id": "U_BOB"})
    assert replay["decision"] == "deny", replay
    assert await request_count(runtime) == 1
    assert (await ask(http, agent_key, call))["request_id"] == rid


@pytest.mark.parametrize(
    ("replayed", "allowed"),
    [
        ('{"to": "acme", "amount": 60000}', True),  # key order
        ('{ "amount" :60000 ,"to":"acme" }', True),  # whitespace
        ('{"amount": 60000, "to": "\\u0061cme"}', True),  # the same text, escaped
        ('{"amount": 60000.0, "to": "acme"}', False),
        ('{"amount": 6e4, "to": "acme"}', False),
        ('{"amount": 60000, "to": "ACME"}', False),
        ('{"amount": 60000, "to": "acme", "memo": null}', False),
    ],
)
async def test_a_replay_is_the_approved_call_only_if_its_json_is_canonically_equal(
    http: httpx.AsyncClient, agent_key: str, replayed: str, allowed: bool
) -> None:
    call = payment()
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    body = json.dumps({**call, "arguments": "ARGS"}).replace('"ARGS"', replayed)
    r = await http.post(
        PRE, content=body.encode(), headers={**agent(agent_key), "content-type": "application/json"}
    )
    assert r.json()["decision"] == ("allow" if allowed else "deny"), (replayed, r.json())


async def test_text_in_another_normal_form_is_another_call(http: httpx.AsyncClient, agent_key: str) -> None:
    call = payment(arguments={"amount": 60000, "to": unicodedata.normalize("NFC", "café")})
    rid = (await ask(http, agent_key, call))["request_id"]
    assert (await decide(http, rid)).status_code == 200
    nfd = {**call, "arguments": {"amount": 60000, "to": unicodedata.normalize("NFD", "café")}}
    assert (await ask(http, agent_key, nfd))["decision"] == "deny"
    assert (await ask(http, agent_key, call))["decision"] == "allow"


# --- grants: spellings, canonical JSON, revocation as the call is answered --------------------


async def _granted(http: httpx.AsyncClient, key: str, call: dict[str, Any], grant: dict[str, Any]) -> str:
    rid = (await ask(http, key, call))["request_id"]
    r = await decide(http, rid, grant=grant)
    assert r.status_code == 200, r.text
    return str(r.json()["grant"]["id"])


_CONFUSABLE = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "i": "\u0456", "u": "\u057d"}
SPELLINGS = st.one_of(
    st.sampled_from(
        [
            "MCP__github__create_issue",
            "mcp__GitHub__create_issue",
            "mcp_github__create_issue",
            "mcp__github_create_issue",
            "mcp__github__create_issue ",
            " mcp__github__create_issue",
            "mcp__github__create-issue",
            "mcp__github__create_issues",
            "mcp__\uff47ithub__create_issue",
        ]
    ),
    st.builds(
        lambda at, char: MCP_TOOL[:at] + char + MCP_TOOL[at:],
        st.integers(0, len(MCP_TOOL)),
        st.sampled_from(["\u200b", "\u2060", "\ufeff", "\u200e", "\u00ad"]),
    ),
    st.builds(
        lambda at: MCP_TOOL[:at] + _CONFUSABLE.get(MCP_TOOL[at], MCP_TOOL[at].upper()) + MCP_TOOL[at + 1 :],
        st.integers(0, len(MCP_TOOL) - 1),
    ),
)


@PROPERTY
@given(spelling=SPELLINGS)
async def test_an_agent_grant_covers_its_tool_as_named_and_no_other_spelling(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, spelling: str
) -> None:
    """Every spelling the gate still catches asks again; none is allowed by the grant."""
    assume(spelling != MCP_TOOL)
    async with runtime.sessions() as s:
        given_already = (await s.exec(select(func.count()).select_from(Grant))).one()
    if not given_already:
        first = {"tool_name": MCP_TOOL, "arguments": {"title": "x"}}
        await _granted(http, agent_key, first, {"scope": "agent", "for": "1h"})
    exact = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "y"}})
    assert exact["decision"] == "allow"
    assert exact["grant_id"] is not None
    other = await ask(http, agent_key, {"tool_name": spelling, "arguments": {"title": "y"}})
    assert other["grant_id"] is None, (spelling, other)
    assert "grant" not in (other["reason"] or ""), (spelling, other)
    [gate] = [g for key, g in runtime.config.confirmation_gates("finance-bot") if key == "github"]
    if gate.matches_tool(spelling):
        assert other["decision"] == "pending", (spelling, other)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab1", max_size=3),
    lambda inner: st.dictionaries(st.text("xyz", min_size=1, max_size=2), inner, min_size=1, max_size=4),
    max_leaves=6,
).filter(lambda v: isinstance(v, dict) and len(v) > 1)


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    return value


@settings(PROPERTY, max_examples=10)
@given(to=JSON_VALUES)
async def test_a_same_field_holds_by_canonical_json_whatever_the_key_order(
    http: httpx.AsyncClient, agent_key: str, to: dict[str, Any]
) -> None:
    """The approved ``to`` sent again with its keys in another order is the same value; with
    one value changed (or given another type) it is not."""
    session = f"s-{uuid.uuid4().hex}"

    def transfer(value: Any) -> dict[str, Any]:
        return {"tool_name": "transfer_funds", "arguments": {"to": value, "n": 1}, "session_id": session}

    await _granted(http, agent_key, transfer(to), {"scope": "session", "for": "1h"})
    assert (await ask(http, agent_key, transfer(_reordered(to))))["decision"] == "allow"
    first = next(iter(to))
    changed = {**to, first: [to[first]]}
    assert (await ask(http, agent_key, transfer(changed)))["decision"] == "pending"


@pytest.mark.postgres
async def test_a_grant_revoked_between_its_look_up_and_its_use_allows_nothing(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call finds the grant active; the operator revokes it before the answer counts its
    use; the answer is a deny, and no use is counted."""
    grant_id = await _granted(
        http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "x"}}, {"scope": "agent", "for": "1h"}
    )
    found = grants.find_for_call

    async def found_then_revoked(*args: Any, **kwargs: Any) -> dict[str, Grant]:
        result = await found(*args, **kwargs)
        async with transaction(runtime.sessions) as session:
            for grant in result.values():
                await grants.revoke(session, grant.id, actor=Actor("api", "bob", "Bob"))
        return result

    monkeypatch.setattr(grants, "find_for_call", found_then_revoked)
    answer = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "y"}})
    assert answer["decision"] == "deny", answer
    assert grant_id in answer["reason"]
    monkeypatch.undo()
    [shown] = (await http.get("/v1/admin/grants", headers=ADMIN)).json()
    assert (shown["uses"], shown["active"]) == (0, False)
    after = await ask(http, agent_key, {"tool_name": MCP_TOOL, "arguments": {"title": "z"}})
    assert after["decision"] == "pending"


# --- webhooks: receivers that answer slowly or without end --------------------------------------


@dataclass
class EndlessReceiver:
    """A raw HTTP server that reads each request, then answers ``status`` with a body it never
    finishes (or, with ``drip_head``, a status line it never finishes), a little at a time."""

    status: int
    drip_head: bool = False
    port: int = field(default_factory=free_port)
    requests: int = 0
    wrote: int = 0
    promised: int = 1 << 30

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/in?token=tok-in-the-url-5f3a9c1e"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            self.requests += 1
            if self.drip_head:
                writer.write(f"HTTP/1.1 {self.status} OK\r\nX-Slow: ".encode())
                while True:  # a header that never ends
                    writer.write(b"x")
                    await writer.drain()
                    self.wrote += 1
                    await asyncio.sleep(0.05)
            writer.write(
                f"HTTP/1.1 {self.status} Whatever\r\ncontent-length: {self.promised}\r\n\r\n".encode()
            )
            while self.wrote < self.promised:
                writer.write(b"e" * 1024)
                await writer.drain()
                self.wrote += 1024
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(receiver: EndlessReceiver) -> AsyncIterator[EndlessReceiver]:
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", receiver.port)
    try:
        yield receiver
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)


def with_webhook(url: str, timeout: float = 1.0) -> SignoffConfig:
    raw = copy.deepcopy(CONFIG)
    raw["webhooks"] = {
        "sink": {"url": url, "secret": WEBHOOK_SECRET, "events": ["request.created"], "timeout": timeout}
    }
    return parse_config(raw, source="test.yaml")


@pytest.mark.parametrize(
    ("status", "drip_head", "outcome"),
    [
        (200, False, OutboxStatus.SENT),  # accepted: the rest of the answer is not waited for
        (500, False, OutboxStatus.PENDING),  # retried, naming what the answer began with
        (200, True, OutboxStatus.PENDING),  # no answer within the timeout
    ],
)
async def test_a_receiver_that_never_finishes_answering_holds_up_nothing(
    runtime: Runtime, fake_channel: FakeChannel, status: int, drip_head: bool, outcome: OutboxStatus
) -> None:
    """One webhook whose receiver answers without end must not hold the outbox: the card of
    the request (due in the same pass) is posted, the event's attempt ends within its
    timeout, and what the receiver sends is not read beyond a few kilobytes."""
    async with serving(EndlessReceiver(status, drip_head)) as receiver:
        runtime.config = with_webhook(receiver.url)
        async with transaction(runtime.sessions) as s:
            req = await make_request(s, runtime.config)
        dispatcher = Dispatcher(
            runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event()
        )
        try:
            handled = await asyncio.wait_for(dispatcher.run_once(), 10)
        except TimeoutError:
            pytest.fail("the outbox pass never ended: the receiver's endless answer held it")
        assert handled == 2
        assert [c.request_id for c in fake_channel.posts] == [req.id]
        assert receiver.requests == 1
        assert receiver.wrote < 1 << 20, "the answer was read far beyond what is needed"
        async with runtime.sessions() as s:
            [event] = (await s.exec(select(Delivery).where(col(Delivery.kind) == "webhook"))).all()
        assert event.status == outcome, event.last_error
        if status == 500:
            assert event.last_error is not None
            assert event.last_error.startswith("HTTP 500: eee")
            assert len(event.last_error) < 300
        if drip_head:
            assert event.last_error == "no answer within 1s"


async def test_a_token_in_a_webhook_url_is_not_shown_by_the_operator_api(
    http: httpx.AsyncClient, runtime: Runtime
) -> None:
    runtime.config = with_webhook(EndlessReceiver(204).url)
    r = await http.get("/v1/admin/config", headers=ADMIN)
    assert r.status_code == 200
    sink = r.json()["webhooks"]["sink"]
    assert sink["secret"] == "********"
    assert sink["url"].startswith("http://127.0.0.1:")
    assert "token=[redacted]" in sink["url"]
    assert "tok-in-the-url-5f3a9c1e" not in r.text
    assert WEBHOOK_SECRET not in r.text


# --- email links ---------------------------------------------------------------------------------

ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
LINK_SECRET = "a-long-random-secret-for-the-third-pass"


def _mail_config(smtp_port: int) -> dict[str, Any]:
    def gate(name: str, tools: str, approvers: list[str], **more: Any) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": "mail",
            "approvers": approvers,
            "timeout": "30m",
            **more,
        }

    return {
        "channels": {
            "mail": {
                "type": "email",
                "smtp_url": f"smtp://127.0.0.1:{smtp_port}?starttls=false",
                "from": "Signoff <signoff@example.com>",
            }
        },
        "people": {
            "alice": {"name": "Alice", "email": ALICE},
            "bob": {"name": "Bob", "email": BOB},
            "carol": {"name": "Carol", "email": CAROL},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate(
                        "transfers",
                        "transfer_*",
                        ["alice", "bob"],
                        grants=[{"scope": "session", "for": "1h"}],
                        escalate=[{"after": "10m", "channel": "mail", "approvers": ["carol"]}],
                    ),
                    gate("wires", "wire_*", ["alice", "bob"], quorum=2, require_reject_reason=True),
                ]
            }
        },
    }


@pytest.fixture
def smtp() -> Iterator[LocalSmtp]:
    with LocalSmtp() as server:
        yield server


@pytest.fixture
async def mail(smtp: LocalSmtp, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret=LINK_SECRET,  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
    )
    runtime = Runtime.create(settings, parse_config(_mail_config(smtp.port), source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


TRANSFER = {"tool_name": "transfer_funds", "arguments": {"to": "acme", "amount": 10}, "session_id": "s-1"}


async def _votes(server: Server, rid: str) -> list[Vote]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


async def _status(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    shown: dict[str, Any] = (await http.get(f"/v1/requests/{rid}", headers=agent(key))).json()
    return shown


@pytest.mark.postgres
async def test_a_link_reason_with_a_nul_character_is_no_server_error(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    """Text no column can hold, typed into the rejection form, is dropped as the console drops
    it; it used to fail the page with a 500."""
    _server, http = mail
    rid = (await ask(http, agent_key, {"tool_name": "wire_money", "arguments": {"amount": 5}}))["request_id"]
    reject = links(await mail_to(smtp, BOB, rid))["Reject"]
    done = await confirm(http, reject, reason="wrong\x00 account")
    assert done.status_code == 200, done.text
    decided = await _status(http, agent_key, rid)
    assert (decided["status"], decided["reason"]) == ("rejected", "wrong account")


def _padded(token: str, at: int, pad: str) -> str:
    payload, signature = token.split(".")
    return f"{payload}{pad}.{signature}" if at == 0 else f"{payload}.{signature}{pad}"


def _standard_alphabet(token: str) -> str:
    return token.replace("-", "+").replace("_", "/")


def _case_swapped(token: str, at: int) -> str:
    return token[:at] + token[at].swapcase() + token[at + 1 :]


def _resigned(token: str, secret: bytes) -> str:
    """The same payload signed under another key (another server, or an old secret)."""
    other = LinkSigner(secret, PUBLIC)
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    return other.sign(LinkToken.from_payload(payload))


VARIANTS = st.one_of(
    st.builds(lambda at, pad: ("pad", at, pad), st.integers(0, 1), st.sampled_from(["=", "==", "%3D", "."])),
    st.just(("standard", 0, "")),
    st.builds(lambda at: ("case", at, ""), st.integers(0, 400)),
    st.builds(
        lambda extra: ("tail", 0, extra), st.sampled_from(["x", "A", "-", "_", "%20", "\u0410", "%00"])
    ),
    st.builds(lambda extra: ("head", 0, extra), st.sampled_from(["x", "A", "."])),
    st.builds(lambda at: ("cut", at, ""), st.integers(1, 40)),
    st.sampled_from([("old secret", 0, ""), ("other request", 0, ""), ("other channel", 0, "")]),
)


@PROPERTY
@given(variant=VARIANTS)
async def test_no_other_spelling_or_signature_of_a_link_decides(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str, variant: tuple[str, int, str]
) -> None:
    """Padding, the standard base64 alphabet, a letter's case, data before or after, a cut, a
    token signed with another (or an old) secret, one for another request or channel: opening
    it shows no form, confirming it decides nothing."""
    server, http = mail
    rid = (await ask(http, agent_key, {**TRANSFER, "idempotency_key": "the-one"}))["request_id"]
    token = token_of(links(await mail_to(smtp, ALICE, rid))["Approve once"])
    kind, at, extra = variant
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    original = signer.verify(token, now=datetime.now(UTC))
    if kind == "pad":
        changed = _padded(token, at, extra)
    elif kind == "standard":
        changed = _standard_alphabet(token)
    elif kind == "case":
        changed = _case_swapped(token, at % len(token))
    elif kind == "tail":
        changed = token + extra
    elif kind == "head":
        changed = extra + token
    elif kind == "cut":
        changed = token[:-at]
    elif kind == "old secret":
        changed = _resigned(token, b"the-secret-before-it-was-rotated")
    elif kind == "other request":
        changed = signer.sign(LinkToken("0" * 32, "mail", ALICE, Verdict.APPROVE, original.expires_at))
    else:
        changed = signer.sign(LinkToken(rid, "chat", ALICE, Verdict.APPROVE, original.expires_at))
    assume(changed != token)
    shown = await http.get(f"/approve/{changed}")
    assert 400 <= shown.status_code < 500, (changed, shown.status_code)
    assert 'method="post"' not in shown.text
    posted = await http.post(f"/approve/{changed}", data={"token": changed})
    assert 400 <= posted.status_code < 500, (changed, posted.status_code)
    assert await _votes(server, rid) == []
    assert (await _status(http, agent_key, rid))["status"] == "pending"


@pytest.mark.parametrize("requester", [BOB, "BOB@example.com ", "bob", "Bob"])
async def test_a_link_cannot_approve_the_recipients_own_call(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str, requester: str
) -> None:
    server, http = mail
    rid = (await ask(http, agent_key, {**TRANSFER, "user_id": requester}))["request_id"]
    bob = links(await mail_to(smtp, BOB, rid))
    for label in ("Approve once", "Approve for this session (1h)"):
        refused = await confirm(http, bob[label])
        assert refused.status_code == 409, refused.text
        assert "You cannot approve a call made on your own behalf." in refused.text
    assert await _votes(server, rid) == []
    alice = links(await mail_to(smtp, ALICE, rid))
    assert (await confirm(http, alice["Approve once"])).status_code == 200


async def test_an_escalation_approvers_link_counts_only_from_the_escalation(
    mail: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    """A genuine token for Carol, whom the gate adds at 10 minutes, decides nothing before then
    (the page says from when it will), and decides once the time has come."""
    server, http = mail
    rid = (await ask(http, agent_key, TRANSFER))["request_id"]
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    carol = signer.sign(LinkToken(rid, "mail", CAROL, Verdict.APPROVE, int(time.time()) + 1200))
    early = await http.post(f"/approve/{carol}", data={"token": carol})
    assert early.status_code == 409, early.text
    assert "This request is escalated to you at " in early.text
    assert await _votes(server, rid) == []
    await age(server.runtime, rid, timedelta(minutes=11))
    done = await http.post(f"/approve/{carol}", data={"token": carol})
    assert done.status_code == 200, done.text
    assert (await _status(http, agent_key, rid))["decided_by"]["user_id"] == CAROL


async def test_forms_of_another_shape_decide_nothing(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    """JSON, a file, too many fields, a body over the limit, plain text: each a 4xx, no vote."""
    server, http = mail
    rid = (await ask(http, agent_key, TRANSFER))["request_id"]
    path = links(await mail_to(smtp, ALICE, rid))["Approve once"]
    token = token_of(path)
    attempts = [
        http.post(path, json={"token": token}),
        http.post(path, data={"token": token}, files={"token": ("token", token.encode())}),
        http.post(path, data={"token": token, **{f"f{i}": "1" for i in range(12)}}),
        http.post(
            path,
            content=f"token={token}&reason={'x' * 70_000}".encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        ),
        http.post(path, content=f"token={token}".encode(), headers={"content-type": "text/plain"}),
        http.put(path, data={"token": token}),
    ]
    for attempt in attempts:
        r = await attempt
        assert 400 <= r.status_code < 500, (
            r.request.headers.get("content-type"),
            r.status_code,
            r.text[:200],
        )
    assert await _votes(server, rid) == []
    assert (await _status(http, agent_key, rid))["status"] == "pending"
