"""Webhook receivers that answer without end, or put a secret in their URL: the outbox is held up
by none of them, and the operator API shows neither the secret nor the URL's token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import Delivery, OutboxStatus
from signoff.app.outbox import Dispatcher
from signoff.app.runtime import Runtime
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request
from tests.conftest import free_port
from tests.redteam.support import ADMIN, CONFIG, attack_config

WEBHOOK_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


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
