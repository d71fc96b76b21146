"""Attacks on the email channel's signed links, through the real server and a local SMTP server:
another spelling or signature of a link, a link for the recipient's own call, an escalation
approver's link before their time, forms of another shape, text no column can hold. None
decides anything it should not, and none is a server error."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from sqlmodel import col, select

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.models import Vote
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.email import LinkSigner, LinkToken
from tests.channels.smtp_server import LocalSmtp
from tests.channels.test_email_flow import PUBLIC, confirm, links, mail_to, token_of
from tests.conftest import ADMIN_TOKEN, Server
from tests.redteam.support import age, agent, ask, attack_config, property_test

PROPERTY = property_test(20)


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
LINK_SECRET = "a-long-random-secret-for-the-email-links"


def _mail_config(smtp_port: int) -> dict[str, Any]:
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
                        grants=[{"scope": "session", "for": "1h"}],
                        escalate=[{"after": "10m", "channel": "mail", "approvers": ["carol"]}],
                    ),
                    gate("wires", "wire_*", ["alice", "bob"], quorum=2, require_reject_reason=True),
                ]
            }
        },
    }


@pytest.fixture
def smtp() -> Iterator[LocalSmtp]:
    with LocalSmtp() as server:
        yield server


@pytest.fixture
async def mail(smtp: LocalSmtp, db_url: str) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    settings = Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        public_url=PUBLIC,
        session_secret=LINK_SECRET,  # type: ignore[arg-type]
        outbox_poll_seconds=0.05,
    )
    runtime = Runtime.create(settings, parse_config(_mail_config(smtp.port), source="signoff.yaml"))
    try:
        async with (
            Server(runtime, background=True) as server,
            httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        ):
            yield server, http
    finally:
        await runtime.aclose()


TRANSFER = {"tool_name": "transfer_funds", "arguments": {"to": "acme", "amount": 10}, "session_id": "s-1"}


async def _votes(server: Server, rid: str) -> list[Vote]:
    async with server.runtime.sessions() as s:
        return list((await s.exec(select(Vote).where(col(Vote.request_id) == rid))).all())


async def _status(http: httpx.AsyncClient, key: str, rid: str) -> dict[str, Any]:
    shown: dict[str, Any] = (await http.get(f"/v1/requests/{rid}", headers=agent(key))).json()
    return shown


@pytest.mark.postgres
async def test_a_link_reason_with_a_nul_character_is_no_server_error(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    """Text no column can hold, typed into the rejection form, is dropped as the console drops
    it; it used to fail the page with a 500."""
    _server, http = mail
    rid = (await ask(http, agent_key, {"tool_name": "wire_money", "arguments": {"amount": 5}}))["request_id"]
    reject = links(await mail_to(smtp, BOB, rid))["Reject"]
    done = await confirm(http, reject, reason="wrong\x00 account")
    assert done.status_code == 200, done.text
    decided = await _status(http, agent_key, rid)
    assert (decided["status"], decided["reason"]) == ("rejected", "wrong account")


def _padded(token: str, at: int, pad: str) -> str:
    payload, signature = token.split(".")
    return f"{payload}{pad}.{signature}" if at == 0 else f"{payload}.{signature}{pad}"


def _standard_alphabet(token: str) -> str:
    return token.replace("-", "+").replace("_", "/")


def _case_swapped(token: str, at: int) -> str:
    return token[:at] + token[at].swapcase() + token[at + 1 :]


def _resigned(token: str, secret: bytes) -> str:
    """The same payload signed under another key (another server, or an old secret)."""
    other = LinkSigner(secret, PUBLIC)
    payload = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    return other.sign(LinkToken.from_payload(payload))


VARIANTS = st.one_of(
    st.builds(lambda at, pad: ("pad", at, pad), st.integers(0, 1), st.sampled_from(["=", "==", "%3D", "."])),
    st.just(("standard", 0, "")),
    st.builds(lambda at: ("case", at, ""), st.integers(0, 400)),
    st.builds(
        lambda extra: ("tail", 0, extra), st.sampled_from(["x", "A", "-", "_", "%20", "\u0410", "%00"])
    ),
    st.builds(lambda extra: ("head", 0, extra), st.sampled_from(["x", "A", "."])),
    st.builds(lambda at: ("cut", at, ""), st.integers(1, 40)),
    st.sampled_from([("old secret", 0, ""), ("other request", 0, ""), ("other channel", 0, "")]),
)


@PROPERTY
@given(variant=VARIANTS)
async def test_no_other_spelling_or_signature_of_a_link_decides(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str, variant: tuple[str, int, str]
) -> None:
    """Padding, the standard base64 alphabet, a letter's case, data before or after, a cut, a
    token signed with another (or an old) secret, one for another request or channel: opening
    it shows no form, confirming it decides nothing."""
    server, http = mail
    rid = (await ask(http, agent_key, {**TRANSFER, "idempotency_key": "the-one"}))["request_id"]
    token = token_of(links(await mail_to(smtp, ALICE, rid))["Approve once"])
    kind, at, extra = variant
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    original = signer.verify(token, now=datetime.now(UTC))
    if kind == "pad":
        changed = _padded(token, at, extra)
    elif kind == "standard":
        changed = _standard_alphabet(token)
    elif kind == "case":
        changed = _case_swapped(token, at % len(token))
    elif kind == "tail":
        changed = token + extra
    elif kind == "head":
        changed = extra + token
    elif kind == "cut":
        changed = token[:-at]
    elif kind == "old secret":
        changed = _resigned(token, b"the-secret-before-it-was-rotated")
    elif kind == "other request":
        changed = signer.sign(LinkToken("0" * 32, "mail", ALICE, Verdict.APPROVE, original.expires_at))
    else:
        changed = signer.sign(LinkToken(rid, "chat", ALICE, Verdict.APPROVE, original.expires_at))
    assume(changed != token)
    shown = await http.get(f"/approve/{changed}")
    assert 400 <= shown.status_code < 500, (changed, shown.status_code)
    assert 'method="post"' not in shown.text
    posted = await http.post(f"/approve/{changed}", data={"token": changed})
    assert 400 <= posted.status_code < 500, (changed, posted.status_code)
    assert await _votes(server, rid) == []
    assert (await _status(http, agent_key, rid))["status"] == "pending"


@pytest.mark.parametrize("requester", [BOB, "BOB@example.com ", "bob", "Bob"])
async def test_a_link_cannot_approve_the_recipients_own_call(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str, requester: str
) -> None:
    server, http = mail
    rid = (await ask(http, agent_key, {**TRANSFER, "user_id": requester}))["request_id"]
    bob = links(await mail_to(smtp, BOB, rid))
    for label in ("Approve once", "Approve for this session (1h)"):
        refused = await confirm(http, bob[label])
        assert refused.status_code == 409, refused.text
        assert "You cannot approve a call made on your own behalf." in refused.text
    assert await _votes(server, rid) == []
    alice = links(await mail_to(smtp, ALICE, rid))
    assert (await confirm(http, alice["Approve once"])).status_code == 200


async def test_an_escalation_approvers_link_counts_only_from_the_escalation(
    mail: tuple[Server, httpx.AsyncClient], agent_key: str
) -> None:
    """A genuine token for Carol, whom the gate adds at 10 minutes, decides nothing before then
    (the page says from when it will), and decides once the time has come."""
    server, http = mail
    rid = (await ask(http, agent_key, TRANSFER))["request_id"]
    signer = server.runtime.links
    assert isinstance(signer, LinkSigner)
    carol = signer.sign(LinkToken(rid, "mail", CAROL, Verdict.APPROVE, int(time.time()) + 1200))
    early = await http.post(f"/approve/{carol}", data={"token": carol})
    assert early.status_code == 409, early.text
    assert "This request is escalated to you at " in early.text
    assert await _votes(server, rid) == []
    await age(server.runtime, rid, timedelta(minutes=11))
    done = await http.post(f"/approve/{carol}", data={"token": carol})
    assert done.status_code == 200, done.text
    assert (await _status(http, agent_key, rid))["decided_by"]["user_id"] == CAROL


async def test_forms_of_another_shape_decide_nothing(
    mail: tuple[Server, httpx.AsyncClient], smtp: LocalSmtp, agent_key: str
) -> None:
    """JSON, a file, too many fields, a body over the limit, plain text: each a 4xx, no vote."""
    server, http = mail
    rid = (await ask(http, agent_key, TRANSFER))["request_id"]
    path = links(await mail_to(smtp, ALICE, rid))["Approve once"]
    token = token_of(path)
    attempts = [
        http.post(path, json={"token": token}),
        http.post(path, data={"token": token}, files={"token": ("token", token.encode())}),
        http.post(path, data={"token": token, **{f"f{i}": "1" for i in range(12)}}),
        http.post(
            path,
            content=f"token={token}&reason={'x' * 70_000}".encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        ),
        http.post(path, content=f"token={token}".encode(), headers={"content-type": "text/plain"}),
        http.put(path, data={"token": token}),
    ]
    for attempt in attempts:
        r = await attempt
        assert 400 <= r.status_code < 500, (
            r.request.headers.get("content-type"),
            r.status_code,
            r.text[:200],
        )
    assert await _votes(server, rid) == []
    assert (await _status(http, agent_key, rid))["status"] == "pending"
