"""Builders for Slack channel tests: cards, fixture payloads, signed callbacks, a recording handler."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from slack_sdk.signature import SignatureVerifier

from signoff.channels import Card, Click, ClickOutcome, Person
from signoff.channels.slack import ACTION_APPROVE, ACTION_REJECT, REASON_ACTION_ID, REASON_BLOCK_ID
from signoff.channels.slack import REJECT_MODAL_CALLBACK_ID as MODAL_ID
from tests.channels.fake_slack import CHANNEL

FIXTURES = Path(__file__).parent / "fixtures" / "slack"
SECRET = "test-signing-secret"
NOW = 1_700_000_000
CREATED = datetime.fromtimestamp(NOW, UTC)


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def card(
    *,
    status: str = "pending",
    quorum: int = 1,
    require_reject_reason: bool = False,
    arguments: dict[str, Any] | None = None,
) -> Card:
    """A pending card for ``shell.exec``; change the rest with ``dataclasses.replace``."""
    return Card(
        request_id="req-1",
        agent_id="deploy-bot",
        tool_name="shell.exec",
        arguments={"cmd": "systemctl restart api", "host": "web-1"} if arguments is None else arguments,
        status=status,
        created_at=CREATED,
        expires_at=CREATED + timedelta(minutes=30),
        quorum=quorum,
        approvers=(Person("Ana", "U0ANA"), Person("Bo", "U0BO")),
        requester=Person("Cy", "U0CY"),
        require_reject_reason=require_reject_reason,
    )


def decided(base: Card, status: str, *, reason: str | None = None) -> Card:
    return replace(
        base,
        status=status,
        approvals=(Person("Ana", "U0ANA"),) if status == "approved" else (),
        decided_by=Person("Ana", "U0ANA"),
        decided_at=CREATED + timedelta(minutes=5),
        reason=reason,
    )


def button_payload(action_id: str, *, request_id: str = "req-1", block_id: str = "b") -> dict[str, Any]:
    """The bolt-python enterprise-user click, re-aimed at our button in the fake's channel."""
    payload = fixture("block_actions_bolt_python_enterprise_user.json")
    payload["container"]["channel_id"] = CHANNEL
    payload["container"]["is_ephemeral"] = False
    payload["channel"]["id"] = CHANNEL
    payload["actions"][0].update(action_id=action_id, value=request_id, block_id=block_id)
    return payload


def approve_payload() -> dict[str, Any]:
    return button_payload(ACTION_APPROVE)


def reject_payload(block_id: str = "b") -> dict[str, Any]:
    return button_payload(ACTION_REJECT, block_id=block_id)


def submission_payload(reason: str | None, *, request_id: str = "req-1") -> dict[str, Any]:
    """The bolt-python view_submission, as if submitted from our rejection modal."""
    payload = fixture("view_submission_bolt_python_input_block.json")
    view = payload["view"]
    view["callback_id"] = MODAL_ID
    view["private_metadata"] = json.dumps({"request_id": request_id, "channel_id": CHANNEL})
    view["state"]["values"] = {
        REASON_BLOCK_ID: {REASON_ACTION_ID: {"type": "plain_text_input", "value": reason}}
    }
    return payload


def form_body(payload: dict[str, Any]) -> bytes:
    """Encoded the way the derived fixture was: ``payload=`` + percent-encoded compact JSON."""
    return ("payload=" + quote(json.dumps(payload, separators=(",", ":")))).encode()


def signed(body: bytes, *, timestamp: int = NOW, secret: str = SECRET) -> dict[str, str]:
    """Headers signed by slack-sdk's own verifier, an implementation independent of ours."""
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
    assert signature is not None
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": str(timestamp),
        "X-Slack-Signature": signature,
    }


def accept(click: Click) -> ClickOutcome:
    return ClickOutcome(accepted=True, message="Vote recorded.", card=decided(card(), "approved"))


def refuse(message: str) -> Callable[[Click], ClickOutcome]:
    def outcome(click: Click) -> ClickOutcome:
        return ClickOutcome(accepted=False, message=message, card=card())

    return outcome


class RecordingHandler:
    """A :class:`signoff.channels.ClickHandler` that records what the channel asked of the server."""

    def __init__(self, decide: Callable[[Click], ClickOutcome] = accept) -> None:
        self.clicks: list[tuple[str, Click]] = []
        self.enriched: list[tuple[str, str, str | None, str | None]] = []
        self._decide = decide

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        self.clicks.append((channel, click))
        return self._decide(click)

    async def enrich_identity(
        self, channel: str, user_id: str, *, name: str | None, email: str | None
    ) -> None:
        self.enriched.append((channel, user_id, name, email))
