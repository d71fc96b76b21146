"""The email channel end to end: the real server mails each approver
through a local SMTP server, and the links in those messages are opened and confirmed over
HTTP. Opening a link decides nothing; only its page's form does, once, as its recipient."""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
import time_machine
from playwright.async_api import async_playwright, expect
from sqlmodel import col, select

from signoff.app.config import parse_config
from signoff.app.models import AuditEvent, Delivery, OutboxStatus, Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.email import LinkSigner, LinkToken
from tests.channels.smtp_server import LocalSmtp, Received
from tests.conftest import ADMIN_TOKEN, Server
from tests.waiting import eventually

PUBLIC = "https://signoff.test/"
ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
TRANSFER = {
    "tool_name": "transfer_funds",
    "arguments": {"to": "acme", "amount": 10, "api_token": "tok-live-5f3a9c1e"},
    "session_id": "s-1",
}
WIRE = {"tool_name": "wire_money", "arguments": {"to": "acme", "amount": 90000}}
T = TypeVar("T")
_LINK = re.compile(r'<a href="(?P<url>[^"]+)"[^>]*>(?P<label>[^<]+)</a>')


def _config(smtp_port: int) -> dict[str, Any]:
    def gate(name: str, tools: str, approvers: list[str], **more: Any) -> dict[str, Any]:
        return {
            "type": "confirmation_gate",
            "name": name,
            "tools": [tools],
            "channel": "mail",
            "approvers": approvers,
            "timeout": "30m",
            **more,
        }

    return {
        "channels": {
            "mail": {
                "type": "email",
                "smtp_url": f"smtp://127.0.0.1:{smtp_port}?starttls=false",
                "from": "Signoff <signoff@example.com>",
            }
        },
        "people": {
            "alice": {"name": "Alice", "email": ALICE},
            "bob": {"name": "Bob", "email": BOB},
            "carol": {"name": "Carol", "email": CAROL},
        },
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate(
                        "transfers",
                        "transfer_*",
                        ["alice", "bob"],
                        grants=[
                            {"scope": "session", "for": "1h", "same": ["to"]},
                            {"scope": "agent", "for": "30m"},
                        ],
                    ),
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
                        escalate=[{"after": "3s", "channel": "mail", "approvers": ["carol"]}],
                    ),
                ]
            }
        },
    }


@pytest.fixture
def smtp() -> Iterator[LocalSmtp]:
    with LocalSmtp() as server:
        yield server


@pytest.fixture
async def mail_server(smtp: LocalSmtp, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret="a-long-random-secret-for-the-tests",  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
        sweep_interval_seconds=0.2,
    )
    runtime = Runtime.create(settings, parse_config(_config(smtp.port), source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


async def pre(http: httpx.AsyncClient, key: str, body: dict[str, Any] = TRANSFER) -> dict[str, Any]:
    answer = await http.post("/v1/hooks/pre-tool-use", json=body, headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


async def state(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    data: dict[str, Any] = (
        await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {key}"})
    ).json()
    return data


async def mail_to(smtp: LocalSmtp, address: str, rid: str) -> Received:
    [message] = await eventually(
        lambda: [r for r in smtp.to(address) if r.message["X-Signoff-Request"] == rid]
    )
    return message


def links(message: Received) -> dict[str, str]:
    """Label → the path of its link (the public address is not this test server's)."""
    found = {html.unescape(m["label"]): html.unescape(m["url"]) for m in _LINK.finditer(message.part("html"))}
    assert all(url.startswith(PUBLIC.rstrip("/") + "/approve/") for url in found.values())
    return {label: url.removeprefix(PUBLIC.rstrip("/")) for label, url in found.items()}


def token_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


async def confirm(http: httpx.AsyncClient, path: str, **form: str) -> httpx.Response:
    return await http.post(path, data={"token": token_of(path), **form})


async def audit_trail(server: Server) -> list[tuple[str, str | None]]:
    async with server.runtime.sessions() as s:
        rows = await s.exec(select(AuditEvent.action, AuditEvent.request_id).order_by(col(AuditEvent.seq)))
        return [(a, r) for a, r in rows.all()]


async def deliveries(server: Server, rid: str) -> list[Delivery]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Delivery).where(col(Delivery.request_id) == rid))).all())


