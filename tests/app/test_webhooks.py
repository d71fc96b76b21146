"""Decision webhooks, received by a local HTTP server that checks every delivery with the
Standard Webhooks reference library (``standardwebhooks``)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlmodel import col, select
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.types import Receive, Scope, Send

from signoff.app import webhooks
from signoff.app.audit import Actor
from signoff.app.config import ConfigError, SignoffConfig, WebhookConfig, parse_config
from signoff.app.db import transaction
from signoff.app.deliveries import WEBHOOK
from signoff.app.metrics import WEBHOOK_DELIVERIES
from signoff.app.models import Delivery, OutboxStatus, Status, utcnow
from signoff.app.outbox import Dispatcher
from signoff.app.queries import config_view
from signoff.app.requests.eligibility import Voter
from signoff.app.requests.states import expire_overdue, get_request, transition
from signoff.app.requests.votes import cast_vote
from signoff.app.runtime import Runtime
from signoff.channels import GrantChoice, Verdict
from tests.app.factories import make_request
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server, _Uvicorn, free_port

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
ALL_EVENTS = ["request.created", "request.decided", "grant.created", "grant.revoked"]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """A webhook receiver on a loopback port: verifies each delivery with the reference
    library (401 when it does not verify) and answers with the next of ``answers`` (then 204)."""

    secret: str
    port: int = field(default_factory=free_port)
    verified: list[Received] = field(default_factory=list)
    refused: list[Received] = field(default_factory=list)
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    stall: float = 0.0
    """Seconds to wait before answering (to make the sender time out)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/signoff"

    def of_type(self, kind: str) -> list[Received]:
        return [r for r in self.verified if r.event["type"] == kind]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        got = Received(headers, body)
        if self.stall:
            await asyncio.sleep(self.stall)
        try:
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            self.refused.append(got)
            status, extra = 401, {}
        else:
            self.verified.append(got)
            status, extra = self.answers.pop(0) if self.answers else (204, {})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode(), v.encode()) for k, v in extra.items()],
            }
        )
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rx = Receiver(SECRET)
    # Stopped at once (no tick, no grace): a test is done with its deliveries when it ends.
    server = _Uvicorn(uvicorn.Config(rx, host="127.0.0.1", port=rx.port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    yield rx
    server.should_exit = True
    server.stop.set()
    await task


def _config(hooks: dict[str, Any]) -> SignoffConfig:
    raw = copy.deepcopy(DEFAULT_CONFIG)
    gate = raw["agents"]["finance-bot"]["hooks"][0]
    gate["grants"] = [{"scope": "agent", "for": "1h"}]
    raw["webhooks"] = hooks
    return parse_config(raw, source="test.yaml")


@pytest.fixture
def hooks(receiver: Receiver) -> dict[str, Any]:
    """The ``webhooks:`` of the configuration (a test may change it before the runtime starts)."""
    return {"sink": {"url": receiver.url, "secret": SECRET, "events": list(ALL_EVENTS)}}


@pytest.fixture
def config(hooks: dict[str, Any]) -> SignoffConfig:
    return _config(hooks)


def dispatcher(runtime: Runtime) -> Dispatcher:
    return Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())


async def webhook_rows(runtime: Runtime) -> list[Delivery]:
    async with runtime.sessions() as s:
        stmt = select(Delivery).where(col(Delivery.kind) == WEBHOOK).order_by(col(Delivery.id))
        return list((await s.exec(stmt)).all())


async def deliver_due(runtime: Runtime, d: Dispatcher, now: datetime | None = None) -> int:
    """Run the dispatcher at ``now`` (default: the moment the next webhook event is due); how
    many webhook events it attempted (card deliveries are not counted)."""
    before = {r.id: r.attempts for r in await webhook_rows(runtime)}
    pending = [r for r in await webhook_rows(runtime) if r.status == OutboxStatus.PENDING]
    if now is None:
        if not pending:
            return 0
        now = min(r.next_attempt_at for r in pending) + timedelta(milliseconds=1)
    await d.run_once(now=now)
    return sum(1 for r in await webhook_rows(runtime) if r.attempts != before.get(r.id))


def counted(result: str, webhook: str = "sink") -> float:
    return WEBHOOK_DELIVERIES.labels(webhook, result)._value.get()


async def pending_request(runtime: Runtime, tool: str = "pay_invoice") -> str:
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config, tool=tool)
    return req.id


