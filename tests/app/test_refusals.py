"""Refused callbacks through the real server: all counted, a bounded sample audited.

Anyone on the network can send Slack callbacks and email-link forms; a flood of refused
ones must not write the audit chain one event each. The address a refusal is recorded
under is the one the server sees (uvicorn takes it from ``X-Forwarded-For`` when the peer
is a trusted proxy, as 127.0.0.1 is by default), so each test sends from addresses of its
own choosing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app import refusals
from signoff.app.config import parse_config
from signoff.app.models import AuditEvent, utcnow
from signoff.app.refusals import SAMPLED
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.app.test_ops import sample
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server

SLACK = "ops-slack"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
FLOOD = 1_000
"""Refusals from one sender in one window: a hundred times the :data:`SAMPLED` audited singly."""
METRIC = "signoff_callback_rejections_total"


def _settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url="https://signoff.test/",  # the email links' form answers
        session_secret="a-long-random-secret-for-the-tests",  # type: ignore[arg-type]
    )


def _runtime(db_url: str) -> Runtime:
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["channels"][SLACK] = {
        "type": "slack",
        "bot_token": "xoxb-test-bot-token",
        "signing_secret": "test-signing-secret",
        "channel": "C0SIGNOFF",
        "base_url": "http://127.0.0.1:9/api/",
    }
    return Runtime.create(_settings(db_url), parse_config(raw, source="test.yaml"))


@pytest.fixture
async def served(db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    runtime = _runtime(db_url)
    try:
        async with (
            Server(runtime) as server,
            httpx.AsyncClient(base_url=server.url, timeout=60) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


@dataclass(frozen=True, eq=False)  # compared (and hashed) by identity
class Kind:
    """One way to be refused: where it is sent, what is sent, and what the audit calls it."""

    surface: str
    reason: str
    path: str
    headers: Callable[[], dict[str, str]] = dict
    form: dict[str, str] | None = None

    @property
    def metric_channel(self) -> str:
        return SLACK if self.surface == "slack" else "email"

    async def send(self, http: httpx.AsyncClient, address: str) -> httpx.Response:
        headers = {"X-Forwarded-For": address, **self.headers()}
        if self.form is not None:
            return await http.post(self.path, data=self.form, headers=headers)
        return await http.post(self.path, content=b"payload=%7B%7D", headers=headers)


def _slack(reason: str, timestamp: Callable[[], str] | None = None) -> Kind:
    def headers() -> dict[str, str]:
        signature = {} if timestamp is None else {"X-Slack-Signature": "v0=" + "0" * 64}
        stamp = {} if timestamp is None else {"X-Slack-Request-Timestamp": timestamp()}
        return {"content-type": "application/x-www-form-urlencoded", **signature, **stamp}

    return Kind("slack", reason, f"/callbacks/slack/{SLACK}", headers)


UNSIGNED = _slack("missing X-Slack-Request-Timestamp or X-Slack-Signature")
MIS_SIGNED = _slack("signature mismatch", lambda: str(int(time.time())))
STALE = _slack(
    "X-Slack-Request-Timestamp outside the five-minute window", lambda: str(int(time.time()) - 3600)
)
BAD_TIME = _slack("malformed X-Slack-Request-Timestamp", lambda: "soon")
MALFORMED_LINK = Kind("email", "malformed link token", "/approve/nope", form={"token": "nope"})
FORGED_LINK = Kind("email", "bad link signature", "/approve/YQ.YQ", form={"token": "YQ.YQ"})
KINDS = [UNSIGNED, MIS_SIGNED, STALE, BAD_TIME, MALFORMED_LINK, FORGED_LINK]


def refused_answer(kind: Kind, r: httpx.Response) -> bool:
    """The caller learns nothing beyond "refused": today's answers, unchanged."""
    if kind.surface == "slack":
        return r.status_code == 401 and r.json() == {"error": "invalid request"}
    return r.status_code in (400, 403) and "This link is not valid" in r.text


async def send_all(http: httpx.AsyncClient, sends: list[tuple[Kind, str]], at_once: int = 32) -> None:
    gate = asyncio.Semaphore(at_once)

    async def one(kind: Kind, address: str) -> None:
        async with gate:
            r = await kind.send(http, address)
        assert refused_answer(kind, r), (r.status_code, r.text[:200])

    await asyncio.gather(*(one(kind, address) for kind, address in sends))