async def until(check: Callable[[], Awaitable[T]], timeout: float = 10) -> T:
    """Await ``check`` until it returns something truthy, and return that."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s")
        await asyncio.sleep(0.02)
    return value


async def all_sent(server: Server, rid: str) -> list[Delivery]:
    async def check() -> list[Delivery]:
        rows = await deliveries(server, rid)
        return rows if rows and all(d.status == OutboxStatus.SENT for d in rows) else []

    return await until(check)


async def votes(server: Server, rid: str) -> list[Vote]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


async def test_each_approver_gets_one_message_with_the_call_and_a_link_per_choice(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    alice, bob = await mail_to(smtp, ALICE, rid), await mail_to(smtp, BOB, rid)
    expires = (await state(http, agent_key, rid))["expires_at"]
    deadline = f"{expires[:10]} {expires[11:16]} UTC"
    for message, name in ((alice, "Alice"), (bob, "Bob")):
        assert message.message.get_content_type() == "multipart/alternative"
        assert message.message["Subject"] == "Approval needed: finance-bot wants to run transfer_funds"
        assert message.message["From"] == "Signoff <signoff@example.com>"
        for part in (message.part("plain"), message.part("html")):
            assert f"Hello {name}" in part
            assert "finance-bot" in part
            assert "transfer_funds" in part
            assert "acme" in part
            assert "[redacted]" in part
            assert "tok-live-5f3a9c1e" not in part
            assert deadline in part
        assert list(links(message)) == [
            "Approve once",
            "Approve for this session (1h)",
            "Approve for this agent (30m)",
            "Reject",
        ]
        for path in links(message).values():
            assert PUBLIC.rstrip("/") + path in message.part("plain")
    assert set(links(alice).values()).isdisjoint(links(bob).values())
    [post] = [d for d in await all_sent(server, rid) if d.kind == "post"]
    sent_ids = [str(m.message["Message-ID"]).strip() for m in (alice, bob)]
    assert post.message_ref["message_ids"].split() == sent_ids


async def test_opening_every_link_decides_nothing(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    paths = [*links(await mail_to(smtp, ALICE, rid)).values(), *links(await mail_to(smtp, BOB, rid)).values()]
    await all_sent(server, rid)
    before = await audit_trail(server)
    for path in paths:  # as a mail scanner would, twice
        for _ in range(2):
            page = await http.get(path)
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert 'method="post"' in page.text
            assert "nothing is decided until you confirm" in page.text
    assert (await state(http, agent_key, rid))["status"] == "pending"
    assert await audit_trail(server) == before
    assert await votes(server, rid) == []


async def test_confirming_a_link_decides_as_its_recipient_once(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    alice, bob = links(await mail_to(smtp, ALICE, rid)), links(await mail_to(smtp, BOB, rid))
    page = await http.get(alice["Approve once"])
    assert "You answer as <strong>Alice</strong>" in page.text

    done = await confirm(http, alice["Approve once"])
    assert done.status_code == 200
    assert "Approved once by Alice." in done.text
    decided = await state(http, agent_key, rid)
    assert decided["status"] == "approved"
    assert decided["decided_by"] == {"channel": "mail", "user_id": ALICE, "name": "Alice"}
    assert [v["assurance"] for v in decided["votes"]] == ["email_link"]
    waited = await http.get(f"/v1/requests/{rid}/wait", headers={"Authorization": f"Bearer {agent_key}"})
    assert waited.json()["status"] == "approved"

    # The same person's same decision again: the decision as it stands (200); another
    # choice of hers after the decision is a conflict naming the final state and who (409).
    again = await confirm(http, alice["Approve once"])
    assert again.status_code == 200
    assert "You already approved this request; it is approved by Alice." in again.text
    otherwise = await confirm(http, alice["Reject"], reason="no")
    assert otherwise.status_code == 409
    assert "This request was already approved by Alice." in otherwise.text
    for path in bob.values():
        shown = await http.get(path)
        assert shown.status_code == 200
        assert "This request was already approved by Alice." in shown.text
        assert 'method="post"' not in shown.text
        assert (await confirm(http, path)).status_code == 409
    assert (await state(http, agent_key, rid))["decided_by"]["name"] == "Alice"
    # The decision redraws nothing by mail: each approver got one message.
    await all_sent(server, rid)
    assert len([r for r in smtp.received if r.message["X-Signoff-Request"] == rid]) == 2


async def test_a_grant_link_approves_with_its_grant(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    _server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    path = links(await mail_to(smtp, BOB, rid))["Approve for this session (1h)"]
    page = await http.get(path)
    assert "For 1h, finance-bot in this session may run transfer_funds again without asking" in page.text
    done = await confirm(http, path)
    assert done.status_code == 200
    assert "Approved for this session" in done.text
    decided = await state(http, agent_key, rid)
    assert (decided["grant"]["scope"], decided["grant"]["granted_by"]) == ("session", "Bob")
    later = await pre(http, agent_key, {**TRANSFER, "arguments": {"to": "acme", "amount": 99}})
    assert later["decision"] == "allow"
    assert later["grant_id"] == decided["grant"]["id"]
    other = await pre(http, agent_key, {**TRANSFER, "arguments": {"to": "evil", "amount": 99}})
    assert other["decision"] == "pending"


async def test_rejecting_asks_for_the_reason_the_gate_requires(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key, WIRE))["request_id"]
    message = await mail_to(smtp, CAROL, rid)
    assert "A rejection needs a reason" in message.part("plain")
    reject = links(message)["Reject"]
    page = await http.get(reject)
    assert 'name="reason"' in page.text
    assert "Reason (required)" in page.text
    await all_sent(server, rid)
    before = await audit_trail(server)

    blank = await confirm(http, reject, reason="   ")
    assert blank.status_code == 422
    assert "A reason is required to reject this request." in blank.text
    assert (await state(http, agent_key, rid))["status"] == "pending"
    assert await audit_trail(server) == before

    done = await confirm(http, reject, reason="Not this vendor")
    assert done.status_code == 200
    assert "Rejected by Carol." in done.text
    decided = await state(http, agent_key, rid)
    assert (decided["status"], decided["reason"]) == ("rejected", "Not this vendor")
    assert decided["decided_by"]["user_id"] == CAROL


async def test_under_a_quorum_each_recipient_votes_once(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    _server, http = mail_server
    rid = (await pre(http, agent_key, WIRE))["request_id"]
    alice, bob = links(await mail_to(smtp, ALICE, rid)), links(await mail_to(smtp, BOB, rid))
    first = await confirm(http, alice["Approve"])
    assert "Approval recorded (1 of 2)." in first.text
    shown = await http.get(alice["Reject"])
    assert "You already approved this request; it is still waiting for others." in shown.text
    twice = await confirm(http, alice["Reject"], reason="changed my mind")
    assert twice.status_code == 409
    assert "You have already voted on this request." in twice.text
    assert (await state(http, agent_key, rid))["status"] == "pending"
    assert "Approved once by Bob." in (await confirm(http, bob["Approve"])).text
    assert (await state(http, agent_key, rid))["status"] == "approved"


def _changed(token: str, position: int) -> str:
    swap = "B" if token[position] != "B" else "C"
    return token[:position] + swap + token[position + 1 :]


async def test_a_changed_token_is_refused_and_decides_nothing(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    token = token_of(links(await mail_to(smtp, ALICE, rid))["Approve once"])
    dot = token.index(".")
    for position in (0, dot // 2, dot - 1, dot + 1, len(token) - 1):
        changed = _changed(token, position)
        shown = await http.get(f"/approve/{changed}")
        assert shown.status_code in (400, 403), position
        assert "This link is not valid" in shown.text
        posted = await http.post(f"/approve/{changed}", data={"token": changed})
        assert posted.status_code in (400, 403)
    assert (await state(http, agent_key, rid))["status"] == "pending"
    assert await votes(server, rid) == []
    # The first of each kind is on record at once; the window's tally counts all five.
    single = await refused_details(server)
    assert {d["reason"] for d in single} <= {"bad link signature", "malformed link token"}
    assert len(single) == len({d["reason"] for d in single})
    assert all(d["address"] == "127.0.0.1" for d in single)
    await server.runtime.refusals.flush()
    *_, tally = await refused_details(server)
    assert (tally["address"], tally["count"], tally["audited_singly"]) == ("127.0.0.1", 5, len(single))


async def refused_details(server: Server) -> list[dict[str, Any]]:
    async with server.runtime.sessions() as s:
        stmt = select(AuditEvent.detail).where(col(AuditEvent.action) == "callback_rejected")
        return list((await s.exec(stmt.order_by(col(AuditEvent.seq)))).all())


async def test_a_link_works_only_for_its_recipient(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    alice = links(await mail_to(smtp, ALICE, rid))
    bob = links(await mail_to(smtp, BOB, rid))
    # Alice's link with Bob's token in the form: not from that link's page.
    crossed = await http.post(alice["Approve once"], data={"token": token_of(bob["Approve once"])})
    assert crossed.status_code == 400
    missing = await http.post(alice["Approve once"], data={})
    assert missing.status_code == 400
    # A genuine token for someone the gate does not list (Carol approves only wires).
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    expires = int(time.time()) + 600
    carol = signer.sign(LinkToken(rid, "mail", CAROL, Verdict.APPROVE, expires))
    refused = await http.post(f"/approve/{carol}", data={"token": carol})
    assert refused.status_code == 409
    assert "You are not an approver for this request." in refused.text
    assert (await state(http, agent_key, rid))["status"] == "pending"
    assert await votes(server, rid) == []


async def test_an_expired_link_is_refused(
    mail_server: tuple[Server, httpx.AsyncClient],
    smtp: LocalSmtp,
    agent_key: str,
    clock: time_machine.Traveller,
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key, {"tool_name": "quick_fix", "arguments": {}}))["request_id"]
    path = links(await mail_to(smtp, ALICE, rid))["Approve"]
    clock.shift(61)  # past the gate's minute (a mail is not sent for a request already expired)

    async def expired() -> bool:
        return bool((await state(http, agent_key, rid))["status"] == "expired")

    await until(expired)
    shown = await http.get(path)
    assert shown.status_code == 410
    assert "This link has expired" in shown.text
    assert (await confirm(http, path)).status_code == 410
    assert await votes(server, rid) == []

    # A token past its own expiry is refused however the request stands.
    pending = (await pre(http, agent_key))["request_id"]
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    stale = signer.sign(LinkToken(pending, "mail", ALICE, Verdict.APPROVE, int(time.time()) - 1))
    assert (await http.post(f"/approve/{stale}", data={"token": stale})).status_code == 410
    assert (await state(http, agent_key, pending))["status"] == "pending"


async def test_a_server_without_email_links_answers_none(http: httpx.AsyncClient) -> None:
    page = await http.get("/approve/anything.at-all")
    assert page.status_code == 404
    assert "This server does not answer email links." in page.text


@pytest.mark.browser
async def test_a_link_page_works_in_a_browser(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    from tests.console.test_console_browser import CHROMIUM, CHROMIUM_ARGS, Problems, need_chromium

    need_chromium()
    server, http = mail_server
    rid = (await pre(http, agent_key, WIRE))["request_id"]
    reject = links(await mail_to(smtp, CAROL, rid))["Reject"]
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            problems = Problems(page)
            await page.goto(server.url + reject)
            await expect(page.get_by_role("heading", name="Reject")).to_be_visible()
            await page.get_by_label("Reason (required)").fill("Wrong account")
            await page.get_by_role("button", name="Reject").click()
            await expect(page.locator(".flash")).to_have_text("Rejected by Carol.")
            assert problems.seen == []
        finally:
            await browser.close()
    decided = await state(http, agent_key, rid)
    assert (decided["status"], decided["reason"]) == ("rejected", "Wrong account")


async def test_a_decision_elsewhere_leaves_every_link_saying_who_decided(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    server, http = mail_server
    rid = (await pre(http, agent_key))["request_id"]
    alice = links(await mail_to(smtp, ALICE, rid))
    decided = await http.post(
        f"/v1/admin/requests/{rid}/decision",
        json={"verdict": "reject", "operator": "bob", "reason": "duplicate"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert decided.status_code == 200, decided.text
    for path in alice.values():
        shown = await http.get(path)
        assert "This request was already rejected by Bob." in shown.text
        assert 'method="post"' not in shown.text
        refused = await confirm(http, path)
        assert refused.status_code == 409
        assert "This request was already rejected by Bob." in refused.text
    assert (await state(http, agent_key, rid))["decided_by"]["name"] == "Bob"
    assert [v.voter for v in await votes(server, rid)] == ["bob"]


async def test_a_reminder_mails_who_has_not_voted_and_an_escalation_mails_whom_it_adds(
    mail_server: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    """Alice approves at once; at 2 s Bob (only Bob) is reminded with links of his own; at
    3 s the escalation mails Carol, whose link then decides with Alice's vote."""
    server, http = mail_server
    rid = (await pre(http, agent_key, {"tool_name": "ask_budget", "arguments": {"amount": 5}}))["request_id"]
    alice = links(await mail_to(smtp, ALICE, rid))
    await mail_to(smtp, BOB, rid)
    assert (await confirm(http, alice["Approve"])).status_code == 200

    def messages(address: str) -> list[Received]:
        return [r for r in smtp.to(address) if r.message["X-Signoff-Request"] == rid]

    first, reminder = await eventually(lambda: messages(BOB) if len(messages(BOB)) == 2 else None, timeout=20)
    subject = "Waiting on you: Approval needed: finance-bot wants to run ask_budget"
    assert reminder.message["Subject"] == subject
    assert reminder.message["Message-ID"] != first.message["Message-ID"]
    [carol] = await eventually(lambda: messages(CAROL), timeout=20)
    assert carol.message["Subject"].startswith("Waiting on you: ")
    assert len(messages(ALICE)) == 1, "who has voted is not reminded"

    done = await confirm(http, links(carol)["Approve"])
    assert done.status_code == 200, done.text
    decided = await state(http, agent_key, rid)
    assert decided["status"] == "approved"
    actions = [a for a, r in await audit_trail(server) if r == rid]
    assert actions.count("reminded") == 1
    assert actions.count("escalated") == 1