# --- the events, each once, with the data the API shows --------------------------------------


async def test_each_event_is_received_once_with_the_data_the_api_shows(
    runtime: Runtime, receiver: Receiver, agent_key: str
) -> None:
    d = dispatcher(runtime)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, headers=admin) as api:
        agent = {"Authorization": f"Bearer {agent_key}"}
        r = await api.post(
            "/v1/hooks/pre-tool-use",
            json={"tool_name": "pay_invoice", "arguments": {"amount": 90000}, "idempotency_key": "k1"},
            headers=agent,
        )
        assert r.json()["decision"] == "pending"
        rid = r.json()["request_id"]
        shown = (await api.get(f"/v1/admin/requests/{rid}")).json()
        while await d.run_once():
            pass
        [created] = receiver.of_type("request.created")
        assert created.event["data"] == {k: v for k, v in shown.items() if k != "audit"}
        assert created.event["data"]["status"] == "pending"

        r = await api.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice", "grant": {"scope": "agent", "for": "1h"}},
        )
        assert r.status_code == 200, r.text
        shown = r.json()
        while await d.run_once():
            pass
        [decided] = receiver.of_type("request.decided")
        assert decided.event["data"] == {k: v for k, v in shown.items() if k != "audit"}
        assert decided.event["data"]["status"] == "approved"
        assert decided.event["data"]["grant"] is not None  # the decision shows the grant it gave

        [grant_made] = receiver.of_type("grant.created")
        listed = (await api.get("/v1/admin/grants")).json()
        assert grant_made.event["data"] == listed[0]
        assert grant_made.event["data"]["active"] is True

        r = await api.delete(f"/v1/admin/grants/{listed[0]['id']}", params={"operator": "bob"})
        assert r.status_code == 200
        while await d.run_once():
            pass
        [revoked] = receiver.of_type("grant.revoked")
        assert revoked.event["data"] == r.json()
        assert revoked.event["data"]["revoked_by"] == "bob"

    assert len(receiver.verified) == 4
    assert receiver.refused == []
    ids = [r.headers["webhook-id"] for r in receiver.verified]
    assert len(set(ids)) == 4
    assert all(re.fullmatch(r"msg_[0-9a-f]{32}", i) for i in ids)
    for got in receiver.verified:
        assert got.headers["content-type"] == "application/json"
        assert got.headers["webhook-signature"].startswith("v1,")
        assert set(got.event) == {"type", "timestamp", "data"}
        assert datetime.fromisoformat(got.event["timestamp"]).tzinfo is not None
    assert {r.status for r in await webhook_rows(runtime)} == {OutboxStatus.SENT}


@pytest.mark.parametrize("how", ["reject", "cancel", "expiry sweep", "expired at a click"])
async def test_every_way_of_deciding_is_sent_as_request_decided(
    runtime: Runtime, receiver: Receiver, how: str
) -> None:
    rid = await pending_request(runtime)
    now = utcnow()
    async with transaction(runtime.sessions) as s:
        if how == "reject":
            voter = Voter("chat", "U_ALICE", "Alice", "alice")
            await cast_vote(s, rid, voter=voter, verdict=Verdict.REJECT, config=runtime.config, reason="no")
        elif how == "cancel":
            assert await transition(s, rid, Status.CANCELLED, actor=Actor("agent", "finance-bot"))
        elif how == "expiry sweep":
            assert await expire_overdue(s, now=now + timedelta(hours=1)) == [rid]
        else:
            voter = Voter("chat", "U_ALICE", "Alice", "alice")
            later = now + timedelta(hours=1)
            await cast_vote(s, rid, voter=voter, verdict=Verdict.APPROVE, config=runtime.config, now=later)
    d = dispatcher(runtime)
    while await d.run_once():
        pass
    [decided] = receiver.of_type("request.decided")
    async with runtime.sessions() as s:
        req = await get_request(s, rid)
    assert req is not None
    assert decided.event["data"]["id"] == rid
    assert decided.event["data"]["status"] == req.status
    assert decided.event["data"]["reason"] == req.reason
    assert len(receiver.of_type("request.created")) == 1


