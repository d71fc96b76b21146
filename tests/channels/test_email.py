"""The email channel on its own: its configuration, the link tokens, the message, and the SMTP
exchange with a real server on loopback (replies 4xx and 5xx, logins, TLS)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from signoff.app.config import ConfigError, parse_config
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import (
    CallbackRejected,
    Card,
    GrantChoice,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
    Verdict,
)
from signoff.channels.email import EmailChannel, EmailConfig, LinkSigner, LinkToken, SmtpServer
from signoff.channels.email._channel import delivery_error
from tests.channels.smtp_server import LocalSmtp, self_signed
from tests.conftest import free_port

NOW = datetime(2026, 5, 1, 11, 0, tzinfo=UTC)
KEY = b"k" * 32
SIGNER = LinkSigner(KEY, "https://signoff.example.com/")
TOKEN = LinkToken(
    "req-1", "mail", "alice@example.com", Verdict.APPROVE, int((NOW + timedelta(minutes=30)).timestamp())
)


def card(**changes: Any) -> Card:
    base: dict[str, Any] = {
        "request_id": "req-1",
        "agent_id": "finance-bot",
        "tool_name": "transfer_funds",
        "arguments": {"to": "acme", "amount": 90000, "api_token": "[redacted]"},
        "status": "pending",
        "created_at": NOW,
        "expires_at": NOW + timedelta(minutes=30),
        "quorum": 1,
        "approvers": (Person("Alice", "alice@example.com"), Person("Bob", "bob@example.com")),
        "grants": (GrantChoice("session", 3600, ("to",)),),
    }
    return Card(**{**base, **changes})


def email_config(url: str, **extra: Any) -> EmailConfig:
    return EmailConfig.model_validate(
        {"type": "email", "smtp_url": url, "from": "signoff@example.com", **extra}
    )


# --- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "implicit", "starttls", "user", "password"),
    [
        ("smtps://u:p@mail.example.com", "mail.example.com", 465, True, False, "u", "p"),
        ("smtp://u:p@mail.example.com", "mail.example.com", 587, False, True, "u", "p"),
        ("smtp://mail.example.com:2525?starttls=true", "mail.example.com", 2525, False, True, None, None),
        ("smtp://relay:25?starttls=false", "relay", 25, False, False, None, None),
        ("smtp://me%40example.com:p%2Fw%40rd@mail:587", "mail", 587, False, True, "me@example.com", "p/w@rd"),
    ],
)
def test_an_smtp_url_says_host_port_tls_and_login(
    url: str, host: str, port: int, implicit: bool, starttls: bool, user: str | None, password: str | None
) -> None:
    server = SmtpServer.parse(url)
    assert (server.host, server.port, server.implicit_tls, server.starttls) == (
        host,
        port,
        implicit,
        starttls,
    )
    assert (server.username, server.password) == (user, password)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://mail.example.com", "must start with smtp://"),
        ("smtp://", "must name the mail server's host"),
        ("smtp://mail:99999", "port"),
        ("smtp://mail/path", "no path"),
        ("smtp://mail?tls=1", "unknown options tls"),
        ("smtp://mail?starttls=maybe", "starttls is true or false"),
        ("smtps://mail?starttls=true", "smtps:// is TLS from the start"),
        ("smtp://mail?ca_file=/nonexistent/ca.pem", "not a readable file"),
    ],
)
def test_a_wrong_smtp_url_is_refused_without_echoing_it(url: str, says: str) -> None:
    url = url.replace("://mail", "://user:hunter2@mail", 1)
    raw = {"channels": {"mail": {"type": "email", "smtp_url": url, "from": "signoff@example.com"}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="signoff.yaml")
    [problem] = caught.value.problems
    assert problem.startswith("signoff.yaml: channels.mail.smtp_url: ")
    assert says in problem
    assert "hunter2" not in problem


def test_the_sender_must_be_an_address() -> None:
    assert (
        email_config("smtp://mail", **{"from": "Signoff <signoff@example.com>"}).sender_domain
        == "example.com"
    )
    for bad in ("signoff", "a@b", "x@example.com\r\nBcc: y@example.com", ""):
        with pytest.raises(ValidationError, match="must be an email address"):
            email_config("smtp://mail", **{"from": bad})


def test_the_operator_view_of_the_channel_hides_the_smtp_password() -> None:
    import json

    from signoff.app.queries import masked_channels

    raw = {
        "channels": {"mail": {"type": "email", "smtp_url": "smtps://u:hunter2@mail", "from": "s@example.com"}}
    }
    shown = masked_channels(parse_config(raw))["mail"]
    assert (shown["type"], shown["from"]) == ("email", "s@example.com")
    assert "hunter2" not in json.dumps(shown, default=str)


def test_plain_smtp_to_another_host_is_warned_about() -> None:
    assert email_config("smtp://127.0.0.1:25?starttls=false").warnings() == []
    assert email_config("smtps://u:p@mail.example.com").warnings() == []
    [warning] = email_config("smtp://u:p@relay.example.com:25?starttls=false").warnings()
    assert "sends the password and the approval links unencrypted to relay.example.com" in warning


def _raw(approvers: list[str], people: dict[str, Any]) -> dict[str, Any]:
    return {
        "channels": {
            "mail": {"type": "email", "smtp_url": "smtps://u:p@mail.example.com", "from": "s@example.com"}
        },
        "people": people,
        "agents": {
            "bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "tools": ["pay_*"],
                        "channel": "mail",
                        "approvers": approvers,
                        "timeout": "30m",
                    }
                ]
            }
        },
    }


def test_config_check_names_an_email_approver_without_an_address_and_the_fix() -> None:
    people = {
        "alice": {"name": "Alice", "email": "alice@example.com"},
        "bob": {"name": "Bob", "slack": "U0BOB"},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(["alice", "bob"], people), source="signoff.yaml")
    assert caught.value.problems == [
        "signoff.yaml: agents.bot.hooks[0].approvers[1]: 'bob' has no email in people, so the email "
        "channel 'mail' cannot reach them; add `email: <address>` to people.bob"
    ]


def test_config_check_wants_the_approvers_of_an_email_gate_listed() -> None:
    with pytest.raises(
        ConfigError, match=r"approvers: the email channel 'mail' sends each approver a message"
    ):
        parse_config(_raw([], {}), source="signoff.yaml")
    with pytest.raises(ConfigError, match=r"'not-an-address' is neither in people nor an email user id"):
        parse_config(_raw(["not-an-address"], {}), source="signoff.yaml")


def test_people_are_known_on_an_email_channel_by_their_address() -> None:
    config = parse_config(_raw(["alice", "dana@example.com"], {"alice": {"email": "Alice@Example.com"}}))
    assert config.person_for("email", "alice@example.com") == "alice"
    assert config.channel_id_of("alice", "email") == "Alice@Example.com"


def test_the_command_line_config_check_prints_the_problem(tmp_path: Path) -> None:
    file = tmp_path / "signoff.yaml"
    file.write_text(yaml.safe_dump(_raw(["carol"], {"carol": {"name": "Carol"}})), encoding="utf-8")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("signoff")), "config", "check", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "'carol' has no email in people" in done.stderr
    assert "add `email: <address>` to people.carol" in done.stderr


def test_a_server_with_an_email_channel_needs_a_public_url_and_a_secret() -> None:
    config = parse_config(_raw(["dana@example.com"], {}), source="signoff.yaml")
    bare = Settings(database_url="sqlite+aiosqlite:///:memory:")
    with pytest.raises(ConfigError, match="SIGNOFF_PUBLIC_URL and SIGNOFF_SESSION_SECRET"):
        Runtime.create(bare, config)
    with pytest.raises(ValidationError, match="SIGNOFF_SESSION_SECRET is a placeholder"):
        Settings(session_secret="changeme")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="SIGNOFF_PUBLIC_URL must be the server's http"):
        Settings(public_url="signoff.example.com")


async def test_a_reload_that_adds_an_email_channel_without_link_settings_changes_nothing(
    tmp_path: Path,
) -> None:
    runtime = Runtime.create(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"), parse_config({})
    )
    try:
        file = tmp_path / "signoff.yaml"
        file.write_text(yaml.safe_dump(_raw(["dana@example.com"], {})), encoding="utf-8")
        outcome = await runtime.reload(file)
        assert not outcome.ok
        assert "email links need SIGNOFF_PUBLIC_URL and SIGNOFF_SESSION_SECRET" in outcome.problems[0]
        assert "mail" not in runtime.channels
    finally:
        await runtime.aclose()


# --- link tokens -----------------------------------------------------------------------------------


def test_a_token_round_trips_and_its_url_uses_the_public_address() -> None:
    granted = LinkToken(**{**_fields(TOKEN), "grant": GrantChoice("agent", 1800)})
    for token in (TOKEN, granted):
        text = SIGNER.sign(token)
        assert SIGNER.verify(text, now=NOW) == token
        assert SIGNER.url(token) == f"https://signoff.example.com/approve/{text}"
    assert granted.choice == "grant"


def _fields(token: LinkToken) -> dict[str, Any]:
    return {s: getattr(token, s) for s in LinkToken.__slots__}


def test_a_token_stops_at_its_expiry() -> None:
    text = SIGNER.sign(TOKEN)
    SIGNER.verify(text, now=datetime.fromtimestamp(TOKEN.expires_at - 1, UTC))
    with pytest.raises(CallbackRejected, match="link expired"):
        SIGNER.verify(text, now=datetime.fromtimestamp(TOKEN.expires_at, UTC))


def test_a_token_of_another_key_is_refused() -> None:
    other = LinkSigner(b"o" * 32, "https://signoff.example.com")
    with pytest.raises(CallbackRejected, match="bad link signature"):
        SIGNER.verify(other.sign(TOKEN), now=NOW)


@given(recipient=st.text(min_size=8, max_size=64))
def test_a_sealed_recipient_round_trips_and_cannot_be_read_from_the_token(recipient: str) -> None:
    token = LinkToken(**{**_fields(TOKEN), "recipient": recipient})
    text = SIGNER.sign(token, seal_recipient=True)
    assert SIGNER.verify(text, now=NOW) == token
    payload = text.split(".")[0]
    shown = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert list(shown[3]) == ["sealed"], "the recipient is in the token as it is"
    assert recipient.encode() not in base64.urlsafe_b64decode(shown[3]["sealed"] + "==")
    assert recipient not in text
    assert SIGNER.sign(token, seal_recipient=True) != text  # a fresh nonce each time


@pytest.mark.parametrize("sealed", [{"sealed": "AAAA"}, {"sealed": 5}, {"sealed": "x", "y": 1}, {}])
def test_a_signed_token_whose_sealed_recipient_does_not_open_is_refused(sealed: object) -> None:
    data = TOKEN.payload()
    data[3] = sealed
    payload = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
    text = f"{payload}.{SIGNER._signature(payload)}"
    with pytest.raises(CallbackRejected, match="unreadable link token"):
        SIGNER.verify(text, now=NOW)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_any_change_to_a_token_refuses_it(data: st.DataObject) -> None:
    recipient = data.draw(st.sampled_from(["alice@example.com", "bob@example.com"]))
    verdict = data.draw(st.sampled_from(list(Verdict)))
    text = SIGNER.sign(LinkToken(**{**_fields(TOKEN), "recipient": recipient, "verdict": verdict}))
    raw = bytearray(text.encode())
    position = data.draw(st.integers(0, len(raw) - 1))
    replacement = data.draw(st.integers(0, 255).filter(lambda b: b != raw[position]))
    raw[position] = replacement
    changed = raw.decode("latin-1")
    with pytest.raises(CallbackRejected):
        SIGNER.verify(changed, now=NOW)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(1, 80), extra=st.text(min_size=1, max_size=5))
def test_a_cut_or_lengthened_token_is_refused(cut: int, extra: str) -> None:
    text = SIGNER.sign(TOKEN)
    for changed in (text[:-cut], text + extra, extra + text, text.replace(".", extra, 1)):
        if changed != text:
            with pytest.raises(CallbackRejected):
                SIGNER.verify(changed, now=NOW)


# --- the message -----------------------------------------------------------------------------------


def _channel(url: str = "smtp://127.0.0.1:1?starttls=false") -> EmailChannel:
    return EmailChannel("mail", email_config(url), SIGNER)


def test_the_message_has_text_and_html_with_a_link_per_choice() -> None:
    from signoff.channels.email import render_message

    channel = _channel()
    choices = channel.choices(card(), "alice@example.com")
    assert [c.label for c in choices] == ["Approve once", "Approve for this session (1h)", "Reject"]
    tokens = [SIGNER.verify(c.url.rsplit("/", 1)[1], now=NOW) for c in choices]
    assert [t.choice for t in tokens] == ["approve", "grant", "reject"]
    assert {t.recipient for t in tokens} == {"alice@example.com"}
    assert tokens[1].grant == GrantChoice("session", 3600, ("to",))
    msg = render_message(
        card(),
        sender="signoff@example.com",
        recipient=Person("Alice", "alice@example.com"),
        address="alice@example.com",
        choices=choices,
        message_id="<x@example.com>",
        now=NOW,
    )
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    html = msg.get_body(preferencelist=("html",)).get_content()  # type: ignore[union-attr]
    for part in (text, html):
        assert "finance-bot" in part
        assert "transfer_funds" in part
        assert "2026-05-01 11:30 UTC" in part
        assert "[redacted]" in part
    for choice in choices:
        assert choice.url in text
        assert f'href="{choice.url}"' in html
    assert "For 1h, finance-bot in this session may run transfer_funds again" in text


def test_the_html_is_well_formed_markup() -> None:
    from html.parser import HTMLParser

    from signoff.channels.email import render_html

    names: set[str] = set()

    class Attributes(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names.update(name for name, _ in attrs)

    Attributes().feed(render_html(card(), Person("Alice"), _channel().choices(card(), "alice@example.com")))
    # A quote inside a style attribute would end it early and leave stray attributes behind.
    assert names <= {"href", "style", "lang", "charset", "name", "content", "role"}


def test_what_an_agent_sends_cannot_inject_markup_or_headers() -> None:
    from signoff.channels.email import render_html, subject_of

    evil = card(tool_name="pay\r\nBcc: all@example.com", agent_id="<script>alert(1)</script>")
    assert "\n" not in subject_of(evil)
    assert "\r" not in subject_of(evil)
    html = render_html(evil, Person("Alice"), _channel().choices(evil, "alice@example.com"))
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


# --- SMTP ------------------------------------------------------------------------------------------


async def test_post_sends_each_approver_one_message_and_records_the_message_ids() -> None:
    with LocalSmtp() as smtp:
        channel = _channel(f"smtp://127.0.0.1:{smtp.port}?starttls=false")
        ref = await channel.post(card())
        assert sorted(r.rcpt_tos[0] for r in smtp.received) == ["alice@example.com", "bob@example.com"]
        ids = [r.message["Message-ID"] for r in smtp.received]
        assert ref["message_ids"].split() == ids
        assert ref["recipients"] == "alice@example.com,bob@example.com"
        assert all(r.mail_from == "signoff@example.com" for r in smtp.received)
        assert all(r.message["Auto-Submitted"] == "auto-generated" for r in smtp.received)
        # A redrawn card sends nothing: the links show the request as it stands.
        await channel.update(ref, card(status="approved"))
        assert len(smtp.received) == 2


async def test_a_decided_card_is_not_mailed() -> None:
    with LocalSmtp() as smtp:
        await _channel(f"smtp://127.0.0.1:{smtp.port}?starttls=false").post(card(status="cancelled"))
        assert smtp.received == []


async def test_a_temporary_refusal_is_retried_for_that_recipient_only() -> None:
    with LocalSmtp() as smtp:
        channel = _channel(f"smtp://127.0.0.1:{smtp.port}?starttls=false")
        smtp.refuse("bob@example.com", "450 4.2.1 Mailbox busy, try later")
        with pytest.raises(RetryableDeliveryError, match=r"450 4\.2\.1 Mailbox busy"):
            await channel.post(card())
        assert [r.rcpt_tos for r in smtp.received] == [["alice@example.com"]]
        smtp.accept("bob@example.com")
        ref = await channel.post(card())
        assert [r.rcpt_tos for r in smtp.received] == [["alice@example.com"], ["bob@example.com"]]
        assert len(ref["message_ids"].split()) == 2


async def test_a_permanent_refusal_of_one_recipient_still_reaches_the_others() -> None:
    with LocalSmtp() as smtp:
        channel = _channel(f"smtp://127.0.0.1:{smtp.port}?starttls=false")
        smtp.refuse("bob@example.com", "550 5.1.1 No such user")
        ref = await channel.post(card())
        assert ref["recipients"] == "alice@example.com"
        assert "550 5.1.1 No such user" in ref["refused"]


async def test_every_recipient_refused_for_good_is_permanent() -> None:
    with LocalSmtp() as smtp:
        channel = _channel(f"smtp://127.0.0.1:{smtp.port}?starttls=false")
        for who in ("alice@example.com", "bob@example.com"):
            smtp.refuse(who, "550 5.1.1 No such user")
        with pytest.raises(PermanentDeliveryError, match=r"550 5\.1\.1"):
            await channel.post(card())


async def test_no_address_to_send_to_is_permanent() -> None:
    with pytest.raises(PermanentDeliveryError, match="no approver of this gate has an email address"):
        await _channel().post(card(approvers=(Person("Alice", None),)))


async def test_a_refused_connection_is_retryable() -> None:
    with pytest.raises(RetryableDeliveryError, match="cannot reach the SMTP server"):
        await _channel(f"smtp://127.0.0.1:{free_port()}?starttls=false").post(card())


async def test_a_refused_login_is_permanent(tmp_path: Path) -> None:
    context, ca = self_signed(tmp_path)
    with LocalSmtp(users={"signoff": "right"}, starttls=context) as smtp:
        bad = _channel(f"smtp://signoff:wrong@127.0.0.1:{smtp.port}?ca_file={ca}")
        with pytest.raises(PermanentDeliveryError, match="SMTP authentication failed: 535"):
            await bad.post(card())
        good = _channel(f"smtp://signoff:right@127.0.0.1:{smtp.port}?ca_file={ca}")
        await good.post(card())
        assert len(smtp.received) == 2


async def test_starttls_is_required_unless_turned_off() -> None:
    with LocalSmtp() as plain:
        with pytest.raises(PermanentDeliveryError, match="STARTTLS extension not supported") as refused:
            await _channel(f"smtp://127.0.0.1:{plain.port}").post(card())
        assert "add ?starttls=false to smtp_url" in refused.value.reason
        assert plain.received == []
        await _channel(f"smtp://127.0.0.1:{plain.port}?starttls=false").post(card())
        assert len(plain.received) == 2


async def test_a_certificate_that_does_not_verify_is_permanent(tmp_path: Path) -> None:
    context, _ = self_signed(tmp_path)
    with LocalSmtp(starttls=context) as smtp:
        with pytest.raises(PermanentDeliveryError, match="certificate did not verify"):
            await _channel(f"smtp://127.0.0.1:{smtp.port}").post(card())


async def test_implicit_tls(tmp_path: Path) -> None:
    context, ca = self_signed(tmp_path)
    with LocalSmtp(implicit_tls=context) as smtp:
        await _channel(f"smtps://127.0.0.1:{smtp.port}?ca_file={ca}").post(card())
        assert len(smtp.received) == 2


@pytest.mark.parametrize(
    ("code", "kind"),
    [(421, RetryableDeliveryError), (451, RetryableDeliveryError), (554, PermanentDeliveryError)],
)
def test_smtp_replies_are_classified_by_their_class(code: int, kind: type[Exception]) -> None:
    from aiosmtplib import SMTPDataError

    assert isinstance(delivery_error(SMTPDataError(code, "said")), kind)
