"""Someone signed in through the identity provider is one person by the provider's subject.

For a ``group:`` approver outside the directory, the username claim (the email by default) is
a value the person can often change at the provider; the subject (``sub``) is the one it
promises never changes. One member of the group signing in before and after changing their
email is one voter, and a grant they give never covers a call made for their subject."""

from __future__ import annotations

import json

import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Agent,
    Console,
    agent,
    console,
    console_server,
    password_hashes,
    settings,
)
from tests.console.fake_oidc import Account, FakeProvider
from tests.console.test_console_http import status_of
from tests.console.test_oidc import (  # noqa: F401  (fixtures)
    DANA,
    _body,
    _flash_after,
    _sign_in,
    _votes,
    config,
    provider,
    second,
)

DANA_RENAMED = Account("sub-dana", "dana.liu@example.com", "Dana", ["payments-leads"])
"""Dana again (the same subject at the same provider) after changing her email there."""


async def test_one_group_member_meets_a_quorum_of_two_under_two_emails(
    console: Console,  # noqa: F811
    second: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask("lead_payout", arguments={"to": "x"})
    await _sign_in(console, provider, DANA)
    assert "Approval recorded (1 of 2)." in await _flash_after(console, rid)
    await _sign_in(second, provider, DANA_RENAMED)
    flash = await _flash_after(second, rid)
    votes = await _votes(runtime, rid)
    subjects = {v.identity.get("subject") for v in votes}
    assert await status_of(runtime, rid) == "pending", (
        f"approved by {len(subjects)} subject(s) {sorted(subjects)}; vote keys {[v.voter for v in votes]}"
    )
    assert "already voted" in flash


# --- a grant from an OIDC approver and a call made on her behalf ---------------------------------


@pytest.fixture
def grant_config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    body = _body(provider, password_hashes)
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "lead-grant",
            "tools": ["grant_*"],
            "channel": "web",
            "approvers": ["group:payments-leads"],
            "grants": [{"scope": "agent", "for": "1h"}],
        }
    )
    return parse_config(body, source="console-oidc.yaml")


@pytest.fixture
def config(grant_config: SignoffConfig) -> SignoffConfig:  # noqa: F811
    return grant_config


async def test_a_grant_from_an_oidc_approver_does_not_cover_a_call_made_for_her_subject(
    console: Console,  # noqa: F811
    second: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    # Asked directly, Dana may not approve a call made for her provider subject.
    own = await agent.ask("grant_payout", arguments={"to": "x"}, user_id="sub-dana")
    await _sign_in(console, provider, DANA)
    assert "You cannot approve a call made on your own behalf." in await _flash_after(console, own)

    # She approves someone else's call with the agent-wide grant the gate offers…
    rid = await agent.ask("grant_payout", arguments={"to": "y"}, user_id="U_BOB")
    token = await console.form_token(f"/ui/requests/{rid}")
    answer = await console.client.post(
        f"/ui/requests/{rid}/decision",
        data={
            "csrf_token": token,
            "verdict": "approve",
            "reason": "",
            "grant": json.dumps({"scope": "agent", "seconds": 3600, "same": []}),
        },
    )
    assert answer.status_code == 303, answer.text
    assert await status_of(runtime, rid) == "approved"

    # …and the grant then answers a call made on her own behalf, which she could not approve.
    again = await agent.client.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": "grant_payout", "arguments": {"to": "z"}, "user_id": "sub-dana"},
    )
    assert again.json()["decision"] != "allow", again.json()