async def test_a_vote_that_decides_nothing_sends_nothing(runtime: Runtime, receiver: Receiver) -> None:
    rid = await pending_request(runtime, tool="wire_money")  # two approvals needed
    async with transaction(runtime.sessions) as s:
        voter = Voter("chat", "U_ALICE", "Alice", "alice")
        await cast_vote(s, rid, voter=voter, verdict=Verdict.APPROVE, config=runtime.config)
    d = dispatcher(runtime)
    while await d.run_once():
        pass
    assert [r.event["type"] for r in receiver.verified] == ["request.created"]


@pytest.mark.postgres
async def test_a_transaction_that_rolls_back_owes_no_event(runtime: Runtime, receiver: Receiver) -> None:
    rid = await pending_request(runtime)

    async def cancel_then_fail() -> None:
        async with transaction(runtime.sessions) as s:
            assert await transition(s, rid, Status.CANCELLED, actor=Actor("agent", "finance-bot"))
            raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        await cancel_then_fail()
    assert [r.payload["type"] for r in await webhook_rows(runtime) if r.payload] == ["request.created"]


@pytest.mark.postgres
async def test_committing_past_transaction_with_events_owed_refuses(
    runtime: Runtime, receiver: Receiver
) -> None:
    rid = await pending_request(runtime)
    async with runtime.sessions() as s:
        assert await transition(s, rid, Status.CANCELLED, actor=Actor("agent", "finance-bot"))
        with pytest.raises(RuntimeError, match="transaction"):
            await s.commit()
    async with runtime.sessions() as s:
        req = await get_request(s, rid)
    assert req is not None
    assert req.status == Status.PENDING


# --- subscriptions ---------------------------------------------------------------------------


@pytest.fixture
def decided_only(receiver: Receiver, hooks: dict[str, Any]) -> None:
    hooks["sink"]["events"] = ["request.decided"]


@pytest.mark.usefixtures("decided_only")
async def test_events_not_subscribed_are_not_sent(runtime: Runtime, receiver: Receiver) -> None:
    rid = await pending_request(runtime)
    assert await webhook_rows(runtime) == []  # nothing owed at all
    async with transaction(runtime.sessions) as s:
        voter = Voter("chat", "U_ALICE", "Alice", "alice")
        await cast_vote(
            s,
            rid,
            voter=voter,
            verdict=Verdict.APPROVE,
            config=runtime.config,
            grant=GrantChoice("agent", 3600, ()),
        )
    d = dispatcher(runtime)
    while await d.run_once():
        pass
    assert [r.event["type"] for r in receiver.verified] == ["request.decided"]


@pytest.fixture
def two_sinks(receiver: Receiver, hooks: dict[str, Any]) -> None:
    hooks["second"] = {**hooks["sink"], "events": ["request.created"]}


@pytest.mark.usefixtures("two_sinks")
async def test_each_subscribed_webhook_gets_the_event_under_one_id(
    runtime: Runtime, receiver: Receiver
) -> None:
    rid = await pending_request(runtime)
    rows = await webhook_rows(runtime)
    assert sorted((r.channel, r.request_id) for r in rows) == [("second", rid), ("sink", rid)]
    assert len({r.event_id for r in rows}) == 1
    await dispatcher(runtime).run_once()
    assert len(receiver.of_type("request.created")) == 2


# --- crashes and replicas --------------------------------------------------------------------


