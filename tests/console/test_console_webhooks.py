"""The console's list of webhook events that could not be delivered."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace

import pytest

from signoff.app.config import SignoffConfig, WebhookConfig
from signoff.app.db import transaction
from signoff.app.outbox import Dispatcher
from signoff.app.runtime import Runtime
from tests.app.factories import make_request
from tests.conftest import free_port
from tests.console.conftest import Console

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
URL_TOKEN = "tok-in-the-url-5f3a9c1e"


@pytest.fixture
def config(config: SignoffConfig) -> SignoffConfig:
    """The console's test configuration with a webhook nobody listens on, tried once."""
    nowhere = WebhookConfig(
        url=f"http://127.0.0.1:{free_port()}/in?token={URL_TOKEN}",
        secret=SECRET,  # type: ignore[arg-type]
        events=("request.created",),
        max_attempts=1,
    )
    return replace(config, webhooks={"audit-sink": nowhere})


async def test_failed_webhook_events_are_listed_with_their_last_error(
    console: Console, runtime: Runtime
) -> None:
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
    dispatcher = Dispatcher(runtime.sessions, runtime.channels, lambda: runtime.config, wake=asyncio.Event())
    assert await dispatcher.run_once() == 2  # the card and the event

    assert (await console.sign_in("alice")).status_code == 303
    page = await console.get("/ui/webhooks")
    assert page.status_code == 200
    assert 'aria-current="page">Webhooks' in page.text
    configured, failed = page.text.split('id="failed-title"')
    assert "audit-sink" in configured
    assert SECRET not in page.text
    assert "audit-sink" in failed
    assert "request.created" in failed
    assert f'href="/ui/requests/{req.id}"' in failed
    assert "network error: ConnectError" in failed

    shown = await console.get(f"/ui/requests/{req.id}")
    events = shown.text.split('id="webhooks-title"')[1].split("</section>")[0]
    assert "audit-sink" in events
    assert "failed" in events
    cards = shown.text.split('id="cards-title"')[1].split("</section>")[0]
    assert "audit-sink" not in cards


async def test_no_failures_say_so(console: Console) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    page = await console.get("/ui/webhooks")
    assert "No failed deliveries." in page.text


async def test_a_token_in_a_webhook_url_is_not_shown(console: Console) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    page = await console.get("/ui/webhooks")
    assert "/in?token=[redacted]" in page.text
    assert URL_TOKEN not in page.text
