"""A personal token (``SIGNOFF_TOKEN``: the command line deciding as its maker) could only be
revoked by whoever held its text: a stolen console session could mint one for 90 days that
its owner could neither see nor revoke, and no operator either. Each token is now listed to
its owner in the console (id, label, made, expires, last used, never its text) and revoked by
id there (CSRF-protected), and to operators through ``/v1/admin/tokens`` and ``signoff
tokens``; a revoked token, or one the server has no record of, decides nothing."""

from __future__ import annotations

import asyncio
import html
import re

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.console.auth import ConsoleSession, Keys
from signoff.app.models import AuditEvent
from signoff.app.runtime import Runtime
from tests.cli import signoff
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    SESSION_SECRET,
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
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ROW = re.compile(r'<tr data-token-id="([0-9a-f]{16})">')


async def _make(console: Console, label: str = "") -> str:  # noqa: F811
    page = await console.get("/ui/tokens")
    made = await console.client.post(
        "/ui/tokens", data={"csrf_token": csrf_of(page.text), "days": "90", "label": label}
    )
    assert made.status_code == 200, made.text
    return html.unescape(made.text.split('<pre id="new-token"><code>')[1].split("</code>")[0])


async def _listed(console: Console) -> list[str]:  # noqa: F811
    page = await console.get("/ui/tokens")
    assert page.status_code == 200
    return ROW.findall(page.text)


async def _decides(agent: Agent, token: str) -> int:  # noqa: F811
    rid = await agent.ask()
    answer = await agent.client.post(
        DECISION.format(rid),
        json={"verdict": "reject", "reason": "no"},
        headers={"Authorization": f"Bearer {token}"},
    )
    return answer.status_code


async def _signed_in(server: Server, name: str) -> Console:
    other = Console(server.url)
    assert (await other.sign_in(name)).status_code == 303
    return other


@pytest.mark.postgres
async def test_a_token_minted_with_a_stolen_session_is_seen_and_revoked_by_its_owner(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    thief = Console(console_server.url)
    alice = await _signed_in(console_server, "alice")  # her own browser, signed in apart
    try:
        thief.client.cookies.set(
            "signoff_session", str(console.client.cookies.get("signoff_session")), path="/ui"
        )
        stolen = await _make(thief, "not mine")
        assert await _decides(agent, stolen) == 200
        page = (await alice.get("/ui/tokens")).text
        [tid] = ROW.findall(page)
        assert "not mine" in page  # its label, and when it was made, expires, was last used
        assert "never" not in page.split(f'data-token-id="{tid}"')[1].split("</tr>")[0]
        assert stolen not in page
        assert stolen.removeprefix("sop_") not in page
        # Revoking it needs her session's CSRF token.
        refused = await alice.client.post(f"/ui/tokens/{tid}/revoke", data={})
        assert refused.status_code in (400, 403), refused.status_code
        assert await _decides(agent, stolen) == 200
        done = await alice.client.post(f"/ui/tokens/{tid}/revoke", data={"csrf_token": csrf_of(page)})
        assert done.status_code == 303
        assert await _decides(agent, stolen) == 401
        shown = (await alice.get("/ui/tokens")).text
        assert "revoked by Alice" in shown.split(f'data-token-id="{tid}"')[1].split("</tr>")[0]
    finally:
        await thief.aclose()
        await alice.aclose()
    async with runtime.reads() as s:
        revoked = (await s.exec(select(AuditEvent).where(col(AuditEvent.action) == "token_revoked"))).all()
    assert [e.detail["token"] for e in revoked] == [tid]


async def test_another_persons_token_is_neither_listed_nor_revoked_by_them(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    agent: Agent,  # noqa: F811
) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    hers = await _make(console, "alice's laptop")
    [tid] = await _listed(console)
    bob = await _signed_in(console_server, "bob")
    try:
        assert await _listed(bob) == []
        page = (await bob.get("/ui/tokens")).text
        assert "alice&#39;s laptop" not in page
        assert "laptop" not in page
        tried = await bob.client.post(f"/ui/tokens/{tid}/revoke", data={"csrf_token": csrf_of(page)})
        assert tried.status_code == 303
        assert "no token" in html.unescape((await bob.get("/ui/tokens")).text)
        by_text = await bob.client.post(
            "/ui/tokens/revoke", data={"csrf_token": csrf_of(page), "token": hers}
        )
        assert by_text.status_code == 303
    finally:
        await bob.aclose()
    assert await _decides(agent, hers) == 200
    # Nor with anything but the admin token through the operator API.
    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False) as http:
        for headers in (
            {},
            {"Authorization": f"Bearer {hers}"},
            {"Authorization": agent.client.headers["Authorization"]},
        ):
            assert (await http.get("/v1/admin/tokens", headers=headers)).status_code in (401, 403)
            assert (await http.delete(f"/v1/admin/tokens/{tid}", headers=headers)).status_code in (401, 403)
    assert await _decides(agent, hers) == 200