@pytest.mark.postgres
async def test_an_event_claimed_by_a_dispatcher_that_died_is_sent_once_its_lease_runs_out(
    runtime: Runtime, receiver: Receiver
) -> None:
    await pending_request(runtime)
    now = utcnow()
    lease = timedelta(seconds=30)
    dead = Dispatcher(
        runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event(), lease_seconds=30
    )
    [row] = await webhook_rows(runtime)
    assert row.id is not None
    assert await dead._claim(now, 10)  # claimed, then the process is killed before sending
    d = dispatcher(runtime)
    assert await deliver_due(runtime, d, now + timedelta(seconds=1)) == 0  # still leased
    assert await deliver_due(runtime, d, now + lease + timedelta(seconds=1)) == 1
    [got] = receiver.verified
    assert got.headers["webhook-id"] == row.event_id
    assert (await webhook_rows(runtime))[0].status == OutboxStatus.SENT


@pytest.mark.postgres
async def test_two_replicas_send_each_event_once(runtime: Runtime, receiver: Receiver) -> None:
    ids = [await pending_request(runtime) for _ in range(6)]
    one, other = dispatcher(runtime), dispatcher(runtime)
    await asyncio.gather(one.run_once(), other.run_once())
    while await one.run_once() + await other.run_once():
        pass
    assert sorted(r.event["data"]["id"] for r in receiver.of_type("request.created")) == sorted(ids)
    assert len(receiver.verified) == 6


# --- retries, Retry-After, permanent failures, bounded attempts --------------------------------


async def test_retries_after_500s_then_delivers_with_the_same_webhook_id(
    runtime: Runtime, receiver: Receiver
) -> None:
    receiver.answers = [(500, {}), (503, {}), (204, {})]
    retries, sent = counted("retry"), counted("sent")
    rid = await pending_request(runtime)
    d = dispatcher(runtime)
    for _ in range(3):
        assert await deliver_due(runtime, d) == 1
    assert await deliver_due(runtime, d) == 0
    assert len(receiver.verified) == 3
    assert len({r.headers["webhook-id"] for r in receiver.verified}) == 1
    assert len({r.body for r in receiver.verified}) == 1  # the same event each time
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.SENT
    assert row.attempts == 3
    assert row.request_id == rid
    assert counted("retry") - retries == 2
    assert counted("sent") - sent == 1


async def test_retry_after_is_honoured(runtime: Runtime, receiver: Receiver) -> None:
    receiver.answers = [(429, {"Retry-After": "120"})]
    await pending_request(runtime)
    d = dispatcher(runtime)
    now = utcnow()
    assert await deliver_due(runtime, d, now) == 1
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.PENDING
    assert row.last_error is not None
    assert row.last_error.startswith("HTTP 429")
    assert row.next_attempt_at >= now + timedelta(seconds=120)
    assert await deliver_due(runtime, d, now + timedelta(seconds=119)) == 0
    assert await deliver_due(runtime, d, row.next_attempt_at) == 1
    assert len(receiver.verified) == 2
    assert (await webhook_rows(runtime))[0].status == OutboxStatus.SENT


def test_retry_after_as_a_date_or_seconds_is_read_and_capped() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert webhooks.retry_after({"retry-after": "30"}, now) == 30
    assert (
        webhooks.retry_after({"retry-after": format_datetime(now + timedelta(minutes=2), True)}, now) == 120
    )
    assert webhooks.retry_after({"retry-after": "99999999"}, now) == webhooks.MAX_RETRY_AFTER
    assert webhooks.retry_after({"retry-after": "-5"}, now) == 0
    assert webhooks.retry_after({"retry-after": "soon"}, now) is None
    assert webhooks.retry_after({"retry-after": "nan"}, now) is None
    assert webhooks.retry_after({}, now) is None


