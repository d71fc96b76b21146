"""``POST /v1/me/requests/{id}/decision`` (``signoff requests approve|reject`` with
``SIGNOFF_TOKEN``) answers by the callback contract every decision surface follows (DESIGN
"Every decision surface follows one callback contract"): the same person's same decision again
is 200 with the request as it stands (a retry after a lost answer is no failure), a conflicting
decision after the request is decided is 409, and an expired or cancelled request is 410."""

from __future__ import annotations

import html

import pytest

from signoff.app.runtime import Runtime
from tests.conftest import Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Agent,
    Console,
    agent,
    config,
    console,
    console_server,
    csrf_of,
    password_hashes,
    settings,
)

DECISION = "/v1/me/requests/{}/decision"


async def _token(console: Console, name: str) -> str:  # noqa: F811
    assert (await console.sign_in(name)).status_code == 303
    page = await console.get("/ui/tokens")
    made = await console.client.post("/ui/tokens", data={"csrf_token": csrf_of(page.text), "days": "7"})
    assert made.status_code == 200, made.text
    return html.unescape(made.text.split('<pre id="new-token"><code>')[1].split("</code>")[0])


@pytest.fixture
async def token(console: Console, console_server: Server) -> str:  # noqa: F811
    return await _token(console, "alice")


async def test_the_same_decision_again_is_200(token: str, agent: Agent) -> None:  # noqa: F811
    rid = await agent.ask("pay_invoice", arguments={"amount": 90000})
    auth = {"Authorization": f"Bearer {token}"}
    first = await agent.client.post(DECISION.format(rid), json={"verdict": "approve"}, headers=auth)
    assert first.status_code == 200, first.text
    again = await agent.client.post(DECISION.format(rid), json={"verdict": "approve"}, headers=auth)
    assert again.status_code == 200, (again.status_code, again.text[:300])
    assert again.json()["status"] == "approved"
    other = await agent.client.post(DECISION.format(rid), json={"verdict": "reject"}, headers=auth)
    assert other.status_code == 409, (other.status_code, other.text[:300])


async def test_a_cancelled_request_is_410(token: str, agent: Agent, runtime: Runtime) -> None:  # noqa: F811
    rid = await agent.ask("pay_invoice", arguments={"amount": 90000})
    assert (await agent.client.post(f"/v1/requests/{rid}/cancel")).status_code == 200
    auth = {"Authorization": f"Bearer {token}"}
    late = await agent.client.post(DECISION.format(rid), json={"verdict": "approve"}, headers=auth)
    assert late.status_code == 410, (late.status_code, late.text[:300])
    assert await agent.status(rid) == "cancelled"
