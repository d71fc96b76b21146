"""Fixtures for channel tests: a fake Slack Web API on loopback and a channel wired to it, the
real server with a Slack channel, a fake Feishu Open API."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from signoff.app.config import parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.feishu_fake import FakeFeishu, serve
from tests.channels.slack_support import SECRET
from tests.conftest import DEFAULT_CONFIG, Server

SLACK_NAME = "ops-slack"
"""The Slack channel of ``slack_server``."""


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # slack-sdk routes every call through HTTP(S)_PROXY when set, loopback included.
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


@pytest.fixture
def slack_config_data(fake_slack: FakeSlack) -> dict[str, str]:
    return {
        "type": "slack",
        "bot_token": BOT_TOKEN,
        "signing_secret": "test-signing-secret",
        "channel": CHANNEL,
        "base_url": fake_slack.base_url,
    }


@pytest.fixture
def slack_gates() -> dict[str, Any]:
    """The configuration ``slack_server`` runs, before its Slack channel is added: the default
    one with every gate on ``SLACK_NAME``. A module overrides it with its own gates."""
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = SLACK_NAME
    return raw


@pytest.fixture
def slack_settings(settings: Settings) -> Settings:
    """The settings ``slack_server`` runs with; a module overrides them."""
    return settings


@pytest.fixture
async def slack_server(
    fake_slack: FakeSlack, slack_settings: Settings, slack_gates: dict[str, Any]
) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    """The real server (its outbox running) with ``slack_gates`` and a Slack channel
    ``SLACK_NAME`` on the fake Web API; alice, bob and carol are W0ALICE, W0BOB, W0CAROL there."""
    raw = copy.deepcopy(slack_gates)
    raw["channels"][SLACK_NAME] = {
        "type": "slack",
        "bot_token": BOT_TOKEN,
        "signing_secret": SECRET,
        "channel": CHANNEL,
        "base_url": fake_slack.base_url,
    }
    for person in ("alice", "bob", "carol"):
        raw["people"][person]["slack"] = f"W0{person.upper()}"
    runtime = Runtime.create(slack_settings, parse_config(raw))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


@pytest.fixture(scope="module")
def fake_feishu_server() -> Iterator[FakeFeishu]:
    """A fake Feishu Open API under uvicorn on loopback, shared by a module's tests."""
    fake = FakeFeishu()
    with serve(fake):
        yield fake


@pytest.fixture
def fake(fake_feishu_server: FakeFeishu, monkeypatch: pytest.MonkeyPatch) -> FakeFeishu:
    """The fake Feishu, reset; requests (inside lark-oapi) would send loopback through a proxy."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    fake_feishu_server.reset()
    return fake_feishu_server