@pytest.mark.parametrize("status", [400, 401, 404, 410, 301])
async def test_a_refusal_stops_at_once_and_changes_no_request(
    runtime: Runtime, receiver: Receiver, status: int
) -> None:
    receiver.answers = [(status, {"Location": "https://elsewhere.example/"})]
    failed = counted("failed")
    rid = await pending_request(runtime)
    d = dispatcher(runtime)
    assert await deliver_due(runtime, d, utcnow()) == 1
    assert await deliver_due(runtime, d, utcnow() + timedelta(days=1)) == 0
    assert len(receiver.verified) == 1
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.FAILED
    assert row.last_error is not None
    assert row.last_error.startswith(f"HTTP {status}")
    assert counted("failed") - failed == 1
    async with runtime.sessions() as s:
        req = await get_request(s, rid)
    assert req is not None
    assert req.status == Status.PENDING


@pytest.mark.parametrize("status", [408, 429, 500, 502])
async def test_retryable_answers_are_retried(runtime: Runtime, receiver: Receiver, status: int) -> None:
    receiver.answers = [(status, {})]
    await pending_request(runtime)
    d = dispatcher(runtime)
    assert await deliver_due(runtime, d, utcnow()) == 1
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.PENDING
    assert row.attempts == 1
    assert await deliver_due(runtime, d) == 1
    assert (await webhook_rows(runtime))[0].status == OutboxStatus.SENT


@pytest.fixture
def three_attempts(hooks: dict[str, Any]) -> None:
    hooks["sink"]["max_attempts"] = 3


@pytest.mark.usefixtures("three_attempts")
async def test_attempts_are_bounded_then_failed_on_metrics_and_console(
    runtime: Runtime, receiver: Receiver
) -> None:
    receiver.answers = [(500, {})] * 10
    failed = counted("failed")
    rid = await pending_request(runtime)
    d = dispatcher(runtime)
    while await deliver_due(runtime, d):
        pass
    assert len(receiver.verified) == 3
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.FAILED
    assert row.attempts == 3
    assert row.last_error == "HTTP 500"
    assert counted("failed") - failed == 1
    async with runtime.sessions() as s:
        req = await get_request(s, rid)
    assert req is not None
    assert req.status == Status.PENDING  # a failed webhook never cancels a request

    async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
        text = (await http.get("/metrics")).text
        assert 'signoff_webhook_failed{webhook="sink"} 1.0' in text
        assert re.search(r'signoff_webhook_deliveries_total\{result="failed",webhook="sink"\} [1-9]', text)


async def test_connection_errors_and_timeouts_are_retried(
    runtime: Runtime, receiver: Receiver, config: SignoffConfig
) -> None:
    runtime.config = _config(
        {
            "closed": {"url": f"http://127.0.0.1:{free_port()}/", "secret": SECRET, "events": ALL_EVENTS},
            "slow": {"url": receiver.url, "secret": SECRET, "events": ALL_EVENTS, "timeout": 0.2},
        }
    )
    receiver.stall = 1.0
    await pending_request(runtime)
    assert await deliver_due(runtime, dispatcher(runtime), utcnow()) == 2
    rows = {r.channel: r for r in await webhook_rows(runtime)}
    assert rows["closed"].status == OutboxStatus.PENDING
    assert rows["closed"].last_error == "network error: ConnectError"
    assert rows["slow"].status == OutboxStatus.PENDING
    assert rows["slow"].last_error == "no answer within 0.2s"


async def test_a_webhook_taken_out_of_the_configuration_fails_its_events(
    runtime: Runtime, receiver: Receiver
) -> None:
    await pending_request(runtime)
    runtime.config = _config({})
    assert await deliver_due(runtime, dispatcher(runtime), utcnow()) == 1
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.FAILED
    assert row.last_error == "no webhook named 'sink' is configured"
    assert receiver.verified == []


# --- signatures ------------------------------------------------------------------------------