@pytest.mark.postgres
async def test_an_operator_lists_and_revokes_anyones_tokens_through_the_api_and_the_cli(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    agent: Agent,  # noqa: F811
    db_url: str,
) -> None:
    assert (await console.sign_in("alice")).status_code == 303
    first, second = await _make(console, "laptop"), await _make(console)
    assert await _decides(agent, first) == 200
    async with httpx.AsyncClient(base_url=console_server.url, trust_env=False) as http:
        listed = (await http.get("/v1/admin/tokens?person=alice", headers=ADMIN)).json()
        assert [t["label"] for t in listed] == [None, "laptop"]  # newest first
        assert all(t["person"] == "alice" and t["active"] for t in listed)
        assert listed[1]["last_used_at"] is not None
        assert listed[0]["last_used_at"] is None
        assert first not in str(listed)
        assert (await http.get("/v1/admin/tokens?person=bob", headers=ADMIN)).json() == []
        gone = await http.delete(f"/v1/admin/tokens/{listed[1]['id']}?operator=carol", headers=ADMIN)
        assert gone.status_code == 200, gone.text
        assert (gone.json()["active"], gone.json()["revoked_by"]) == (False, "carol")
        again = await http.delete(f"/v1/admin/tokens/{listed[1]['id']}", headers=ADMIN)
        assert again.status_code == 409
        assert (await http.delete("/v1/admin/tokens/0000000000000000", headers=ADMIN)).status_code == 404
        assert await _decides(agent, first) == 401
        assert await _decides(agent, second) == 200
        live = (await http.get("/v1/admin/tokens?active=true", headers=ADMIN)).json()
        assert [t["id"] for t in live] == [listed[0]["id"]]

        env = {"PATH": "/usr/bin:/bin", "SIGNOFF_DATABASE_URL": db_url}
        shown = await asyncio.to_thread(signoff, "tokens", "list", env=env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0].startswith(f"{listed[0]['id']}  alice")
        assert len(shown.stdout.splitlines()) == 1
        everything = await asyncio.to_thread(signoff, "tokens", "list", "--all", "--person", "alice", env=env)
        assert len(everything.stdout.splitlines()) == 2
        assert second not in everything.stdout
        done = await asyncio.to_thread(signoff, "tokens", "revoke", listed[0]["id"], "--as", "carol", env=env)
        assert (done.returncode, done.stdout.strip()) == (0, f"revoked token {listed[0]['id']}")
        twice = await asyncio.to_thread(signoff, "tokens", "revoke", listed[0]["id"], env=env)
        assert twice.returncode != 0
        assert "already revoked" in twice.stderr
        assert await _decides(agent, second) == 401


async def test_a_token_the_server_has_no_record_of_decides_nothing(
    console: Console,  # noqa: F811
    agent: Agent,  # noqa: F811
) -> None:
    """A token made before tokens were recorded (or its row forgotten) could be neither listed
    nor revoked: it is refused, though its signature holds."""
    assert (await console.sign_in("alice")).status_code == 303
    made = await _make(console)
    cookie = Keys(SESSION_SECRET, max_age=3600).decode(str(console.client.cookies.get("signoff_session")))
    assert cookie is not None
    unrecorded = ConsoleSession.start(86400, operator=cookie.operator, fingerprint=cookie.fingerprint)
    text = Keys(SESSION_SECRET, max_age=3600).encode_token(unrecorded)
    assert await _decides(agent, made) == 200
    assert await _decides(agent, text) == 401