async def refused_events(server: Server, after: int = 0) -> list[AuditEvent]:
    async with server.runtime.sessions() as s:
        stmt = (
            select(AuditEvent)
            .where(col(AuditEvent.action) == "callback_rejected", col(AuditEvent.seq) > after)
            .order_by(col(AuditEvent.seq))
        )
        return list((await s.exec(stmt)).all())


async def head(server: Server) -> int:
    async with server.runtime.sessions() as s:
        seqs = (await s.exec(select(AuditEvent.seq).order_by(col(AuditEvent.seq).desc()).limit(1))).all()
        return seqs[0] if seqs else 0


def accounted(events: list[AuditEvent]) -> int:
    """The refusals ``events`` record: each tally's count, and each single event its sender's
    tally (if any) does not already count."""
    tallies = [e.detail for e in events if "count" in e.detail]
    return sum(t["count"] - t["audited_singly"] for t in tallies) + len(events) - len(tallies)


async def counted(http: httpx.AsyncClient, kind: Kind) -> float:
    metrics = (await http.get("/metrics")).text
    return sample(metrics, METRIC, channel=kind.metric_channel, reason=kind.reason)


async def chain_intact(http: httpx.AsyncClient) -> bool:
    verdict = (await http.get("/v1/admin/audit/verify", headers=ADMIN)).json()
    return verdict["ok"] is True


@pytest.mark.parametrize(
    ("kind", "summary"),
    [
        pytest.param(UNSIGNED, "1,000 refused slack callbacks to ops-slack from 203.0.113.7", id="slack"),
        pytest.param(MALFORMED_LINK, "1,000 refused email links from 203.0.113.7", id="email"),
    ],
)
async def test_a_flood_from_one_address_writes_one_event_then_one_tally(
    served: tuple[Server, httpx.AsyncClient], kind: Kind, summary: str
) -> None:
    server, http = served
    start = utcnow()
    await server.runtime.refusals.flush(start)  # a window that starts now
    before, counted_before = await head(server), await counted(http, kind)

    await send_all(http, [(kind, "203.0.113.7")] * FLOOD)

    [first] = await refused_events(server, before)  # the first on record at once, with its reason
    assert first.detail["reason"] == kind.reason
    assert first.detail["address"] == "203.0.113.7"
    assert await counted(http, kind) == counted_before + FLOOD
    assert await server.runtime.refusals.flush(start + timedelta(minutes=1)) == 1
    [_, tally] = await refused_events(server, before)
    assert tally.detail["summary"] == f"{summary} in the last 1m"
    assert tally.detail["count"] == FLOOD
    assert tally.detail["address"] == "203.0.113.7"
    assert tally.detail["reasons"] == {kind.reason: FLOOD}
    assert tally.detail["audited_singly"] == 1
    assert await server.runtime.refusals.flush() == 0  # nothing left to write
    assert await chain_intact(http)


async def test_a_single_refused_callback_is_audited_at_once_with_its_reason(
    served: tuple[Server, httpx.AsyncClient],
) -> None:
    server, http = served
    await server.runtime.refusals.flush()
    before = await head(server)
    await send_all(http, [(MIS_SIGNED, "198.51.100.4")])

    [event] = await refused_events(server, before)
    assert event.actor_channel == "slack"
    assert event.actor_name == SLACK
    assert event.detail["reason"] == "signature mismatch"
    assert event.detail["address"] == "198.51.100.4"
    assert event.detail["channel"] == SLACK
    assert await server.runtime.refusals.flush() == 0, "already on record: no tally for it"
    assert len(await refused_events(server, before)) == 1