async def test_tampering_fails_verification_at_the_receiver(runtime: Runtime, receiver: Receiver) -> None:
    await pending_request(runtime)
    await dispatcher(runtime).run_once()
    [got] = receiver.verified
    check = Webhook(SECRET)
    assert check.verify(got.body, got.headers)["type"] == "request.created"

    event = got.event
    event["data"]["status"] = "approved"
    forged_body = json.dumps(event, separators=(",", ":")).encode()
    with pytest.raises(WebhookVerificationError):
        check.verify(forged_body, got.headers)
    signature = base64.b64decode(got.headers["webhook-signature"].removeprefix("v1,"))
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    forged = {**got.headers, "webhook-signature": "v1," + base64.b64encode(flipped).decode()}
    with pytest.raises(WebhookVerificationError):
        check.verify(got.body, forged)
    with pytest.raises(WebhookVerificationError):
        check.verify(got.body, {**got.headers, "webhook-id": "msg_someone_else"})
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(got.body, got.headers)


@pytest.fixture
def wrong_secret(hooks: dict[str, Any]) -> None:
    hooks["sink"]["secret"] = OTHER_SECRET


@pytest.mark.usefixtures("wrong_secret")
async def test_a_receiver_with_another_secret_refuses_and_the_event_fails(
    runtime: Runtime, receiver: Receiver
) -> None:
    await pending_request(runtime)
    await dispatcher(runtime).run_once()
    assert receiver.verified == []
    assert len(receiver.refused) == 1
    [row] = await webhook_rows(runtime)
    assert row.status == OutboxStatus.FAILED
    assert row.last_error == "HTTP 401"


@settings(max_examples=60, deadline=None)
@given(
    payload=st.dictionaries(st.text(max_size=10), st.text(max_size=30) | st.integers(), max_size=5),
    position=st.integers(min_value=0),
    bit=st.integers(min_value=0, max_value=7),
)
def test_any_changed_byte_of_a_body_fails_verification(
    payload: dict[str, Any], position: int, bit: int
) -> None:
    hook = WebhookConfig(url="https://hooks.example.com/", secret=SECRET, events=("request.created",))  # type: ignore[arg-type]
    body = webhooks.encode({"type": "request.created", "timestamp": "t", "data": payload})
    headers = webhooks.signed_headers(hook, "msg_1", body, utcnow())
    assert Webhook(SECRET).verify(body, headers) is not None
    i = position % len(body)
    changed = body[:i] + bytes([body[i] ^ (1 << bit)]) + body[i + 1 :]
    try:
        text = changed.decode()
    except UnicodeDecodeError:
        return  # not text: no receiver would take it for an event
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(text, headers)


# --- no caller-supplied URL ------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    arguments=st.dictionaries(
        st.sampled_from(["callback_url", "webhook", "url", "notify", "amount"]),
        st.sampled_from(["http://169.254.169.254/latest/meta-data", "http://127.0.0.1:1/", "x"]),
    )
)
def test_nothing_a_caller_sends_names_where_events_go(arguments: dict[str, str]) -> None:
    config = _config(
        {"sink": {"url": "https://hooks.example.com/in", "secret": SECRET, "events": ALL_EVENTS}}
    )
    sent: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(204)

    async def run() -> None:
        client = httpx.AsyncClient(transport=httpx.MockTransport(record))
        await webhooks.send(
            client,
            config.webhooks["sink"],
            event_id="msg_x",
            payload={"type": "request.created", "timestamp": "t", "data": {"arguments": arguments}},
            now=utcnow(),
        )
        await client.aclose()

    asyncio.run(run())
    assert sent == ["https://hooks.example.com/in"]


# --- configuration ---------------------------------------------------------------------------


def _problems(hooks: Any) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config({"webhooks": hooks}, source="s.yaml")
    return "\n".join(exc.value.problems)


def test_config_refuses_unknown_events_naming_the_known_ones() -> None:
    text = _problems({"a": {"url": "https://h.example/", "secret": SECRET, "events": ["request.approved"]}})
    assert "s.yaml: webhooks.a.events: unknown event 'request.approved'" in text
    assert "request.created, request.decided, grant.created, grant.revoked" in text