async def test_links_of_an_expired_or_cancelled_request_answer_410(
    mail_server: tuple[Server, httpx.AsyncClient],
    smtp: LocalSmtp,
    agent_key: str,
    clock: time_machine.Traveller,
) -> None:
    server, http = mail_server
    quick = (await pre(http, agent_key, {"tool_name": "quick_fix", "arguments": {}}))["request_id"]
    alice = links(await mail_to(smtp, ALICE, quick))
    clock.shift(61)
    await until(lambda: _status_is(http, agent_key, quick, "expired"))
    late = await confirm(http, alice["Approve"])
    assert late.status_code == 410
    assert "This link has expired" in late.text

    rid = (await pre(http, agent_key))["request_id"]
    alice = links(await mail_to(smtp, ALICE, rid))
    cancelled = await http.post(
        f"/v1/requests/{rid}/cancel", headers={"Authorization": f"Bearer {agent_key}"}
    )
    assert cancelled.status_code == 200
    for label in ("Approve once", "Reject"):
        shown = await http.get(alice[label])
        assert shown.status_code == 410
        assert "This request was already cancelled" in html.unescape(shown.text)
        late = await confirm(http, alice[label], reason="x")
        assert late.status_code == 410
        assert "This request was already cancelled" in html.unescape(late.text)
    assert await votes(server, rid) == []


async def _status_is(http: httpx.AsyncClient, key: str, rid: str, wanted: str) -> bool:
    return (await state(http, key, rid))["status"] == wanted
