"""The ntfy channel end to end: the real server publishes each approver a notification on a
fake ntfy server, and the test taps its actions exactly as the phone app does (the ``http``
action's method, URL, headers and body). The callback contract holds on every tap: the same
decision again is 200, a conflicting one after the decision 409 naming the final state and
who, an expired or cancelled request 410."""

from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest
import time_machine
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent, Delivery, OutboxStatus, Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.email import LinkSigner, LinkToken
from tests.channels.fake_ntfy import FakeNtfy, Published
from tests.conftest import ADMIN_TOKEN, Server
from tests.console.conftest import CHEAP, PASSWORDS, Console
from tests.waiting import eventually

PUBLIC = "https://signoff.test"
SECRET = "a-long-random-secret-for-the-tests"
TOKEN = "tk_AgQdq7mVBoFD37zQVN29RhuMzNIz2"
ALICE, BOB, CAROL = "alice-Hk3vQ9xT2m", "bob-Zr8pL4nW6c", "carol-Qe5tY7uJ1b"
TRANSFER = {
    "tool_name": "transfer_funds",
    "arguments": {"to": "acme", "amount": 10, "api_token": "tok-live-5f3a9c1e"},
}
T = TypeVar("T")


def _config(server: str) -> dict[str, Any]:
    def gate(name: str, tools: str, approvers: list[str], **more: Any) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": "phone",
            "approvers": approvers,
            "timeout": "30m",
            **more,
        }

    return {
        "channels": {"phone": {"type": "ntfy", "server": server, "token": TOKEN}},
        "operators": {"alice": {"password_hash": CHEAP.hash(PASSWORDS["alice"]), "person": "alice"}},
        "people": {
            "alice": {"name": "Alice", "ntfy": ALICE},
            "bob": {"name": "Bob", "ntfy": BOB},
            "carol": {"name": "Carol", "ntfy": CAROL},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate("transfers", "transfer_*", ["alice", "bob"]),
                    gate(
                        "two-person",
                        "wire_*",
                        ["alice", "bob", "carol"],
                        quorum=2,
                        require_reject_reason=True,
                    ),
                    gate("short", "quick_*", ["alice"], timeout="1m"),
                    gate(
                        "nudged",
                        "ask_*",
                        ["alice", "bob"],
                        quorum=2,
                        remind=["2s"],
                        escalate=[{"after": "3s", "channel": "phone", "approvers": ["carol"]}],
                    ),
                ]
            }
        },
    }


@pytest.fixture
async def ntfy() -> AsyncIterator[FakeNtfy]:
    fake = FakeNtfy(tokens={TOKEN: {ALICE, BOB, CAROL}})
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


@pytest.fixture
async def phone_server(ntfy: FakeNtfy, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret=SECRET,  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
        sweep_interval_seconds=0.2,
    )
    runtime = Runtime.create(settings, parse_config(_config(ntfy.url), source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def pre(http: httpx.AsyncClient, key: str, body: dict[str, Any] = TRANSFER) -> str:
    answer = await http.post("/v1/hooks/pre-tool-use", json=body, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"] == "pending"
    return str(answer.json()["request_id"])


async def state(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    data: dict[str, Any] = (
        await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})
    ).json()
    return data


async def until(check: Callable[[], Awaitable[T]], timeout: float = 10) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await check()):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s")
        await asyncio.sleep(0.05)
    return value


async def notified(ntfy: FakeNtfy, topic: str, rid: str, count: int = 1) -> list[Published]:
    return await eventually(
        lambda: (found := [p for p in ntfy.to(topic) if rid in p.message["message"]])[count - 1 :] and found
    )


async def tap(http: httpx.AsyncClient, published: Published, label: str) -> httpx.Response:
    """What the ntfy app does when ``label`` is tapped: the http action's request, as is
    (the public address is this test server)."""
    action = published.action(label)
    assert action["action"] == "http"
    assert action["url"].startswith(PUBLIC + "/")
    body = action.get("body")
    return await http.request(
        action["method"],
        action["url"].removeprefix(PUBLIC),
        headers=action.get("headers") or {},
        content=body.encode() if body is not None else b"",
    )


async def deliveries(server: Server, rid: str) -> list[Delivery]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Delivery).where(col(Delivery.request_id) == rid))).all())


async def votes(server: Server, rid: str) -> list[Vote]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


