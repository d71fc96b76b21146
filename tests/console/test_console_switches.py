"""The read-only switches on the console's configuration page: one per switch a configured
``readonly_guard`` watches, none without a guard."""

from __future__ import annotations

import copy
import html
from typing import Any

import pytest
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import AuditEvent, Switch
from signoff.app.runtime import Runtime
from tests.conftest import DEFAULT_CONFIG
from tests.console.conftest import Console, csrf_of, operators


def with_guards(password_hashes: dict[str, str], **guards: list[dict[str, Any]]) -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    for agent, hooks in guards.items():
        body["agents"][agent.replace("_", "-")]["hooks"] += hooks
    body["operators"] = operators(password_hashes)
    return parse_config(body, source="console-switches.yaml")


@pytest.fixture
def config(password_hashes: dict[str, str], request: pytest.FixtureRequest) -> SignoffConfig:
    guards: dict[str, list[dict[str, Any]]] = getattr(request, "param", {})
    return with_guards(password_hashes, **guards)


async def switches(runtime: Runtime) -> dict[str, bool]:
    async with runtime.reads() as s:
        return {row.name: row.on for row in (await s.exec(select(Switch))).all()}


async def test_without_a_guard_there_is_no_switch_to_flip(alice: Console, runtime: Runtime) -> None:
    page = (await alice.get("/ui/config")).text
    assert "Read-only" not in page
    assert "/ui/switches/" not in page
    refused = await alice.client.post("/ui/switches/read_only", data={"on": "1", "csrf_token": csrf_of(page)})
    assert refused.status_code == 404
    assert "No readonly_guard watches a switch &#39;read_only&#39;" in refused.text
    assert await switches(runtime) == {}


GUARD = {"type": "readonly_guard", "tools": ["pay_*"]}


@pytest.mark.parametrize("config", [{"finance_bot": [GUARD]}], indirect=True)
async def test_a_guarded_switch_is_shown_and_flipped_from_the_console(
    alice: Console, runtime: Runtime
) -> None:
    page = (await alice.get("/ui/config")).text
    assert ">Read-only mode</h2>" in page
    assert "the <code>readonly_guard</code> of finance-bot covers are denied" in page
    assert "It is <strong>off</strong>" in page
    refused = await alice.client.post("/ui/switches/read_only", data={"on": "1"})
    assert refused.status_code == 403  # no CSRF token
    on = await alice.client.post(
        "/ui/switches/read_only", data={"on": "1", "reason": "incident 7", "csrf_token": csrf_of(page)}
    )
    assert on.status_code == 303
    after = (await alice.get("/ui/config")).text
    assert '<div class="flash ok" role="status">Read-only mode is on.</div>' in after
    assert "It is <strong>on</strong>" in after
    assert "incident 7" in after
    assert "Turn read-only mode off" in after
    async with runtime.sessions() as s:
        changes = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "switch_changed"))).all()
    assert [(e.detail["on"], e.actor_id, e.detail["reason"]) for e in changes] == [
        (True, "alice", "incident 7")
    ]
    assert await switches(runtime) == {"read_only": True}


@pytest.mark.parametrize(
    "config",
    [
        {
            "finance_bot": [{**GUARD, "switch": "maintenance"}],
            "other_bot": [{**GUARD, "switch": "maintenance"}],
        }
    ],
    indirect=True,
)
async def test_a_guard_s_own_switch_is_the_one_shown(alice: Console, runtime: Runtime) -> None:
    page = html.unescape((await alice.get("/ui/config")).text)
    assert "Read-only switch <code>maintenance</code>" in page
    assert "of finance-bot, other-bot covers" in page
    assert ">Read-only mode</h2>" not in page
    token = csrf_of(page)
    assert (
        await alice.client.post("/ui/switches/read_only", data={"on": "1", "csrf_token": token})
    ).status_code == 404
    on = await alice.client.post("/ui/switches/maintenance", data={"on": "1", "csrf_token": token})
    assert on.status_code == 303
    assert "The maintenance switch is on." in (await alice.get("/ui/config")).text
    assert await switches(runtime) == {"maintenance": True}
