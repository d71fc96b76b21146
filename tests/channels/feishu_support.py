"""Builders for Feishu channel tests: fixtures on disk, signed and encrypted requests, cards, a handler."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import os
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from Crypto.Cipher import AES

from signoff.channels import Card, Click, ClickOutcome, Person
from signoff.channels.feishu import FeishuChannel, FeishuConfig, create
from tests.channels.feishu_fake import FakeFeishu

FIXTURES = Path(__file__).parent / "fixtures" / "feishu"
NOW = 1_700_000_000
"""The ``X-Lark-Request-Timestamp`` of the generated fixtures."""
ENCRYPT_KEY = "fixture-encrypt-key"
TOKEN = "tok"
CHAT = "oc_approvals"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def encrypt(plaintext: bytes, key: str, iv: bytes | None = None) -> str:
    """Feishu's envelope: AES-256-CBC, key sha256(key), random IV prepended, PKCS#7, base64."""
    iv = iv if iv is not None else os.urandom(16)
    pad = 16 - len(plaintext) % 16
    cipher = AES.new(hashlib.sha256(key.encode()).digest(), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(plaintext + bytes([pad]) * pad)).decode()


def sign(timestamp: str, nonce: str, secret: str, body: bytes, *, algorithm: str = "sha256") -> str:
    return hashlib.new(algorithm, (timestamp + nonce + secret).encode() + body).hexdigest()


def signed_encrypted(
    payload: dict[str, Any] | bytes, *, key: str = ENCRYPT_KEY, timestamp: int = NOW, nonce: str = "n0nce"
) -> tuple[bytes, dict[str, str]]:
    """A request as Feishu sends it with an Encrypt Key: encrypted body, SHA-256 signature headers."""
    plaintext = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    body = json.dumps({"encrypt": encrypt(plaintext, key)}).encode()
    headers = {
        "content-type": "application/json",
        "x-lark-request-timestamp": str(timestamp),
        "x-lark-request-nonce": nonce,
        "x-lark-signature": sign(str(timestamp), nonce, key, body),
    }
    return body, headers


def fixture_request(name: str) -> tuple[bytes, dict[str, str]]:
    data = fixture(name)
    return data["body_raw"].encode(), data["headers"]


def card_action(
    request_id: str = "req-1",
    verdict: str = "approve",
    *,
    event_id: str = "ev-1",
    token: str = TOKEN,
    reason: str | None = None,
    open_id: str = "ou_alice",
    union_id: str = "on_union_alice",
    chat: str = CHAT,
) -> dict[str, Any]:
    """The documented ``card.action.trigger`` payload, clicking one of our buttons in ``chat``."""
    payload: dict[str, Any] = copy.deepcopy(fixture("card_action_trigger.v2.doc_derived.openlark.json"))
    payload["header"]["event_id"] = event_id
    payload["header"]["token"] = token
    action = payload["event"]["action"]
    action["value"] = {"request_id": request_id, "verdict": verdict}
    action["name"] = verdict
    if reason is not None:
        action["form_value"] = {"reason": reason}
    payload["event"]["operator"]["open_id"] = open_id
    payload["event"]["operator"]["union_id"] = union_id
    payload["event"]["context"]["open_chat_id"] = chat
    return payload


def make_card(**changes: Any) -> Card:
    created = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)
    card = Card(
        request_id="req-1",
        agent_id="finance-bot",
        tool_name="pay_invoice",
        arguments={"amount": 50_000, "currency": "CNY", "payee": "ACME 有限公司"},
        status="pending",
        created_at=created,
        expires_at=created + timedelta(minutes=30),
        quorum=2,
        approvers=(Person("Alice", "ou_alice"), Person("Bob", "ou_bob")),
        requester=Person("Dana", "ou_dana"),
    )
    return replace(card, **changes)


def decided(card: Card, status: str = "approved", *, reason: str | None = None) -> Card:
    at = card.created_at + timedelta(minutes=5)
    return replace(card, status=status, decided_by=Person("Alice", "ou_alice"), decided_at=at, reason=reason)


def walk(node: Any) -> list[dict[str, Any]]:
    """Every element (any dict with a ``tag``) anywhere in a card."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        if "tag" in node:
            found.append(node)
        for value in node.values():
            found += walk(value)
    elif isinstance(node, list):
        for value in node:
            found += walk(value)
    return found


def buttons(card_json: dict[str, Any]) -> list[dict[str, Any]]:
    return [element for element in walk(card_json) if element["tag"] == "button"]


@dataclass
class RecordingHandler:
    """A :class:`ClickHandler` that records calls and answers with a scripted outcome."""

    accept: bool = True
    delay: float = 0.0
    error: Exception | None = None
    card: Card | None = None
    clicks: list[Click] = field(default_factory=list)
    finished: int = 0
    """Clicks whose handling ran to its end (after ``delay``)."""
    enriched: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        self.clicks.append(click)
        if self.delay:
            await asyncio.sleep(self.delay)
        self.finished += 1
        if self.error is not None:
            raise self.error
        base = self.card or make_card(request_id=click.request_id)
        if not self.accept:
            return ClickOutcome(False, "You are not an approver of this request.", base)
        status = "approved" if click.verdict == "approve" else "rejected"
        return ClickOutcome(True, f"Recorded: {status}.", decided(base, status, reason=click.reason))

    async def enrich_identity(
        self, channel: str, user_id: str, *, name: str | None, email: str | None
    ) -> None:
        self.enriched.append((channel, user_id, name, email))


def make_channel(
    fake: FakeFeishu,
    *,
    secret: str = "app-secret",
    join: bool = True,
    chat: str = CHAT,
    clock: float = NOW,
    **config: Any,
) -> FeishuChannel:
    """A channel whose SDK talks to ``fake``, with its own app id (the SDK caches tokens per app id)."""
    app_id = config.pop("app_id", f"cli_{uuid.uuid4().hex[:16]}")
    fake.add_chat(chat)
    fake.add_app(app_id, secret, chats=(chat,) if join else ())
    settings: dict[str, Any] = {
        "type": "feishu",
        "app_id": app_id,
        "app_secret": secret,
        "verification_token": TOKEN,
        "encrypt_key": ENCRYPT_KEY,
        "chat_id": chat,
        "base_url": fake.origin,
    }
    settings.update(config)
    return create("ops-feishu", FeishuConfig.model_validate(settings), clock=lambda: clock)
