"""The ntfy channel's configuration and notifications: pure functions, and ``signoff config
check`` on a file with an ntfy channel."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from signoff.app.config import ConfigError, parse_config
from signoff.channels import Card, Person
from signoff.channels.ntfy import NtfyConfig, render_notification
from signoff.channels.ntfy._message import MAX_MESSAGE_BYTES

SIGNOFF = Path(sys.executable).with_name("signoff")
NOW = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)


def card(**changes: Any) -> Card:
    base = Card(
        request_id="req-1",
        agent_id="finance-bot",
        tool_name="pay_invoice",
        arguments={"amount": 50_000, "payee": "ACME", "api_key": "[redacted]"},
        status="pending",
        created_at=NOW,
        expires_at=NOW + timedelta(minutes=30),
        quorum=1,
        approvers=(Person("Alice", "alice-topic-1"),),
        console_url="https://signoff.test/ui/requests/req-1",
    )
    return replace(base, **changes)


def render(c: Card, **more: Any) -> dict[str, Any]:
    return render_notification(
        c,
        topic="alice-topic-1",
        callback_url="https://signoff.test/callbacks/ntfy/phone",
        approve_token="A.a",
        reject_token="R.r",
        reject_page="https://signoff.test/approve/R.r",
        now=NOW + timedelta(seconds=90),
        **more,
    ).as_json()


def test_a_notification_is_ntfys_json_publish_with_three_actions() -> None:
    data = render(card())
    assert data["topic"] == "alice-topic-1"
    assert data["title"] == "Approve pay_invoice for finance-bot?"
    assert data["message"].splitlines() == [
        "Tool: pay_invoice",
        "Agent: finance-bot",
        "Arguments:",
        '"amount": 50000',
        '"api_key": "[redacted]"',
        '"payee": "ACME"',
        "Time left: 28m 30s (expires 2026-05-01 10:00 UTC)",
        "Request req-1",
    ]
    assert data["actions"] == [
        {
            "action": "http",
            "label": "Approve",
            "url": "https://signoff.test/callbacks/ntfy/phone",
            "clear": True,
            "method": "POST",
            "headers": {"Content-Type": "text/plain"},
            "body": "A.a",
        },
        {
            "action": "http",
            "label": "Reject",
            "url": "https://signoff.test/callbacks/ntfy/phone",
            "clear": True,
            "method": "POST",
            "headers": {"Content-Type": "text/plain"},
            "body": "R.r",
        },
        {"action": "view", "label": "Open", "url": "https://signoff.test/ui/requests/req-1", "clear": False},
    ]
    assert data["click"] == "https://signoff.test/ui/requests/req-1"
    assert render(card(), reminder=True)["title"] == "Reminder: Approve pay_invoice for finance-bot?"


def test_long_values_are_cut_short_and_a_call_that_does_not_fit_offers_no_approve() -> None:
    long = render(card(arguments={"script": "x" * 10_000, "host": "web-1"}))
    assert len(long["message"].encode()) <= MAX_MESSAGE_BYTES
    assert '"host": "web-1"' in long["message"]
    assert "more characters" in long["message"]
    assert "Values cut short here are whole in Signoff." in long["message"]
    assert [a["label"] for a in long["actions"]] == ["Approve", "Reject", "Open"]

    many = render(card(arguments={f"field_{i:03}": "v" * 40 for i in range(300)}))
    assert len(many["message"].encode()) <= MAX_MESSAGE_BYTES
    assert [a["label"] for a in many["actions"]] == ["Reject", "Open"]
    assert "cannot be approved here" in many["message"]


def test_hidden_characters_in_names_are_shown_escaped() -> None:
    data = render(card(tool_name="pay\u202e_invoice", agent_id="bot\u200b"))
    assert data["title"] == "Approve pay\\u202e_invoice for bot\\u200b?"
    assert "Tool: pay\\u202e_invoice" in data["message"]


def test_a_required_reason_turns_reject_into_its_page() -> None:
    data = render(card(require_reject_reason=True, quorum=2))
    assert [(a["action"], a["label"]) for a in data["actions"]] == [
        ("http", "Approve"),
        ("view", "Reject…"),
        ("view", "Open"),
    ]
    assert data["actions"][1]["url"] == "https://signoff.test/approve/R.r"
    assert "Approvals: 0 of 2" in data["message"]


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("ntfy.sh", "must be the ntfy server's URL"),
        ("ftp://ntfy.sh", "must be the ntfy server's URL"),
        ("https://user:pw@ntfy.sh", "takes no query, fragment or credentials"),
        ("https://ntfy.sh/?auth=x", "takes no query, fragment or credentials"),
    ],
)
def test_a_server_that_is_not_a_url_is_refused(server: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        NtfyConfig.model_validate({"type": "ntfy", "server": server})


def test_the_config_and_its_warnings() -> None:
    config = NtfyConfig.model_validate({"type": "ntfy", "server": "https://ntfy.sh/", "token": "tk_1"})
    assert config.server == "https://ntfy.sh"
    assert config.warnings() == []
    assert NtfyConfig.model_validate({"type": "ntfy", "server": "http://127.0.0.1:8080"}).warnings() == []
    [warning] = NtfyConfig.model_validate({"type": "ntfy", "server": "http://ntfy.lan"}).warnings()
    assert warning.startswith("server: http:// sends the notifications and their approval tokens unencrypted")
    with pytest.raises(ValidationError, match="must be an ntfy access token"):
        NtfyConfig.model_validate({"type": "ntfy", "server": "https://ntfy.sh", "token": "tk 1"})


def doc(approvers: list[str], people: dict[str, Any]) -> dict[str, Any]:
    return {
        "channels": {"phone": {"type": "ntfy", "server": "https://ntfy.example.com", "token": "tk_x"}},
        "people": people,
        "agents": {
            "bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "name": "g",
                        "tools": ["pay_*"],
                        "channel": "phone",
                        "approvers": approvers,
                    }
                ]
            }
        },
    }


@pytest.mark.parametrize(
    ("approvers", "people", "problem"),
    [
        (
            [],
            {},
            "agents.bot.hooks[0].approvers: the ntfy channel 'phone' sends each approver a message, "
            "so the gate must list them (people with their ntfy id)",
        ),
        (
            ["alice"],
            {"alice": {"email": "a@example.com"}},
            "agents.bot.hooks[0].approvers[0]: 'alice' has no ntfy id in people; "
            "add `ntfy: <user id>` to people.alice",
        ),
        (
            ["alice"],
            {"alice": {"ntfy": "not a topic!"}},
            "agents.bot.hooks[0].approvers[0]: people.alice.ntfy is not a valid ntfy id "
            "(letters, digits, - and _, at most 64); fix people.alice.ntfy",
        ),
        (
            ["alcie"],
            {"alice": {"ntfy": "alice-Hk3vQ9xT2m"}},
            "agents.bot.hooks[0].approvers[0]: 'alcie' is neither in people nor an operator; "
            "did you mean 'alice'?",
        ),
    ],
)
def test_config_refuses_what_an_ntfy_gate_cannot_reach(
    approvers: list[str], people: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(approvers, people), source="signoff.yaml")
    assert info.value.problems == [f"signoff.yaml: {problem}"]


def test_config_check_knows_ntfy(tmp_path: Path) -> None:
    body = doc(["alice"], {"alice": {"ntfy": "alice-Hk3vQ9xT2m"}})
    body["channels"]["phone"]["server"] = "http://ntfy.lan"
    path = tmp_path / "signoff.yaml"
    path.write_text(yaml.safe_dump(body))
    done = subprocess.run(
        [str(SIGNOFF), "config", "check", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "warning:" in done.stderr
    assert "channels.phone.server: http:// sends the notifications" in done.stderr
    assert done.stdout.strip() == f"{path}: ok (2 channels, 1 person, 1 agent, 1 gate)"
