"""The callback contract in the console and the operator API: the same operator's same
decision again stands (the console shows it as done, the API answers 200 with the request);
a conflicting decision after the request is decided names the final state and who made it
(an alert; 409); an expired or cancelled request says so (an alert; 410)."""

from __future__ import annotations

import html

import httpx
import time_machine

from tests.conftest import ADMIN_TOKEN
from tests.console.conftest import Agent, Console


async def flash(console: Console, rid: str) -> tuple[str, str]:
    """The page's one-shot message after a decision: its role and text."""
    page = (await console.get(f"/ui/requests/{rid}")).text
    for role in ("status", "alert"):
        marker = f'role="{role}">'
        at = page.find(marker)
        if at != -1 and 'class="flash' in page[max(0, at - 60) : at]:
            return role, html.unescape(page[at + len(marker) : page.index("</div>", at)])
    raise AssertionError("no message on the page")


async def test_the_console_answers_repeats_conflicts_and_late_decisions(
    alice: Console, agent: Agent, clock: time_machine.Traveller
) -> None:
    rid = await agent.ask()
    await alice.decide(rid, "approve")
    assert await flash(alice, rid) == ("status", "Approved once by Alice.")
    await alice.decide(rid, "approve")
    assert await flash(alice, rid) == (
        "status",
        "You already approved this request; it is approved by Alice.",
    )
    await alice.decide(rid, "reject", "no")
    assert await flash(alice, rid) == ("alert", "This request was already approved by Alice.")
    assert await agent.status(rid) == "approved"

    quick = await agent.ask("quick_fix", arguments={})
    clock.shift(1.2)  # past the gate's 1 s
    await alice.decide(quick, "approve")
    assert await flash(alice, quick) == ("alert", "This request has already expired.")

    cancelled = await agent.ask()
    assert (await agent.client.post(f"/v1/requests/{cancelled}/cancel")).status_code == 200
    await alice.decide(cancelled, "approve")
    role, text = await flash(alice, cancelled)
    assert role == "alert"
    assert text.startswith("This request was already cancelled")


async def test_the_operator_api_answers_410_for_a_cancelled_request(alice: Console, agent: Agent) -> None:
    rid = await agent.ask()
    assert (await agent.client.post(f"/v1/requests/{rid}/cancel")).status_code == 200
    async with httpx.AsyncClient(base_url=str(alice.client.base_url), trust_env=False) as http:
        r = await http.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    assert r.status_code == 410
    assert r.json()["status"] == "cancelled"
    assert r.json()["detail"].startswith("This request was already cancelled")
