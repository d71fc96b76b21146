"""Anyone on the network reaches the callback routes: a header of bytes that are not ASCII is
bad input like any other, refused (4xx) and counted, never a server error."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from signoff.app.config import parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import DEFAULT_CONFIG, Server

FEISHU = "ops-feishu"
ENCRYPT_KEY = "fixture-encrypt-key"


@pytest.fixture
async def http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    raw: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    raw["channels"][FEISHU] = {
        "type": "feishu",
        "app_id": "cli_redteam",
        "app_secret": "app-secret",
        "verification_token": "tok",
        "encrypt_key": ENCRYPT_KEY,
        "chat_id": "oc_approvals",
        "base_url": "http://127.0.0.1:9",
    }
    runtime = Runtime.create(settings, parse_config(raw, source="test.yaml"))
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            yield client
    finally:
        await runtime.aclose()


@pytest.mark.parametrize("length", [64, 40])
async def test_a_feishu_signature_with_a_non_ascii_byte_is_refused_not_a_500(
    http: httpx.AsyncClient, length: int
) -> None:
    body = json.dumps({"encrypt": "AAAA"}).encode()
    signature = b"\xe9" + b"a" * (length - 1)  # the header's length is what picks the scheme
    headers = {
        "content-type": "application/json",
        "x-lark-request-timestamp": str(int(time.time())).encode(),
        "x-lark-request-nonce": b"n0nce",
        "x-lark-signature": signature,
    }
    r = await http.post(f"/callbacks/feishu/{FEISHU}", content=body, headers=headers)
    assert r.status_code in (400, 401), (r.status_code, r.text)
