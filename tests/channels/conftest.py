"""Fixtures for channel tests: a fake Slack Web API on loopback and a channel wired to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.channels.fake_slack import BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.feishu_fake import FakeFeishu, serve


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
