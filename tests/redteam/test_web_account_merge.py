"""Someone signed in through the identity provider is one voter by the provider's subject, and
nobody else: an account whose (unverified) email or username repeats a colleague's name or an
operator's never takes that person's vote, a rejection included."""

from __future__ import annotations

import html

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN, Server
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
from tests.console.test_oidc import DANA, _body, _sign_in, provider  # noqa: F401

OPS = "ops@corp.example"
MALLORY = Account("sub-mallory", OPS, "Mallory", ["payments-leads"], email_verified=False)


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    body = _body(provider, password_hashes)
    body["operators"][OPS] = {"password_hash": password_hashes["bob"]}
    body["people"]["oscar"] = {"name": "Oscar", "web": OPS}  # the operator is a person
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "vetoed",
            "tools": ["veto_*"],
            "channel": "web",
            "approvers": ["group:payments-leads", OPS],
            "quorum": 2,
        }
    )
    return parse_config(body, source="console-oidc.yaml")


async def test_an_operators_veto_is_not_swallowed_by_a_provider_account_named_like_them(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    rid = await agent.ask("veto_payout", arguments={"to": "x"})
    await _sign_in(console, provider, MALLORY)
    approved = await console.decide(rid, "approve")
    assert approved.status_code == 303, approved.text
    assert await status_of(runtime, rid) == "pending"

    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False, timeout=30) as admin:
        veto = await admin.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "reject", "operator": OPS, "reason": "no"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    dana = Console(console_server.url)
    try:
        await _sign_in(dana, provider, DANA)
        await dana.decide(rid, "approve")
    finally:
        await dana.client.aclose()
    final = await status_of(runtime, rid)
    answered = f"{veto.status_code} {html.unescape(veto.text)}"
    said = f"operator {OPS}'s rejection answered {answered}; request {final}"
    assert veto.status_code == 200, said
    assert final == "rejected", said


ERIN_SPOOF = Account("sub-mallory2", "erin@example.com", "Mallory", ["payments-leads"], email_verified=False)
"""An insider of the approving group whose email at the provider (never verified) is Erin's."""


async def test_a_group_members_veto_is_not_swallowed_by_an_unverified_copy_of_their_email(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    from tests.console.test_oidc import ERIN

    rid = await agent.ask("lead_payout", arguments={"to": "x"})  # group:payments-leads, quorum 2
    await _sign_in(console, provider, ERIN_SPOOF)
    assert (await console.decide(rid, "approve")).status_code == 303
    assert await status_of(runtime, rid) == "pending"
    erin = Console(console_server.url)
    dana = Console(console_server.url)
    try:
        await _sign_in(erin, provider, ERIN)  # the real Erin (verified; erin of the directory)
        veto = await erin.decide(rid, "reject", "no")
        flash = html.unescape((await erin.get(veto.headers["location"])).text)
        await _sign_in(dana, provider, DANA)
        await dana.decide(rid, "approve")
    finally:
        await erin.client.aclose()
        await dana.client.aclose()
    final = await status_of(runtime, rid)
    why = "already voted" if "already voted" in flash else flash[-300:]
    assert final == "rejected", f"Erin's rejection was not counted ({why}); request {final}"
