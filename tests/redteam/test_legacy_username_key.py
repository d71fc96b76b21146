"""A request pending across the upgrade that records provider-identified votes under their
subject (revision 0016): a vote such an account cast before it is recorded under the old
``web:<username>`` key. Its subject says whose it is; the key, which
repeats a username the account chose, must not make it someone else's."""

from __future__ import annotations

import asyncio
import hashlib
import html

import httpx
import pytest

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import downgrade, migrate
from signoff.app.requests.eligibility import Voter
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


async def _upgrade(runtime: Runtime) -> None:
    """The upgrade from the release before (revision 0015) to this one (0016 re-keys the votes
    of pending requests under their subject)."""
    url = runtime.settings.database_url
    await asyncio.to_thread(downgrade, url, "0015")
    await asyncio.to_thread(migrate, url)


def _legacy_key(self: Voter) -> str:
    """Voter.key in the release before: the username the provider's account chose."""
    return self.person or f"{self.channel}:{self.user_id}"


@pytest.fixture
def config(provider: FakeProvider, password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    body = _body(provider, password_hashes)
    body["operators"][OPS] = {"password_hash": password_hashes["bob"]}  # no person entry
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


async def _mallory_votes_before_the_upgrade(
    browser: Console, idp: FakeProvider, rid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(Voter, "key", property(_legacy_key))
        await _sign_in(browser, idp, MALLORY)
        approved = await browser.decide(rid, "approve")
        assert approved.status_code == 303, approved.text


async def test_a_legacy_username_key_does_not_swallow_an_operators_veto(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rid = await agent.ask("veto_payout", arguments={"to": "x"})
    await _mallory_votes_before_the_upgrade(console, provider, rid, monkeypatch)
    assert await status_of(runtime, rid) == "pending"
    await _upgrade(runtime)  # and Voter.key is the subject's again. The operator vetoes.
    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False, timeout=30) as admin:
        veto = await admin.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "reject", "operator": OPS, "reason": "no"},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    final = await status_of(runtime, rid)
    said = (
        f"operator {OPS}'s rejection answered {veto.status_code} {html.unescape(veto.text)}; request {final}"
    )
    assert veto.status_code == 200, said
    assert final == "rejected", said


async def test_a_legacy_username_key_does_not_swallow_another_provider_accounts_veto(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mallory's (unverified) email claim was chosen to be Dana's key after the upgrade."""
    digest = hashlib.sha256(f"{provider.url}#{DANA.subject}".encode()).hexdigest()[:32]
    mallory = Account("sub-mallory", f"oidc:{digest}", "Mallory", ["payments-leads"], email_verified=False)
    rid = await agent.ask("lead_payout", arguments={"to": "x"})  # group:payments-leads, quorum 2
    with monkeypatch.context() as m:
        m.setattr(Voter, "key", property(_legacy_key))
        await _sign_in(console, provider, mallory)
        assert (await console.decide(rid, "approve")).status_code == 303
    assert await status_of(runtime, rid) == "pending"
    await _upgrade(runtime)
    dana = Console(console_server.url)
    try:
        await _sign_in(dana, provider, DANA)
        veto = await dana.decide(rid, "reject", "no")
        flash = html.unescape((await dana.get(veto.headers["location"])).text)
    finally:
        await dana.client.aclose()
    final = await status_of(runtime, rid)
    why = "already voted" if "already voted" in flash else flash[-300:]
    assert final == "rejected", f"Dana's rejection was not counted ({why}); request {final}"


async def test_a_legacy_vote_and_the_same_subject_are_one_voter(
    console: Console,  # noqa: F811
    provider: FakeProvider,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Holds at HEAD (by subject) and with the fix (by key): Dana approves once."""
    rid = await agent.ask("lead_payout", arguments={"to": "y"})  # quorum 2
    with monkeypatch.context() as m:
        m.setattr(Voter, "key", property(_legacy_key))
        await _sign_in(console, provider, DANA)
        assert (await console.decide(rid, "approve")).status_code == 303
    await _upgrade(runtime)
    await _sign_in(console, provider, DANA)
    await console.decide(rid, "approve")
    assert await status_of(runtime, rid) == "pending"
