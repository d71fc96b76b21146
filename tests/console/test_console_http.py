"""The console over real HTTP (uvicorn on loopback)."""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import sqlalchemy as sa
import time_machine
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.audit import Action
from signoff.app.config import SignoffConfig
from signoff.app.console.auth import SESSION_COOKIE
from signoff.app.db import transaction
from signoff.app.models import (
    AuditEvent,
    ConfirmationRequest,
    ConsoleSessionRevocation,
    Delivery,
    Switch,
    Vote,
    utcnow,
)
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.app.factories import make_request
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import PASSWORDS, SESSION_SECRET, VAULT_SECRET, Agent, Console, csrf_of

ROW = re.compile(r'<tr data-request-id="([0-9a-f]+)"')


def row_ids(page: str) -> list[str]:
    return ROW.findall(page)


def redirect_target(r: httpx.Response) -> tuple[str, dict[str, list[str]]]:
    assert r.status_code == 303, (r.status_code, r.text[:300])
    parts = urlsplit(r.headers["location"])
    return parts.path, parse_qs(parts.query)


async def events_of(runtime: Runtime, rid: str) -> list[AuditEvent]:
    async with runtime.reads() as s:
        return list(
            (
                await s.exec(
                    select(AuditEvent).where(col(AuditEvent.request_id) == rid).order_by(col(AuditEvent.seq))
                )
            ).all()
        )


async def status_of(runtime: Runtime, rid: str) -> str:
    async with runtime.reads() as s:
        req = (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid))).one()
        return str(req.status)


async def backdate(s: AsyncSession, rid: str, age: timedelta, *, expired: bool = False) -> None:
    then = utcnow() - age
    values = {"created_at": then, "expires_at": then} if expired else {"created_at": then}
    await s.exec(sa.update(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid).values(**values))


# --- signing in ----------------------------------------------------------------------------------


async def test_pages_need_a_sign_in(console: Console) -> None:
    for path in ["/ui/", "/ui/history?status=approved", "/ui/audit", "/ui/config", "/ui/requests/abc"]:
        r = await console.get(path)
        where, query = redirect_target(r)
        assert where == "/ui/login"
        assert query["next"] == [path]
        assert "ended" not in query
    assert (await console.get("/ui/history/export.csv")).status_code == 303
    assert (await console.get("/ui/ui")).status_code == 404
    root = await console.get("/ui")
    assert redirect_target(root)[0] == "/ui/"


async def test_sign_in_sets_a_signed_httponly_samesite_cookie_and_sign_out_ends_it(console: Console) -> None:
    login = await console.get("/ui/login?next=/ui/config")
    assert login.status_code == 200
    assert '<label for="username">' in login.text
    assert '<label for="password">' in login.text
    anonymous = login.headers["set-cookie"]
    assert "HttpOnly" in anonymous
    assert "SameSite=lax" in anonymous
    assert "Path=/ui" in anonymous

    r = await console.client.post(
        "/ui/login",
        data={
            "csrf_token": csrf_of(login.text),
            "username": "alice",
            "password": PASSWORDS["alice"],
            "next": "/ui/config",
        },
    )
    assert redirect_target(r)[0] == "/ui/config"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for flag in ("HttpOnly", "SameSite=lax", "Path=/ui", "Max-Age=43"):
        assert flag in cookie, cookie
    assert "alice-correct-horse" not in cookie

    queue = await console.get("/ui/")
    assert queue.status_code == 200
    assert "Alice" in queue.text
    assert "Sign out" in queue.text
    for name, value in {
        "x-frame-options": "DENY",
        "x-content-type-options": "nosniff",
        "cache-control": "no-store",
    }.items():
        assert queue.headers[name] == value
    assert "script-src 'self'" in queue.headers["content-security-policy"]
    # Signed-in visitors skip the form.
    assert redirect_target(await console.get("/ui/login?next=/ui/audit"))[0] == "/ui/audit"

    # A forged cookie (the operator renamed, signature kept) is not a session.
    value = cookie.split(";")[0].split("=", 1)[1]
    forged = Console(str(console.client.base_url))
    try:
        payload, signature = value.rsplit(".", 1)
        body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        assert body["o"] == "alice"
        body["o"] = "bob"
        renamed = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
        forged.client.cookies.set(SESSION_COOKIE, f"{renamed}.{signature}", path="/ui")
        assert (await forged.get("/ui/")).status_code == 303
    finally:
        await forged.aclose()

    out = await console.client.post("/ui/logout", data={"csrf_token": csrf_of(queue.text)})
    assert redirect_target(out)[0] == "/ui/login"
    assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
    assert (await console.get("/ui/")).status_code == 303