async def trail(server: Server, rid: str) -> list[AuditEvent]:
    async with server.runtime.sessions() as s:
        rows = await s.exec(
            select(AuditEvent).where(col(AuditEvent.request_id) == rid).order_by(col(AuditEvent.seq))
        )
        return list(rows.all())


async def test_each_approver_gets_a_notification_with_the_whole_call_and_its_actions(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    _server, http = phone_server
    rid = await pre(http, agent_key)
    [alice] = await notified(ntfy, ALICE, rid)
    [bob] = await notified(ntfy, BOB, rid)
    assert ntfy.to(CAROL) == []
    # Published as JSON to the root URL, with the channel's access token.
    assert alice.headers["Authorization"] == f"Bearer {TOKEN}"
    assert alice.headers["Content-Type"] == "application/json"
    message = alice.message
    assert message["title"] == "Approve transfer_funds for finance-bot?"
    assert message["priority"] == 4
    text = message["message"]
    for line in (
        "Tool: transfer_funds",
        "Agent: finance-bot",
        '"amount": 10',
        '"to": "acme"',
        f"Request {rid}",
    ):
        assert line in text
    assert '"api_token": "[redacted]"' in text
    assert "tok-live-5f3a9c1e" not in text  # redacted before it is sent
    assert "Time left: 29m" in text or "Time left: 30m" in text
    assert alice.labels == ["Approve", "Reject", "Open"]
    approve, reject, view = alice.action("Approve"), alice.action("Reject"), alice.action("Open")
    assert approve["url"] == reject["url"] == f"{PUBLIC}/callbacks/ntfy/phone"
    assert (approve["method"], approve["clear"]) == ("POST", True)
    assert approve["body"] != bob.action("Approve")["body"]  # a token per person
    assert view == {**view, "action": "view", "url": f"{PUBLIC}/ui/requests/{rid}"}
    assert message["click"] == f"{PUBLIC}/ui/requests/{rid}"
    # The delivery names people and ntfy's message ids, never the topics (they are secrets).
    [post] = await until(lambda: _sent(phone_server[0], rid))
    assert post.message_ref is not None
    assert post.message_ref["recipients"] == "Alice, Bob"
    assert ALICE not in str(post.message_ref)
    assert BOB not in str(post.message_ref)
    assert set(post.message_ref["message_ids"].split()) == {alice.message["id"], bob.message["id"]}


async def _sent(server: Server, rid: str) -> list[Delivery]:
    rows = await deliveries(server, rid)
    return rows if rows and all(d.status == OutboxStatus.SENT for d in rows) else []


async def test_a_tap_decides_as_its_person_and_the_contract_answers_repeats_and_conflicts(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    rid = await pre(http, agent_key)
    [alice] = await notified(ntfy, ALICE, rid)
    [bob] = await notified(ntfy, BOB, rid)
    waiting = asyncio.create_task(
        http.get(f"/v1/requests/{rid}/wait?timeout=20", headers={"Authorization": f"Bearer {agent_key}"})
    )
    done = await tap(http, alice, "Approve")
    assert done.status_code == 200, done.text
    assert done.json() == {
        "answer": "recorded",
        "status": "approved",
        "decided_by": "Alice",
        "message": "Approved once by Alice.",
    }
    assert (await waiting).json()["status"] == "approved"  # the waiting agent is released
    decided = await state(http, agent_key, rid)
    # Alice's topic is her secret: the answer names her by her directory key.
    assert decided["decided_by"] == {"channel": "phone", "user_id": "alice", "name": "Alice"}
    assert ALICE not in str(decided)

    # The app retries, the person taps twice: the decision as it stands.
    for _ in range(2):
        again = await tap(http, alice, "Approve")
        assert again.status_code == 200
        assert again.json()["answer"] == "repeated"
        assert again.json()["message"] == "You already approved this request; it is approved by Alice."
    # Another choice after the decision: 409 naming the final state and who made it.
    for published, label in ((alice, "Reject"), (bob, "Reject"), (bob, "Approve")):
        late = await tap(http, published, label)
        assert late.status_code == 409
        assert late.json()["status"] == "approved"
        assert late.json()["decided_by"] == "Alice"
        assert late.json()["message"] == "This request was already approved by Alice."
    [vote] = await votes(server, rid)
    assert (vote.voter, vote.channel, vote.user_id, vote.identity) == (
        "alice",
        "phone",
        ALICE,
        {"via": "ntfy_link", "link": "approve"},
    )
    actions = [e.action for e in await trail(server, rid)]
    assert actions[:3] == ["created", "vote", "approved"]
    assert actions.count("vote_refused") == 5  # every later tap is audited, none applied
    assert (await state(http, agent_key, rid))["status"] == "approved"


async def test_a_reject_tap_rejects(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    _server, http = phone_server
    rid = await pre(http, agent_key)
    [bob] = await notified(ntfy, BOB, rid)
    done = await tap(http, bob, "Reject")
    assert (done.status_code, done.json()["status"], done.json()["decided_by"]) == (200, "rejected", "Bob")
    [alice] = await notified(ntfy, ALICE, rid)
    late = await tap(http, alice, "Approve")
    assert (late.status_code, late.json()["message"]) == (409, "This request was already rejected by Bob.")


async def test_expired_and_cancelled_requests_answer_410(
    phone_server: tuple[Server, httpx.AsyncClient],
    ntfy: FakeNtfy,
    agent_key: str,
    clock: time_machine.Traveller,
) -> None:
    server, http = phone_server
    quick = await pre(http, agent_key, {"tool_name": "quick_fix", "arguments": {"n": 1}})
    [alice] = await notified(ntfy, ALICE, quick)
    clock.shift(61)  # past the gate's minute (no push is sent for a request already expired)
    await until(lambda: _status(http, agent_key, quick, "expired"))
    for label in ("Approve", "Reject", "Approve"):
        late = await tap(http, alice, label)
        assert late.status_code == 410
        assert (late.json()["answer"], late.json()["status"]) == ("gone", "expired")
        assert late.json()["message"] == "This request has already expired."

    rid = await pre(http, agent_key)
    [alice] = await notified(ntfy, ALICE, rid)
    cancelled = await http.post(
        f"/v1/requests/{rid}/cancel", headers={"Authorization": f"Bearer {agent_key}"}
    )
    assert cancelled.status_code == 200, cancelled.text
    late = await tap(http, alice, "Approve")
    assert late.status_code == 410
    assert (late.json()["answer"], late.json()["status"]) == ("gone", "cancelled")
    assert "cancelled" in late.json()["message"]
    assert await votes(server, rid) == []


async def _status(http: httpx.AsyncClient, key: str, rid: str, wanted: str) -> bool:
    return (await state(http, key, rid))["status"] == wanted


async def test_forged_foreign_and_malformed_tokens_are_refused_and_change_nothing(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    rid = await pre(http, agent_key)
    [alice] = await notified(ntfy, ALICE, rid)
    token = alice.action("Approve")["body"]
    url = "/callbacks/ntfy/phone"
    payload, signature = token.split(".")
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    other_key = LinkSigner(b"another-servers-key-0123456789", PUBLIC)
    forged = other_key.sign(LinkToken(rid, "phone", ALICE, Verdict.APPROVE, 2**40))
    # Bob's topic in a token Signoff signed for another channel: not this channel's.
    elsewhere = server.runtime.links
    assert elsewhere is not None
    foreign = elsewhere.sign(LinkToken(rid, "mail", BOB, Verdict.APPROVE, 2**40))
    for body, code in [
        (f"{payload}.{flipped}", 403),
        (forged, 403),
        (foreign, 403),
        ("not a token", 400),
        ("x" * 5000, 413),
        ("\u00e9".encode().decode("latin-1"), 400),
    ]:
        refused = await http.post(url, content=body.encode("latin-1"), headers={"Content-Type": "text/plain"})
        assert refused.status_code == code, body[:40]
    assert (await http.post("/callbacks/ntfy/nowhere", content=token.encode())).status_code == 404
    assert await votes(server, rid) == []
    assert (await state(http, agent_key, rid))["status"] == "pending"


async def test_rate_limits_and_server_errors_are_retried_by_the_outbox(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    ntfy.rate_limit(1)
    ntfy.fail(1)
    rid = await pre(http, agent_key)
    [_alice] = await notified(ntfy, ALICE, rid)
    [bob] = await notified(ntfy, BOB, rid)
    assert len(ntfy.to(ALICE)) == len(ntfy.to(BOB)) == 1  # nobody notified twice across retries
    [post] = await until(lambda: _sent(server, rid), timeout=20)
    assert post.attempts >= 1
    assert (await tap(http, bob, "Approve")).status_code == 200


async def test_a_refused_token_fails_the_post_and_names_the_fix(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    ntfy.tokens = {"tk_someone_else": {ALICE}}
    rid = await pre(http, agent_key)

    async def failed() -> list[Delivery]:
        rows = await deliveries(server, rid)
        return [d for d in rows if d.kind == "post" and d.status == OutboxStatus.FAILED]

    [post] = await until(failed)
    assert post.last_error is not None
    assert "401 unauthorized" in post.last_error
    assert "give the channel a `token`" in post.last_error
    assert ALICE not in post.last_error  # the error names people, not their topics
    assert await until(lambda: _status(http, agent_key, rid, "cancelled"))


async def test_one_topic_refused_still_notifies_the_others(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    ntfy.tokens = {TOKEN: {BOB}}
    rid = await pre(http, agent_key)
    [bob] = await notified(ntfy, BOB, rid)
    [post] = await until(lambda: _sent(server, rid))
    assert post.message_ref is not None
    assert post.message_ref["recipients"] == "Bob"
    assert ntfy.to(ALICE) == []
    assert (await tap(http, bob, "Approve")).json()["status"] == "approved"


async def test_a_reject_that_needs_a_reason_opens_its_page(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    _server, http = phone_server
    rid = await pre(
        http, agent_key, {"tool_name": "wire_money", "arguments": {"to": "acme", "amount": 90000}}
    )
    [carol] = await notified(ntfy, CAROL, rid)
    assert carol.labels == ["Approve", "Reject…", "Open"]
    assert "Approvals: 0 of 2" in carol.message["message"]
    page_url = carol.action("Reject…")
    assert page_url["action"] == "view"
    path = page_url["url"].removeprefix(PUBLIC)
    assert path.startswith("/approve/")
    shown = await http.get(path)
    assert shown.status_code == 200
    assert "You answer as <strong>Carol</strong>" in shown.text
    token = path.rsplit("/", 1)[1]
    without = await http.post(path, data={"token": token})
    assert without.status_code == 422
    done = await http.post(path, data={"token": token, "reason": "wrong account"})
    assert done.status_code == 200, done.text
    decided = await state(http, agent_key, rid)
    assert (decided["status"], decided["reason"], decided["decided_by"]["name"]) == (
        "rejected",
        "wrong account",
        "Carol",
    )


async def test_reminders_and_escalations_reach_the_phone(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    rid = await pre(http, agent_key, {"tool_name": "ask_budget", "arguments": {"team": "infra"}})
    [alice] = await notified(ntfy, ALICE, rid)
    assert (await tap(http, alice, "Approve")).json()["message"] == "Approval recorded (1 of 2)."
    # Bob has not voted: reminded; Alice has: not again.
    reminded = (await notified(ntfy, BOB, rid, count=2))[1]
    assert reminded.message["title"] == "Reminder: Approve ask_budget for finance-bot?"
    assert reminded.labels == ["Approve", "Reject", "Open"]
    # The escalation brings Carol in, with actions of her own.
    [carol] = await notified(ntfy, CAROL, rid)
    assert len(ntfy.to(ALICE)) == 1
    done = await tap(http, carol, "Approve")
    assert (done.status_code, done.json()["status"]) == (200, "approved")
    actions = [e.action for e in await trail(server, rid)]
    assert "reminded" in actions
    assert "escalated" in actions
    # The repeat of Alice's own approval, now decided by Carol: the decision as it stands.
    again = await tap(http, alice, "Approve")
    assert (again.status_code, again.json()["message"]) == (
        200,
        "You already approved this request; it is approved by Carol.",
    )


async def test_the_console_shows_the_ntfy_deliveries_and_votes(
    phone_server: tuple[Server, httpx.AsyncClient], ntfy: FakeNtfy, agent_key: str
) -> None:
    server, http = phone_server
    rid = await pre(http, agent_key)
    [bob] = await notified(ntfy, BOB, rid)
    await until(lambda: _sent(server, rid))
    assert (await tap(http, bob, "Approve")).status_code == 200
    console = Console(server.url)
    try:
        assert (await console.sign_in("alice")).status_code == 303
        page = (await console.get(f"/ui/requests/{rid}")).text
    finally:
        await console.aclose()
    cards = page.split('id="cards-title"')[1].split("</section>")[0]
    assert '<td data-label="Channel">phone</td>' in cards
    assert '<td data-label="Kind">post</td>' in cards
    assert "delivery-sent" in cards
    assert "Alice, Bob" in html.unescape(cards)
    assert ALICE not in page
    assert BOB not in cards
    assert "Bob" in page.split('id="cards-title"')[0]  # his vote, by name