@pytest.mark.parametrize(
    ("hook", "problem"),
    [
        ({"url": "ftp://h.example/", "secret": SECRET, "events": ["request.created"]}, "webhooks.a.url"),
        ({"url": "hooks.example.com/x", "secret": SECRET, "events": ["request.created"]}, "webhooks.a.url"),
        ({"url": "https://u:p@h.example/", "secret": SECRET, "events": ["request.created"]}, "credentials"),
        ({"url": "https://h.example:x/", "secret": SECRET, "events": ["request.created"]}, "webhooks.a.url"),
        ({"url": "https://h.example/", "secret": "hunter2", "events": ["request.created"]}, "whsec_"),
        ({"url": "https://h.example/", "secret": "whsec_c2hvcnQ=", "events": ["grant.created"]}, "24 to 64"),
        (
            {"url": "https://h.example/", "secret": "whsec_!!!notbase64!!!", "events": ["grant.created"]},
            "whsec_",
        ),
        ({"url": "https://h.example/", "secret": SECRET, "events": []}, "webhooks.a.events"),
        ({"url": "https://h.example/", "secret": SECRET}, "webhooks.a.events"),
        (
            {"url": "https://h.example/", "secret": SECRET, "events": ["grant.created"], "to": 1},
            "webhooks.a.to",
        ),
        (
            {"url": "https://h.example/", "secret": SECRET, "events": ["grant.created"], "max_attempts": 0},
            "max_att",
        ),
    ],
)
def test_config_refuses_bad_webhooks(hook: dict[str, Any], problem: str) -> None:
    assert problem in _problems({"a": hook})


def test_config_refuses_a_webhook_whose_secret_is_not_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIGNOFF_TEST_HOOK_SECRET", raising=False)
    hook = {"url": "https://h.example/", "secret": "${SIGNOFF_TEST_HOOK_SECRET}", "events": ["grant.created"]}
    assert "environment variable SIGNOFF_TEST_HOOK_SECRET is not set" in _problems({"a": hook})
    monkeypatch.setenv("SIGNOFF_TEST_HOOK_SECRET", SECRET)
    config = parse_config({"webhooks": {"a": hook}})
    assert config.webhooks["a"].secret.get_secret_value() == SECRET
    assert config.subscribers("grant.created") == ("a",)
    assert config.subscribers("request.created") == ()


def test_config_names_plain_http_to_another_machine_and_versions_the_secret() -> None:
    def config(url: str, secret: str = SECRET) -> SignoffConfig:
        return parse_config({"webhooks": {"a": {"url": url, "secret": secret, "events": ["grant.created"]}}})

    assert any("webhooks.a.url: http://" in w for w in config("http://hooks.example.com/").warnings())
    assert config("http://127.0.0.1:9000/").warnings() == []
    assert config("https://hooks.example.com/").warnings() == []
    assert config("https://h.example/").version != config("https://h.example/", OTHER_SECRET).version
    view = json.dumps(config_view(config("https://h.example/")))
    assert SECRET not in view
    assert "********" in view


def test_the_documented_check_without_a_library_agrees_with_the_reference() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "webhooks.md").read_text(encoding="utf-8")
    snippet = doc.split("Without a library, the check is:")[1].split("```python")[1].split("```")[0]
    scope: dict[str, Any] = {}
    exec(snippet, scope)  # the page's own code
    hook = WebhookConfig(url="https://h.example/", secret=SECRET, events=("grant.created",))  # type: ignore[arg-type]
    body = webhooks.encode(
        {"type": "grant.created", "timestamp": "t", "data": {"id": "g1", "same": {"to": "é"}}}
    )
    headers = webhooks.signed_headers(hook, "msg_1", body, utcnow())
    Webhook(SECRET).verify(body, headers)
    assert scope["verify"](SECRET, headers, body)
    assert not scope["verify"](SECRET, headers, body.replace(b"g1", b"g2"))
    assert not scope["verify"](OTHER_SECRET, headers, body)
    stale = webhooks.signed_headers(hook, "msg_1", body, utcnow() - timedelta(minutes=10))
    assert not scope["verify"](SECRET, stale, body)