@pytest.mark.parametrize(
    ("name", "password"),
    [("alice", "wrong"), ("alice", ""), ("nobody", "whatever"), ("", "x"), ("alice", PASSWORDS["bob"])],
    ids=["wrong-password", "empty-password", "unknown-operator", "no-name", "another-operators-password"],
)
async def test_wrong_password_is_refused(console: Console, name: str, password: str) -> None:
    r = await console.sign_in(name, password)
    assert r.status_code == 401
    assert "Wrong operator name or password." in r.text
    assert SESSION_COOKIE in r.headers.get("set-cookie", "")
    # Still not signed in.
    assert (await console.get("/ui/")).status_code == 303


async def test_repeated_failures_lock_that_name_out_from_that_address(console: Console) -> None:
    for _ in range(5):
        assert (await console.sign_in("alice", "guess")).status_code == 401

    # Locked out: even the right password is not checked now.
    locked = await console.sign_in("alice")
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.text
    assert 0 < int(locked.headers["Retry-After"]) <= 15 * 60
    assert (await console.get("/ui/")).status_code == 303
    # Another operator at the same address is not held responsible for those guesses.
    assert (await console.sign_in("bob")).status_code == 303


async def test_a_stranger_cannot_lock_an_operator_out(console: Console, console_server: Server) -> None:
    stranger = Console(console_server.url, address="127.0.0.2")
    try:
        for _ in range(5):
            assert (await stranger.sign_in("alice", "guess")).status_code == 401
        assert (await stranger.sign_in("alice")).status_code == 429
    finally:
        await stranger.aclose()
    # Alice, from her own address, signs in as ever.
    assert (await console.sign_in("alice")).status_code == 303
    assert (await console.get("/ui/")).status_code == 200


async def test_an_address_guessing_many_names_is_locked_out(console: Console) -> None:
    names = ["alice", "bob", "carol-ops", "mallory", "nobody"]
    for i in range(20):
        assert (await console.sign_in(names[i % len(names)], f"guess-{i}")).status_code == 401
    # Twenty failures from one address: every name is refused there, the right password too.
    assert (await console.sign_in("bob")).status_code == 429
    assert (await console.sign_in("someone-new", "x")).status_code == 429


async def test_signing_out_ends_the_session_everywhere(
    alice: Console, console_server: Server, runtime: Runtime, settings: Settings, config: SignoffConfig
) -> None:
    cookie = alice.client.cookies[SESSION_COOKIE]
    copied = Console(console_server.url)
    copied.client.cookies.set(SESSION_COOKIE, cookie, path="/ui")
    # Another replica: its own process state, the same database and session secret.
    replica_runtime = Runtime.create(settings, config, channels={"chat": FakeChannel("chat")})
    try:
        async with Server(replica_runtime) as replica:
            elsewhere = Console(replica.url)
            elsewhere.client.cookies.set(SESSION_COOKIE, cookie, path="/ui")
            try:
                assert (await copied.get("/ui/")).status_code == 200
                assert (await elsewhere.get("/ui/")).status_code == 200
                token = await copied.form_token("/ui/")

                queue = await alice.get("/ui/")
                out = await alice.client.post("/ui/logout", data={"csrf_token": csrf_of(queue.text)})
                assert redirect_target(out)[0] == "/ui/login"

                # The copy of the cookie is worth nothing now, here and on the other replica.
                for client in (copied, elsewhere):
                    page = await client.get("/ui/")
                    assert page.status_code == 303
                    assert redirect_target(page)[0] == "/ui/login"
                    poll = await client.get("/ui/", headers={"HX-Request": "true"})
                    assert poll.status_code == 401
                flip = await copied.client.post(
                    "/ui/switches/read_only", data={"csrf_token": token, "on": "1"}
                )
                assert flip.status_code == 303
                assert redirect_target(flip)[0] == "/ui/login"
                # Signing out again with the copy changes nothing either.
                again = await copied.client.post("/ui/logout", data={"csrf_token": token})
                assert redirect_target(again)[0] == "/ui/login"
            finally:
                await elsewhere.aclose()
    finally:
        await copied.aclose()
        await replica_runtime.aclose()
    async with runtime.reads() as s:
        ended = (await s.exec(select(ConsoleSessionRevocation.operator))).all()
        switch = (await s.exec(select(Switch.on).where(col(Switch.name) == "read_only"))).first()
    assert list(ended) == ["alice"]
    assert not switch


async def test_a_success_clears_earlier_failures(console: Console) -> None:
    for _ in range(4):
        assert (await console.sign_in("alice", "guess")).status_code == 401
    assert (await console.sign_in("alice")).status_code == 303
    console.client.cookies.clear()  # signed out: the form again
    for _ in range(4):
        assert (await console.sign_in("alice", "guess")).status_code == 401
    assert (await console.sign_in("alice")).status_code == 303