async def test_a_flood_from_many_addresses_writes_at_most_the_bound(
    served: tuple[Server, httpx.AsyncClient],
) -> None:
    server, http = served
    start = utcnow()
    await server.runtime.refusals.flush(start)
    before = await head(server)
    # 30 senders, each busier than the next: the busiest SAMPLED are named in the tallies.
    sent = {f"203.0.113.{i}": 40 - i for i in range(30)}
    await send_all(http, [(UNSIGNED, address) for address, n in sent.items() for _ in range(n)])

    assert len(await refused_events(server, before)) == SAMPLED  # one per sender, up to the cap
    await server.runtime.refusals.flush(start + timedelta(seconds=90))
    events = await refused_events(server, before)
    assert len(events) == 2 * SAMPLED + 1
    named, rest = events[SAMPLED:-1], events[-1]
    busiest = list(sent)[:SAMPLED]
    assert [(e.detail["address"], e.detail["count"]) for e in named] == [(a, sent[a]) for a in busiest]
    others = sum(sent.values()) - sum(sent[a] for a in busiest)
    assert rest.actor_channel == "system"
    assert rest.detail["count"] == others
    assert (
        rest.detail["summary"]
        == f"and {others:,} more refused callbacks from 20 addresses in the last 1m 30s"
    )
    assert accounted(events) == sum(sent.values())
    assert await chain_intact(http)


async def test_kinds_beyond_the_memory_bound_are_still_counted(
    served: tuple[Server, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, http = served
    start = utcnow()
    await server.runtime.refusals.flush(start)
    monkeypatch.setattr(refusals, "MAX_KEYS", 3)
    before, counted_before = await head(server), await counted(http, UNSIGNED)
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"):
        await send_all(http, [(UNSIGNED, address)] * 2)

    assert await counted(http, UNSIGNED) == counted_before + 10
    await server.runtime.refusals.flush(start + timedelta(minutes=1))
    events = await refused_events(server, before)
    *named, rest = events
    assert [e.detail["address"] for e in named if "count" in e.detail] == [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
    ]
    assert (rest.detail["count"], rest.detail["uncounted"]) == (4, 4)
    assert rest.detail["summary"] == "and 4 more refused callbacks from at least 1 address in the last 1m"
    assert accounted(events) == 10


async def test_tallies_are_written_when_the_server_stops(db_url: str) -> None:
    runtime = _runtime(db_url)
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url) as http:
            before = await head(server)
            await send_all(http, [(STALE, "192.0.2.9")] * 3)
        async with runtime.sessions() as s:
            stmt = select(AuditEvent).where(col(AuditEvent.seq) > before).order_by(col(AuditEvent.seq))
            single, tally = (await s.exec(stmt)).all()
        assert single.detail["reason"] == STALE.reason
        assert tally.detail["count"] == 3
        assert tally.detail["summary"].startswith("3 refused slack callbacks to ops-slack from 192.0.2.9 ")
    finally:
        await runtime.aclose()


async def test_the_scheduler_closes_each_window(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(refusals, "WINDOW_SECONDS", 0.2)
    runtime = _runtime(db_url)
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            before = await head(server)
            await send_all(http, [(UNSIGNED, "192.0.2.10")] * 5)
            deadline = asyncio.get_running_loop().time() + 20
            while accounted(await refused_events(server, before)) < 5:
                assert asyncio.get_running_loop().time() < deadline, "no window closed within 20 s"
                await asyncio.sleep(0.05)
    finally:
        await runtime.aclose()


PROPERTY = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(
    sends=st.lists(
        st.tuples(st.sampled_from(KINDS), st.integers(0, 14).map(lambda i: f"2001:db8::{i:x}")),
        min_size=1,
        max_size=120,
    )
)
async def test_every_refusal_is_counted_and_accounted_for_in_a_bounded_number_of_events(
    served: tuple[Server, httpx.AsyncClient], sends: list[tuple[Kind, str]]
) -> None:
    server, http = served
    start = utcnow()
    await server.runtime.refusals.flush(start)
    before = await head(server)
    metric_before = {k: await counted(http, k) for k in KINDS}

    await send_all(http, sends)
    singly = await refused_events(server, before)
    await server.runtime.refusals.flush(start + timedelta(minutes=1))
    events = await refused_events(server, before)
    tallies = events[len(singly) :]

    assert len(singly) <= SAMPLED
    assert len(tallies) <= SAMPLED + 1
    for k in KINDS:
        assert await counted(http, k) == metric_before[k] + sum(1 for kind, _ in sends if kind == k)
    assert accounted(events) == len(sends)  # each refusal on record once, singly or in a tally
    assert await chain_intact(http)