@pytest.mark.parametrize(
    "evil", ["https://evil.example/", "//evil.example/ui", "/v1/admin/config", "/ui\\@evil", "javascript:x"]
)
async def test_next_never_leaves_the_console(console: Console, evil: str) -> None:
    r = await console.sign_in("alice", next_url=evil)
    assert redirect_target(r)[0] == "/ui/", evil
    assert redirect_target(await console.get(f"/ui/login?next={evil}"))[0] == "/ui/"


async def test_missing_or_wrong_csrf_token_is_403(console: Console, agent: Agent, runtime: Runtime) -> None:
    # Sign-in itself needs the token of the visitor's own session.
    login = await console.get("/ui/login")
    for data in [
        {"username": "alice", "password": PASSWORDS["alice"]},
        {"username": "alice", "password": PASSWORDS["alice"], "csrf_token": "0" * 64},
    ]:
        r = await console.client.post("/ui/login", data=data)
        assert r.status_code == 403
        assert "CSRF" in r.text
    stranger = Console(str(console.client.base_url))
    try:
        r = await stranger.client.post(
            "/ui/login",
            data={"username": "alice", "password": PASSWORDS["alice"], "csrf_token": csrf_of(login.text)},
        )
        assert r.status_code == 403, "a token is worthless without its own cookie"
    finally:
        await stranger.aclose()

    assert (await console.sign_in("alice")).status_code == 303
    rid = await agent.ask()
    page = await console.get(f"/ui/requests/{rid}")
    token = csrf_of(page.text)
    for data in [
        {"verdict": "approve", "reason": "no token"},
        {"verdict": "approve", "reason": "empty", "csrf_token": ""},
        {
            "verdict": "approve",
            "reason": "wrong",
            "csrf_token": token[:-1] + ("0" if token[-1] != "0" else "1"),
        },
        {"verdict": "approve", "reason": "pre-sign-in token", "csrf_token": csrf_of(login.text)},
    ]:
        r = await console.client.post(f"/ui/requests/{rid}/decision", data=data)
        assert r.status_code == 403, data
        assert "Form refused" in r.text
    assert (await console.client.post("/ui/logout", data={})).status_code == 403
    # Nothing happened: no vote, no audit event beyond the creation.
    assert await status_of(runtime, rid) == "pending"
    assert [e.action for e in await events_of(runtime, rid)] == ["created"]
    assert (await console.get("/ui/")).status_code == 200, "still signed in"


@pytest.fixture
def short_settings(db_url: str) -> Settings:
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,
        session_secret=SESSION_SECRET,
        session_max_age_seconds=1.5,
    )


@pytest.fixture
async def short_server(short_settings: Settings, runtime: Runtime) -> AsyncIterator[Server]:
    rt = Runtime.create(short_settings, runtime.config, channels={"chat": FakeChannel("chat")})
    try:
        async with Server(rt) as s:
            yield s
    finally:
        await rt.aclose()


async def test_expired_session_goes_back_to_sign_in(
    short_server: Server, runtime: Runtime, clock: time_machine.Traveller
) -> None:
    console = Console(short_server.url)
    try:
        async with runtime.sessions() as s:
            req = await make_request(s, runtime.config)
            await s.commit()
        assert (await console.sign_in("alice")).status_code == 303
        page = await console.get(f"/ui/requests/{req.id}")
        assert page.status_code == 200
        token = csrf_of(page.text)
        cookie = console.client.cookies[SESSION_COOKIE]
        clock.shift(1.7)  # past the session's 1.5 s

        where, _ = redirect_target(await console.get("/ui/"))
        assert where == "/ui/login"
        # The server refuses the cookie itself, not just the browser for dropping it.
        stale = Console(short_server.url)
        try:
            stale.client.cookies.set(SESSION_COOKIE, cookie, path="/ui")
            where, query = redirect_target(await stale.get("/ui/history"))
            assert (where, query["next"], query["ended"]) == ("/ui/login", ["/ui/history"], ["1"])
            assert "Your session has ended" in (await stale.get("/ui/login?ended=1")).text
            r = await stale.client.post(
                f"/ui/requests/{req.id}/decision", data={"csrf_token": token, "verdict": "approve"}
            )
            assert redirect_target(r)[0] == "/ui/login"
        finally:
            await stale.aclose()
        # An open page's poll is told to go to the sign-in page.
        poll = await console.get("/ui/queue/rows", headers={"HX-Request": "true"})
        assert poll.status_code == 401
        assert poll.headers["hx-redirect"].startswith("/ui/login?next=")
        assert poll.headers["hx-redirect"].endswith("&ended=1")
        # A form from before the expiry did nothing.
        assert await status_of(runtime, req.id) == "pending"
    finally:
        await console.aclose()


# --- the queue -----------------------------------------------------------------------------------


async def test_queue_shows_pending_requests_newest_first(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    empty = await alice.get("/ui/")
    assert "Nothing is waiting for a decision." in empty.text

    first = await agent.ask(
        arguments={"amount": 90000, "password": "pw-in-clear", "to": "ACME Ltd"}, user_id="carol"
    )
    second = await agent.ask("wire_money", arguments={"amount": 10, "iban": "DE00"})
    decided = await agent.ask("pay_refund")
    await alice.decide(decided, "approve")

    page = await alice.get("/ui/")
    assert row_ids(page.text) == [second, first], "pending only, newest first"
    text = page.text
    assert "<strong>2</strong> pending" in text
    assert "pay_invoice" in text
    assert "wire_money" in text
    assert "finance-bot" in text
    assert "amount=90000, password=[redacted], to=&#34;ACME Ltd&#34;" in text
    assert "pw-in-clear" not in text
    assert "Carol (carol)" in text, "the requester, by name"
    assert "0 / 2" in text
    assert "0 / 1" in text
    assert re.search(r'data-left="1[78]\d\d\.\d"', text), "about 30 minutes left"
    assert re.search(r">29m \d\ds<", text)

    # The page's poll: 204 while nothing changed, the new table when something did.
    version = re.search(r'hx-get="/ui/queue/rows\?v=([0-9a-f]+)"', text)
    assert version is not None
    same = await alice.get(f"/ui/queue/rows?v={version.group(1)}", headers={"HX-Request": "true"})
    assert same.status_code == 204
    third = await agent.ask("pay_invoice", arguments={"amount": 777777})
    changed = await alice.get(f"/ui/queue/rows?v={version.group(1)}", headers={"HX-Request": "true"})
    assert changed.status_code == 200
    assert row_ids(changed.text) == [third, second, first]
    assert "<html" not in changed.text, "a fragment, not a page"
    # A vote changes the approvals column, and so the version.
    version2 = re.search(r'hx-get="/ui/queue/rows\?v=([0-9a-f]+)"', changed.text)
    assert version2 is not None
    carol = await _as(alice, "carol-ops")
    await carol.decide(second, "approve")
    await carol.aclose()
    after_vote = await alice.get(f"/ui/queue/rows?v={version2.group(1)}")
    assert after_vote.status_code == 200
    assert "1 / 2" in after_vote.text


async def _as(console: Console, operator: str) -> Console:
    other = Console(str(console.client.base_url))
    assert (await other.sign_in(operator)).status_code == 303
    return other


# --- deciding ------------------------------------------------------------------------------------


@pytest.fixture
async def live_server(runtime: Runtime) -> AsyncIterator[Server]:
    """A server with the outbox dispatcher running, to see chat cards follow console decisions."""
    async with Server(runtime, background=True) as s:
        yield s


async def test_approve_from_the_console_updates_the_chat_card(
    live_server: Server, runtime: Runtime, fake_channel: FakeChannel
) -> None:
    console = Console(live_server.url)
    try:
        async with runtime.sessions() as s:
            req = await make_request(s, runtime.config, arguments={"amount": 120000, "api_token": "t0k"})
            await s.commit()
        rid = req.id
        for _ in range(200):
            if fake_channel.posts:
                break
            await asyncio.sleep(0.02)
        assert [c.status for c in fake_channel.cards_for(rid)] == ["pending"]

        assert (await console.sign_in("alice")).status_code == 303
        page = await console.get(f"/ui/requests/{rid}")
        assert page.status_code == 200
        for expected in [
            "pay_invoice",
            "&#34;api_token&#34;: &#34;[redacted]&#34;",
            "payments",  # the gate
            "Alice (alice), Bob (bob)",  # its approvers
            "has(args.amount) &amp;&amp; args.amount &gt;= 50000",  # its condition, from the config
            "Cards sent",
            "fake-1",  # the message reference
            'name="verdict" value="approve"',
            '<label for="reason">',
        ]:
            assert expected in page.text, expected
        assert "t0k" not in page.text

        r = await console.decide(rid, "approve", "invoice matches the PO")
        assert redirect_target(r)[0] == f"/ui/requests/{rid}"
        shown = await console.get(f"/ui/requests/{rid}")
        assert "Approved once by Alice." in shown.text
        assert 'class="badge approved"' in shown.text
        assert "invoice matches the PO" in shown.text
        assert 'name="verdict"' not in shown.text, "no buttons once decided"
        # The flash is shown once.
        assert "Approved once by Alice." not in (await console.get(f"/ui/requests/{rid}")).text

        async with runtime.reads() as s:
            vote = (await s.exec(select(Vote).where(col(Vote.request_id) == rid))).one()
            row = (await s.exec(select(ConfirmationRequest).where(col(ConfirmationRequest.id) == rid))).one()
        assert (vote.channel, vote.user_id, vote.name, vote.verdict) == ("web", "alice", "Alice", "approve")
        assert vote.identity == {"via": "console"}
        assert (row.status, row.decided_by_user_id, row.reason) == (
            "approved",
            "alice",
            "invoice matches the PO",
        )
        assert [e.action for e in await events_of(runtime, rid)] == ["created", "vote", "approved"]

        for _ in range(200):
            if fake_channel.updates:
                break
            await asyncio.sleep(0.02)
        card = fake_channel.cards_for(rid)[-1]
        assert card.status == "approved"
        assert card.decided_by is not None
        assert card.decided_by.name == "Alice"
    finally:
        await console.aclose()


async def test_refused_votes_are_shown_and_audited(alice: Console, agent: Agent, runtime: Runtime) -> None:
    rid = await agent.ask()
    mallory = await _as(alice, "mallory")
    try:
        page = await mallory.get(f"/ui/requests/{rid}")
        assert "You are not one of this gate&#39;s approvers" in page.text
        await mallory.decide(rid, "approve", "let me")
        refused = await mallory.get(f"/ui/requests/{rid}")
        assert 'role="alert">You are not an approver for this request.' in refused.text
        assert "Refused clicks" in refused.text
        assert await status_of(runtime, rid) == "pending"

        await alice.decide(rid, "approve")
        late = await _as(alice, "bob")
        try:
            await late.decide(rid, "reject", "too late")
            late_page = (await late.get(f"/ui/requests/{rid}")).text
            assert "This request was already approved by Alice." in late_page
        finally:
            await late.aclose()
        events = await events_of(runtime, rid)
        assert [e.action for e in events] == ["created", "vote_refused", "vote", "approved", "vote_refused"]
        assert [(e.actor_id, e.detail["identity"]) for e in events if e.action == "vote_refused"] == [
            ("mallory", {"via": "console"}),
            ("bob", {"via": "console"}),
        ]
        # Every refused click is listed with who, what and why.
        final = (await alice.get(f"/ui/requests/{rid}")).text
        refused_section = final.split('id="refused-title"')[1].split("</section>")[0]
        assert "mallory" in refused_section
        assert "Bob" in refused_section
        assert "You are not an approver for this request." in refused_section
        assert "This request was already approved by Alice." in refused_section
    finally:
        await mallory.aclose()


async def test_quorum_and_required_reject_reason(alice: Console, agent: Agent, runtime: Runtime) -> None:
    rid = await agent.ask("wire_money", arguments={"amount": 5})
    await alice.decide(rid, "approve", "one")
    assert "Approval recorded (1 of 2)." in (await alice.get(f"/ui/requests/{rid}")).text
    assert "You have already voted on this request." in (await alice.get(f"/ui/requests/{rid}")).text
    bob = await _as(alice, "bob")
    try:
        await bob.decide(rid, "reject", "   ")
        assert "A reason is required to reject this request." in (await bob.get(f"/ui/requests/{rid}")).text
        await bob.decide(rid, "maybe")
        assert "Choose Approve or Reject." in (await bob.get(f"/ui/requests/{rid}")).text
        await bob.decide(rid, "reject", "x" * 2001)
        assert "too long" in (await bob.get(f"/ui/requests/{rid}")).text
        await bob.decide(rid, "reject", "wrong account")
        assert "Rejected by Bob." in (await bob.get(f"/ui/requests/{rid}")).text
    finally:
        await bob.aclose()
    assert await status_of(runtime, rid) == "rejected"


async def test_unknown_request_is_404(alice: Console) -> None:
    page = await alice.get("/ui/requests/nope")
    assert page.status_code == 404
    assert "There is no request &#39;nope&#39;." in page.text
    token = csrf_of(page.text)
    r = await alice.client.post(
        "/ui/requests/nope/decision", data={"csrf_token": token, "verdict": "approve"}
    )
    assert r.status_code == 404


async def test_request_page_poll_reloads_when_the_status_changes(alice: Console, agent: Agent) -> None:
    rid = await agent.ask()
    page = (await alice.get(f"/ui/requests/{rid}")).text
    m = re.search(r'hx-get="(/ui/requests/[0-9a-f]+/live\?seen=pending&amp;v=[0-9a-f]+)"', page)
    assert m is not None
    live = m.group(1).replace("&amp;", "&")
    assert (await alice.get(live)).status_code == 204
    await alice.decide(rid, "approve")
    r = await alice.get(live)
    assert r.headers["hx-refresh"] == "true"


# --- history and exports -------------------------------------------------------------------------


@pytest.mark.postgres
async def test_history_filters(alice: Console, agent: Agent, runtime: Runtime) -> None:
    paid = await agent.ask("pay_invoice")
    wired = await agent.ask("wire_money", arguments={})
    refund = await agent.ask("pay_refund")
    stale: str
    async with transaction(runtime.sessions) as s:
        stale = (await make_request(s, runtime.config, tool="pay_old")).id
        await backdate(s, stale, timedelta(days=3), expired=True)
    await alice.decide(paid, "approve", "fine")
    bob = await _as(alice, "bob")
    try:
        await bob.decide(refund, "reject", "duplicate")
    finally:
        await bob.aclose()

    async def ids(query: str) -> list[str]:
        r = await alice.get(f"/ui/history?{query}")
        assert r.status_code == 200, r.text
        return row_ids(r.text)

    assert await ids("") == [refund, wired, paid, stale]
    assert await ids("status=approved") == [paid]
    assert await ids("status=rejected") == [refund]
    assert await ids("status=pending") == [wired, stale]
    assert await ids("agent=finance-bot") == [refund, wired, paid, stale]
    assert await ids("agent=other-bot") == []
    assert await ids("tool=PAY_") == [refund, paid, stale], "part of the name, any case"
    assert await ids("tool=wire") == [wired]
    assert await ids("tool=%25") == [], "LIKE wildcards are literal"
    assert await ids("decider=alice") == [paid]
    assert await ids("decider=Bob") == [refund]
    assert await ids("decider=carol") == []
    day = (utcnow() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert await ids(f"from={day}") == [refund, wired, paid]
    assert await ids(f"to={day}") == [stale]
    assert await ids(f"status=pending&to={day}") == [stale]
    three_days_ago = (utcnow() - timedelta(days=3)).strftime("%Y-%m-%d")
    assert await ids(f"from={three_days_ago}&to={three_days_ago}") == [stale], "a date ends with its day"

    page = await alice.get("/ui/history?status=maybe&from=yesterday")
    assert page.status_code == 200
    assert "Unknown status &#39;maybe&#39;." in page.text
    assert "is not a date" in page.text
    assert row_ids(page.text) == [refund, wired, paid, stale]
    # The form keeps what was asked, and the export links carry it.
    page = await alice.get("/ui/history?status=approved&tool=pay")
    assert '<option value="approved" selected>' in page.text
    assert 'href="/ui/history/export.csv?status=approved&amp;tool=pay"' in page.text


@pytest.mark.postgres
async def test_history_pages_by_creation_time(alice: Console, runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        made = []
        for i in range(53):
            req = await make_request(s, runtime.config, arguments={"amount": 60000 + i})
            await backdate(s, req.id, timedelta(minutes=60 - i))
            made.append(req.id)
    first = await alice.get("/ui/history")
    assert row_ids(first.text) == made[::-1][:50]
    m = re.search(r'href="/ui/history\?([^"]+)" rel="next"', first.text)
    assert m is not None
    second = await alice.get("/ui/history?" + m.group(1).replace("&amp;", "&"))
    assert row_ids(second.text) == made[::-1][50:]
    assert 'rel="next"' not in second.text


async def test_csv_and_json_lines_exports(alice: Console, agent: Agent, runtime: Runtime) -> None:
    formula = await agent.ask(arguments={"amount": 90000, "memo": '=HYPERLINK("http://x")'})
    await alice.decide(formula, "approve", "=cmd|' /C calc'!A0")
    async with transaction(runtime.sessions) as s:
        bulk = [(await make_request(s, runtime.config, tool=f"pay_bulk_{i}")).id for i in range(520)]

    r = await alice.get("/ui/history/export.csv")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert re.fullmatch(
        r'attachment; filename="signoff-history-\d{8}T\d{6}Z\.csv"', r.headers["content-disposition"]
    )
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 521, "every request, across batches"
    assert len({row["id"] for row in rows}) == 521
    assert rows[-1]["id"] == formula
    assert {row["id"] for row in rows[:-1]} == set(bulk)
    approved = rows[-1]
    assert approved["status"] == "approved"
    assert approved["decided_by"] == "Alice via web"
    assert approved["reason"] == "'=cmd|' /C calc'!A0", "formulas are defused"
    assert json.loads(approved["arguments"]) == {"amount": 90000, "memo": '=HYPERLINK("http://x")'}
    assert approved["agent"] == "finance-bot"
    assert approved["tool"] == "pay_invoice"
    assert approved["approvals"] == "1"
    assert approved["quorum"] == "1"

    filtered = await alice.get("/ui/history/export.csv?status=approved")
    assert [row["id"] for row in csv.DictReader(io.StringIO(filtered.text))] == [formula]

    r = await alice.get("/ui/history/export.jsonl?tool=bulk_51")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/jsonl")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert sorted(line["tool_name"] for line in lines) == sorted(
        f"pay_bulk_{i}" for i in range(520) if "bulk_51" in f"pay_bulk_{i}"
    )
    everything = await alice.get("/ui/history/export.jsonl")
    lines = [json.loads(line) for line in everything.text.splitlines()]
    assert len(lines) == 521
    last = lines[-1]
    assert last["id"] == formula
    assert last["status"] == "approved"
    assert last["decided_by"] == {"channel": "web", "user_id": "alice", "name": "Alice"}
    assert last["votes"][0]["reason"] == "=cmd|' /C calc'!A0", "JSON needs no defusing"
    assert last["arguments"]["memo"] == '=HYPERLINK("http://x")'

    anonymous = Console(str(alice.client.base_url))
    assert (await anonymous.get("/ui/history/export.jsonl")).status_code == 303
    await anonymous.aclose()


# --- audit and configuration ---------------------------------------------------------------------


async def test_audit_page_shows_events_and_the_chain_status(
    alice: Console, agent: Agent, runtime: Runtime
) -> None:
    rid = await agent.ask()
    await alice.decide(rid, "approve", "ok")
    page = await alice.get("/ui/audit")
    assert page.status_code == 200
    for action in ("key_created", "created", "vote", "approved"):
        assert f'<span class="action">{action}</span>' in page.text
    assert 'hx-get="/ui/audit/verify"' in page.text
    ok = await alice.get("/ui/audit/verify", headers={"HX-Request": "true"})
    assert "Chain intact" in ok.text
    assert "all 4 events verified" in ok.text
    assert "<html" not in ok.text
    assert "Chain intact" in (await alice.get("/ui/audit/verify")).text

    only = await alice.get(f"/ui/audit?request={rid}&action=vote")
    assert only.text.count('<span class="action">') == 1

    async with transaction(runtime.sessions) as s:
        await s.exec(
            sa.update(AuditEvent).where(col(AuditEvent.seq) == 3).values(detail={"reason": "edited later"})
        )
    broken = await alice.get("/ui/audit/verify")
    assert "Chain broken at event 3" in broken.text
    assert "edited" in broken.text


async def test_audit_filter_offers_every_action_the_log_holds(alice: Console) -> None:
    page = await alice.get("/ui/audit")
    offered = re.findall(r'<option value="([a-z_]+)">', page.text)
    assert sorted(offered) == sorted(a.value for a in Action)
    for action in ("callback_rejected", "switch_changed", "tool_call"):
        assert action in offered


async def test_audit_page_pages(alice: Console, runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        for _ in range(60):
            await make_request(s, runtime.config)
    first = await alice.get("/ui/audit")
    seqs = [int(x) for x in re.findall(r'<td data-label="#">(\d+)</td>', first.text)]
    assert seqs == list(range(60, 10, -1))
    m = re.search(r'href="/ui/audit\?before=(\d+)" rel="next"', first.text)
    assert m is not None
    assert m.group(1) == "11"
    second = await alice.get(f"/ui/audit?before={m.group(1)}")
    assert [int(x) for x in re.findall(r'<td data-label="#">(\d+)</td>', second.text)] == list(
        range(10, 0, -1)
    )
    assert 'rel="next"' not in second.text
    assert (await alice.get("/ui/audit?before=0")).status_code == 422


async def test_config_page_masks_secrets(alice: Console, password_hashes: dict[str, str]) -> None:
    page = await alice.get("/ui/config")
    assert page.status_code == 200
    text = page.text
    assert VAULT_SECRET not in text
    assert "********" in text
    assert "console-test.yaml" in text
    for hashed in password_hashes.values():
        assert hashed not in text
        assert hashed.split("$")[-1] not in text
    for expected in [
        "vault",
        "vaulted",
        "chat",
        "Alice",
        "U_ALICE",
        "carol-ops",
        "payments",
        "two-person",
        "pay_*",
    ]:
        assert expected in text, expected
    assert "has(args.amount) &amp;&amp; args.amount &gt;= 50000" in text
    assert "30m" in text
    assert "No gates: every call of this agent is allowed." in text  # other-bot


async def test_static_files_are_served(console: Console) -> None:
    js = await console.get("/ui/static/htmx.min.js")
    assert js.status_code == 200
    assert "htmx" in js.text[:200]
    css = await console.get("/ui/static/console.css")
    assert css.status_code == 200
    assert ":focus-visible" in css.text
    assert (await console.get("/ui/static/console.js")).status_code == 200
    # The console is not part of the API schema.
    schema = (await console.get("/openapi.json")).json()
    assert not [p for p in schema["paths"] if p.startswith("/ui")]


async def test_without_operators_the_sign_in_page_says_how_to_add_them(db_url: str, runtime: Runtime) -> None:
    from signoff.app.config import parse_config
    from tests.conftest import DEFAULT_CONFIG

    rt = Runtime.create(
        runtime.settings, parse_config(DEFAULT_CONFIG), channels={"chat": FakeChannel("chat")}
    )
    try:
        async with Server(rt) as server:
            c = Console(server.url)
            try:
                page = await c.get("/ui/login")
                assert "No operators are configured yet" in page.text
                assert (await c.sign_in("alice", "anything")).status_code == 401
            finally:
                await c.aclose()
    finally:
        await rt.aclose()


async def test_deliveries_show_errors(alice: Console, runtime: Runtime) -> None:
    async with transaction(runtime.sessions) as s:
        req = await make_request(s, runtime.config)
        await s.exec(
            sa.update(Delivery)
            .where(col(Delivery.request_id) == req.id)
            .values(attempts=3, last_error="slack said: channel_not_found")
        )
    page = await alice.get(f"/ui/requests/{req.id}")
    cards = page.text.split('id="cards-title"')[1].split("</section>")[0]
    assert "chat" in cards
    assert "post" in cards
    assert "pending" in cards
    assert "slack said: channel_not_found" in cards
    assert '<td data-label="Attempts">3</td>' in cards


@pytest.mark.postgres
async def test_odd_input_is_never_a_server_error(alice: Console, agent: Agent) -> None:
    await agent.ask()
    for path in [
        "/ui/history?from=9999-12-31&to=9999-12-31",
        "/ui/history?from=0001-01-01T00:00&to=0001-01-01",
        "/ui/history?from=2026-13-45&to=tomorrow&before=yesterday",
        "/ui/history?before=9999-12-31T23:59:59%2B00:00",
        "/ui/history?tool=%25_%5C&agent=" + "a" * 3000 + "&decider=%F0%9F%99%82",
        "/ui/history?status=" + "x" * 600,
        "/ui/history/export.csv?from=9999-12-31&to=9999-12-31",
        "/ui/history/export.jsonl?tool=%00",
        "/ui/history/export.csv?agent=a%00b&before=%00",
        "/ui/history?decider=%00",
        "/ui/audit?action=%00&request=%00",
        "/ui/requests/%00",
        "/ui/audit?before=99999999999999999999",
        "/ui/audit?before=abc&action=" + "y" * 100,
        "/ui/audit?request=%3Cscript%3E",
        "/ui/requests/" + "f" * 300,
        "/ui/requests/%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "/ui/requests/x/live?seen=%3Cb%3E&v=1",
        "/ui/queue/rows?v=" + "z" * 5000,
        "/ui/login?next=" + "n" * 3000,
    ]:
        r = await alice.get(path)
        assert r.status_code < 500, (path, r.status_code, r.text[:300])
        assert "<script>alert" not in r.text, path
    rid = await agent.ask()
    token = await alice.form_token(f"/ui/requests/{rid}")
    for target, data in [
        (rid, {"verdict": "reject", "reason": "nul \x00 inside"}),
        ("%00", {"verdict": "approve"}),
        (rid, {"verdict": "\x00"}),
    ]:
        r = await alice.client.post(f"/ui/requests/{target}/decision", data={"csrf_token": token, **data})
        assert r.status_code < 500, (target, data, r.text[:300])
    assert "nul  inside" in (await alice.get(f"/ui/requests/{rid}")).text


async def test_a_long_queue_shows_the_newest_200_and_counts_them_all(
    alice: Console, runtime: Runtime
) -> None:
    async with transaction(runtime.sessions) as s:
        for _ in range(203):
            await make_request(s, runtime.config)
    page = await alice.get("/ui/")
    assert len(row_ids(page.text)) == 200
    assert "<strong>203</strong> pending (showing the newest 200)" in page.text


async def test_cookies_are_secure_over_https(runtime: Runtime) -> None:
    from signoff.app.main import create_app

    app = create_app(runtime, background=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://console.example") as client:
        login = await client.get("/ui/login")
        assert "Secure" in login.headers["set-cookie"]
        r = await client.post(
            "/ui/login",
            data={"csrf_token": csrf_of(login.text), "username": "bob", "password": PASSWORDS["bob"]},
        )
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert "Secure" in cookie
        assert "HttpOnly" in cookie
