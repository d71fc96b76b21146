"""Feishu channel: configuration, verification and decryption, parsing, rendering, the callback flow."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from signoff.channels import CallbackRejected, GrantChoice, InteractiveChannel, Verdict
from signoff.channels.feishu import (
    MAX_ARGUMENTS_BYTES,
    CallbackKind,
    FeishuChannel,
    FeishuConfig,
    decrypt,
    parse_click,
    render_card,
    verify_callback,
)
from tests.channels.feishu_fake import FakeFeishu, validate_card
from tests.channels.feishu_support import (
    CHAT,
    ENCRYPT_KEY,
    NOW,
    TOKEN,
    RecordingHandler,
    buttons,
    card_action,
    decided,
    encrypt,
    fixture,
    fixture_request,
    make_card,
    make_channel,
    sign,
    signed_encrypted,
    walk,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def channel(fake: FakeFeishu) -> FeishuChannel:
    return make_channel(fake)


def verify(body: bytes, headers: dict[str, str], **overrides: Any) -> Any:
    options: dict[str, Any] = {"encrypt_key": ENCRYPT_KEY, "verification_token": TOKEN, "now": NOW}
    options.update(overrides)
    return verify_callback(body, headers, **options)


# Configuration and packaging


def config_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": "feishu",
        "app_id": "cli_x",
        "app_secret": "s3cret",
        "verification_token": "tok",
        "encrypt_key": "key",
        "chat_id": "oc_x",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_config_defaults_and_secrets_stay_hidden() -> None:
    config = FeishuConfig.model_validate(config_data())
    assert (config.domain, config.mode, config.base_url) == ("feishu", "webhook", None)
    assert config.api_origin == "https://open.feishu.cn"
    assert FeishuConfig.model_validate(config_data(domain="lark")).api_origin == "https://open.larksuite.com"
    assert "s3cret" not in repr(config)
    assert "s3cret" not in str(config.model_dump())


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"colour": "red"}, "Extra inputs"),
        ({"verification_token": None, "encrypt_key": None}, "verification_token or encrypt_key"),
        ({"encrypt_key": "key\n"}, "whitespace"),
        ({"verification_token": ""}, "must not be empty"),
        ({"base_url": "http://fake-feishu:8080"}, "https"),
        ({"base_url": "https://open.feishu.cn/open-apis"}, "origin"),
        ({"base_url": "https://open.larksuite.com/"}, "origin"),
        ({"domain": "larksuite"}, "domain"),
        ({"mode": "socket"}, "mode"),
        ({"encrypt_key": None}, "allow_unsigned: true"),
        ({"allow_unsigned": True}, "allow_unsigned does nothing with an encrypt_key"),
    ],
)
def test_config_refuses(changes: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        FeishuConfig.model_validate(config_data(**changes))


def test_token_only_mode_must_be_asked_for_and_is_warned_about() -> None:
    signed = FeishuConfig.model_validate(config_data())
    assert (signed.allow_unsigned, signed.warnings()) == (False, [])
    unsigned = FeishuConfig.model_validate(config_data(encrypt_key=None, allow_unsigned=True))
    [warning] = unsigned.warnings()
    assert warning.startswith("allow_unsigned: ")
    assert "replayable" in warning
    # A long connection needs no callback credentials, and asks for nothing unsigned.
    ws = FeishuConfig.model_validate(config_data(encrypt_key=None, mode="websocket"))
    assert ws.warnings() == []


def test_config_allows_loopback_http_and_websocket_without_callback_credentials() -> None:
    config = FeishuConfig.model_validate(
        config_data(
            base_url="http://127.0.0.1:8123", mode="websocket", verification_token=None, encrypt_key=None
        )
    )
    assert config.api_origin == "http://127.0.0.1:8123"


def test_import_works_without_lark_oapi_and_create_names_the_extra() -> None:
    script = """
import sys
sys.modules["lark_oapi"] = None
import signoff.channels.feishu as feishu
config = feishu.FeishuConfig(type="feishu", app_id="a", app_secret="s", encrypt_key="k", chat_id="c")
try:
    feishu.create("x", config)
except ImportError as exc:
    print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "pip install 'signoff[feishu]'" in result.stdout


def test_channel_satisfies_the_contract(channel: FeishuChannel) -> None:
    assert isinstance(channel, InteractiveChannel)
    assert (channel.name, channel.type) == ("ops-feishu", "feishu")


# Decryption and verification (pure)


@pytest.mark.parametrize(
    "name", ["decrypt_vector.hello_world.json", "decrypt_vector.oapi_sdk_go_dispatcher_test.json"]
)
def test_decrypt_vectors(name: str) -> None:
    vector = fixture(name)
    assert decrypt(vector["encrypt"], vector["encrypt_key"]).decode() == vector["plaintext"]


@pytest.mark.parametrize(
    "encrypted",
    [
        "not base64!",
        base64.b64encode(b"short").decode(),
        base64.b64encode(bytes(16 * 3 + 1)).decode(),
        encrypt(b"hello world", "another key"),
        fixture("encrypted_envelope.doc_illustration_not_decryptable.json")["encrypt"],
    ],
    ids=["not-base64", "short", "not-whole-blocks", "another-key", "doc-illustration"],
)
def test_decrypt_failures_are_one_generic_rejection(encrypted: str) -> None:
    with pytest.raises(CallbackRejected) as caught:
        decrypt(encrypted, ENCRYPT_KEY)
    assert (caught.value.reason, caught.value.status_code) == ("undecryptable body", 401)


def test_signed_encrypted_fixture_verifies_and_decrypts_to_the_documented_payload() -> None:
    body, headers = fixture_request("req.card_action_trigger.encrypted_signed.json")
    verified = verify(body, headers)
    assert verified.kind is CallbackKind.CARD_ACTION
    assert verified.payload == fixture("card_action_trigger.v2.doc_derived.openlark.json")


def test_header_names_are_matched_case_insensitively() -> None:
    body, headers = fixture_request("req.card_action_trigger.encrypted_signed.json")
    lowered = {key.lower(): value for key, value in headers.items()}
    assert verify(body, lowered).kind is CallbackKind.CARD_ACTION


def test_bad_signature_is_refused_before_anything_is_decrypted() -> None:
    body, headers = fixture_request("req.card_action_trigger.encrypted_bad_signature.json")
    with pytest.raises(CallbackRejected, match="signature mismatch"):
        verify(body, headers)
    # Garbage that a decryption attempt would reject differently gets the same answer.
    garbage = json.dumps({"encrypt": "AAAA"}).encode()
    with pytest.raises(CallbackRejected, match="signature mismatch"):
        verify(garbage, headers)


@pytest.mark.parametrize(
    ("skew", "accepted"), [(-300, True), (300, True), (-301, False), (301, False), (86400, False)]
)
def test_timestamp_window(skew: int, accepted: bool) -> None:
    body, headers = signed_encrypted(card_action())
    if accepted:
        assert verify(body, headers, now=NOW + skew).kind is CallbackKind.CARD_ACTION
    else:
        with pytest.raises(CallbackRejected, match="timestamp outside"):
            verify(body, headers, now=NOW + skew)


def test_a_body_changed_after_signing_is_refused() -> None:
    _, headers = signed_encrypted(card_action())
    tampered = json.dumps(
        {"encrypt": encrypt(json.dumps(card_action(verdict="reject")).encode(), ENCRYPT_KEY)}
    )
    with pytest.raises(CallbackRejected, match="signature mismatch"):
        verify(tampered.encode(), headers)


@pytest.mark.parametrize(
    ("build", "reason"),
    [
        (lambda: signed_encrypted(card_action(token="not-the-token")), "verification token mismatch"),
        (lambda: signed_encrypted(b"{not json"), "undecryptable body"),
        (lambda: signed_encrypted(b"[1, 2]"), "undecryptable body"),
        (
            lambda: (json.dumps(card_action()).encode(), {}),
            "plaintext body while an encrypt key is configured",
        ),
        (
            lambda: (
                json.dumps({"encrypt": encrypt(json.dumps(card_action()).encode(), ENCRYPT_KEY)}).encode(),
                {},
            ),
            "unsigned callback",
        ),
        (lambda: signed_encrypted(card_action(), key="someone else's key"), "signature mismatch"),
    ],
)
def test_refusals(build: Any, reason: str) -> None:
    body, headers = build()
    with pytest.raises(CallbackRejected) as caught:
        verify(body, headers)
    assert caught.value.reason == reason
    assert caught.value.status_code == 401


@pytest.mark.parametrize("body", [b"not json", b"[]", b'"text"', b"\xff\xfe", b"[" * 100_000])
def test_malformed_bodies_are_a_400(body: bytes) -> None:
    with pytest.raises(CallbackRejected) as caught:
        verify(body, {})
    assert caught.value.status_code == 400


def test_oversized_bodies_are_refused_unread() -> None:
    with pytest.raises(CallbackRejected) as caught:
        verify(b" " * (256 * 1024 + 1), {})
    assert caught.value.status_code == 413


def test_token_only_app_accepts_plain_callbacks_with_the_right_token_when_allowed() -> None:
    body, headers = fixture_request("req.card_action_trigger.plain.json")
    unsigned = {"encrypt_key": None, "allow_unsigned": True}
    assert verify(body, headers, **unsigned).kind is CallbackKind.CARD_ACTION
    with pytest.raises(CallbackRejected, match="verification token mismatch"):
        verify(body, headers, **unsigned, verification_token="other")
    with pytest.raises(CallbackRejected, match="no encrypt key configured"):
        verify(*signed_encrypted(card_action()), **unsigned)
    # Not asked for: the token alone is not enough.
    with pytest.raises(CallbackRejected, match="allow_unsigned off"):
        verify(body, headers, encrypt_key=None)


def test_url_verification_plain_and_encrypted() -> None:
    plain = verify(*fixture_request("req.url_verification.plain.json"), encrypt_key=None, allow_unsigned=True)
    encrypted = verify(*fixture_request("req.url_verification.encrypted.json"))
    expected = fixture("url_verification.response.json")["challenge"]
    assert plain.kind is encrypted.kind is CallbackKind.URL_VERIFICATION
    assert plain.payload["challenge"] == encrypted.payload["challenge"] == expected
    with pytest.raises(CallbackRejected, match="verification token mismatch"):
        verify(
            *fixture_request("req.url_verification.plain.json"),
            encrypt_key=None,
            verification_token="x",
            allow_unsigned=True,
        )
    # With an encrypt key set, a plaintext challenge is a downgrade.
    with pytest.raises(CallbackRejected, match="plaintext body"):
        verify(*fixture_request("req.url_verification.plain.json"))


def test_legacy_callback_needs_its_sha1_signature() -> None:
    data = fixture("req.card_callback.legacy_v1.signed_sha1.json")
    body, headers = data["body_raw"].encode(), data["headers"]
    legacy = {"encrypt_key": None, "verification_token": data["verification_token"], "allow_unsigned": True}
    assert verify(body, headers, **legacy).kind is CallbackKind.LEGACY_CARD_ACTION
    with pytest.raises(CallbackRejected, match="without a valid signature"):
        verify(body, {}, **legacy)
    with pytest.raises(CallbackRejected, match="signature mismatch"):
        verify(body, {**headers, "X-Lark-Signature": "0" * 40}, **legacy)
    # Its signature is keyed with the verification token alone: with an encrypt key set, a
    # plaintext legacy callback is a downgrade, and without allow_unsigned it is not enough.
    with pytest.raises(CallbackRejected, match="plaintext body"):
        verify(body, headers, **{**legacy, "encrypt_key": ENCRYPT_KEY, "allow_unsigned": False})
    with pytest.raises(CallbackRejected, match="allow_unsigned off"):
        verify(body, headers, **{**legacy, "allow_unsigned": False})


def test_an_encrypted_legacy_callback_with_its_sha1_signature_is_accepted_with_an_encrypt_key() -> None:
    payload = fixture("card_callback.legacy_v1.lark_doc.json")
    payload["token"] = TOKEN
    body = json.dumps({"encrypt": encrypt(json.dumps(payload).encode(), ENCRYPT_KEY)}).encode()
    headers = {
        "x-lark-request-timestamp": str(NOW),
        "x-lark-request-nonce": "abc",
        "x-lark-signature": sign(str(NOW), "abc", TOKEN, body, algorithm="sha1"),
    }
    assert verify(body, headers).kind is CallbackKind.LEGACY_CARD_ACTION
    with pytest.raises(CallbackRejected, match="without a valid signature"):
        verify(body, {})


def test_no_credentials_means_no_callbacks() -> None:
    body, headers = fixture_request("req.card_action_trigger.plain.json")
    with pytest.raises(CallbackRejected, match="no callback credentials"):
        verify(body, headers, encrypt_key=None, verification_token=None)


# Parsing


def test_parse_click_identity_and_reason() -> None:
    click = parse_click(card_action("req-9", "reject", event_id="ev-9", reason="  wrong payee  "))
    assert (click.request_id, click.verdict, click.user_id) == ("req-9", Verdict.REJECT, "ou_alice")
    assert click.reason == "wrong payee"
    assert click.event_id == "ev-9"
    assert click.identity == {
        "open_id": "ou_alice",
        "union_id": "on_union_alice",
        "user_id": "on_8f6f0d15799e5c45",
        "tenant_key": "736588c9260f175d",
        "event_id": "ev-9",
        "open_message_id": "om_dc0d7ab6d7b734d5bff5c0556e8e7616",
    }
    assert click.conversation == CHAT


def test_parse_form_submit_fixture_shape() -> None:
    payload = fixture("card_action_trigger.v2.form_submit.larksuite_cli_test.json")
    payload["event"]["action"]["value"] = {"request_id": "req-2", "verdict": "reject"}
    click = parse_click(payload)
    assert (click.verdict, click.reason, click.user_id) == (Verdict.REJECT, "testing", "ou_form_user")
    assert click.identity == {
        "open_id": "ou_form_user",
        "event_id": "ev_form_001",
        "open_message_id": "om_form_001",
    }
    assert click.conversation == "oc_chat_002"


def test_parse_legacy_click_with_string_value() -> None:
    payload = fixture("card_callback.legacy_v1.lark_doc.json")
    payload["action"]["value"] = json.dumps({"request_id": "req-3", "verdict": "approve"})
    click = parse_click(payload, legacy=True)
    assert (click.request_id, click.verdict, click.user_id, click.event_id) == (
        "req-3",
        Verdict.APPROVE,
        "ou_d72a3e4xxx622e2e",
        None,
    )
    assert click.identity["tenant_key"] == "10911cb08b989758"


@pytest.mark.parametrize(
    "value",
    [
        {"key": "value"},
        {"request_id": "r"},
        {"request_id": "r", "verdict": "maybe"},
        {"verdict": "approve"},
        "x",
        None,
    ],
)
def test_clicks_that_name_no_request_and_verdict_are_a_400(value: Any) -> None:
    payload = card_action()
    payload["event"]["action"]["value"] = value
    with pytest.raises(CallbackRejected) as caught:
        parse_click(payload)
    assert caught.value.status_code == 400


# Rendering (pure)


def test_pending_card_shows_everything_and_offers_both_verdicts() -> None:
    card = make_card(approvals=(make_card().approvers[0],))
    rendered = render_card(card)
    validate_card(json.dumps(rendered))
    assert rendered["schema"] == "2.0"
    assert rendered["config"] == {"update_multi": True}
    assert rendered["header"]["template"] == "orange"
    text = json.dumps(rendered, ensure_ascii=False)
    for expected in ("finance-bot", "pay_invoice", "On behalf of: Dana", "Approvers: Alice, Bob"):
        assert expected in text
    assert "Approvals: 1 of 2 (Alice)" in text
    assert "Expires: 2024-05-01 10:00 UTC" in text
    assert "ACME 有限公司" in text
    values = {button["name"]: button["behaviors"][0]["value"] for button in buttons(rendered)}
    assert values == {
        "approve": {"request_id": "req-1", "verdict": "approve"},
        "reject": {"request_id": "req-1", "verdict": "reject"},
    }


@pytest.mark.parametrize("required", [True, False])
def test_rejection_form_submits_a_reason(required: bool) -> None:
    rendered = render_card(make_card(require_reject_reason=required))
    form = next(element for element in walk(rendered) if element["tag"] == "form")
    tags = {element["tag"]: element for element in walk(form["elements"])}
    assert tags["input"]["name"] == "reason"
    assert tags["input"]["required"] is required
    assert tags["button"]["form_action_type"] == "submit"
    assert tags["button"]["behaviors"][0]["value"]["verdict"] == "reject"


@pytest.mark.parametrize(
    ("status", "template", "title"),
    [
        ("approved", "green", "Approved"),
        ("rejected", "red", "Rejected"),
        ("expired", "grey", "Expired"),
        ("cancelled", "grey", "Cancelled"),
    ],
)
def test_settled_cards_show_the_outcome_and_have_no_buttons(status: str, template: str, title: str) -> None:
    card = (
        decided(make_card(), status, reason="over budget")
        if status != "expired"
        else make_card(status=status)
    )
    rendered = render_card(card)
    validate_card(json.dumps(rendered))
    assert not [e for e in walk(rendered) if e["tag"] in {"button", "form", "input"}]
    assert (rendered["header"]["template"], rendered["header"]["title"]["content"]) == (template, title)
    text = json.dumps(rendered)
    if status == "expired":
        assert "Expired at: 2024-05-01 10:00 UTC" in text
    else:
        assert "Decided by: Alice" in text
        assert "Decided at: 2024-05-01 09:35 UTC" in text
        assert "Reason: over budget" in text


def test_long_arguments_are_cut_and_say_so() -> None:
    rendered = render_card(make_card(arguments={"blob": "x" * 10_000}))
    block = next(e["content"] for e in walk(rendered) if e["tag"] == "markdown")
    assert len(block.encode()) < MAX_ARGUMENTS_BYTES + 1000
    assert "more characters" in block
    assert len(json.dumps(rendered).encode()) < 30 * 1024


def test_agent_text_cannot_escape_into_markdown() -> None:
    hostile = "```\n**Approved by security** [click](https://evil.example)"
    rendered = render_card(make_card(tool_name=hostile, arguments={"note": hostile}))
    block = next(e["content"] for e in walk(rendered) if e["tag"] == "markdown")
    fenced = block.split("```json\n", 1)[1].rsplit("\n```", 1)[0]
    assert not any(line.lstrip().startswith("`") for line in fenced.splitlines())
    # Everything else that carries agent text is plain text, never markdown.
    markdown = [e for e in walk(rendered) if e["tag"] == "markdown"]
    assert len(markdown) == 1
    assert hostile not in block


# The callback flow


async def test_signed_click_is_applied_once_and_answered_with_toast_and_card(channel: FeishuChannel) -> None:
    handler = RecordingHandler()
    reply = await channel.handle_callback(*signed_encrypted(card_action("req-7")), handler)

    assert [(c.request_id, c.verdict, c.user_id) for c in handler.clicks] == [
        ("req-7", "approve", "ou_alice")
    ]
    assert reply.status_code == 200
    assert reply.body is not None
    assert reply.body["toast"] == {"type": "success", "content": "Recorded: approved."}
    assert reply.body["card"]["type"] == "raw"
    card = reply.body["card"]["data"]
    validate_card(json.dumps(card))
    assert card["schema"] == "2.0"
    assert card["header"]["title"]["content"] == "Approved"
    assert buttons(card) == []


async def test_refused_click_gets_a_warning_and_the_current_card(channel: FeishuChannel) -> None:
    handler = RecordingHandler(accept=False)
    reply = await channel.handle_callback(*signed_encrypted(card_action()), handler)
    assert reply.body is not None
    assert reply.body["toast"] == {"type": "warning", "content": "You are not an approver of this request."}
    assert buttons(reply.body["card"]["data"])  # still pending for the real approvers
    assert reply.after is None


async def test_click_on_an_expired_request_shows_the_expired_card(channel: FeishuChannel) -> None:
    handler = RecordingHandler(accept=False, card=make_card(status="expired"))
    reply = await channel.handle_callback(*signed_encrypted(card_action()), handler)
    assert reply.body is not None
    assert reply.body["toast"]["type"] == "warning"
    card = reply.body["card"]["data"]
    assert card["header"]["title"]["content"] == "Expired"
    assert buttons(card) == []


async def test_racing_approvers_are_each_applied(channel: FeishuChannel) -> None:
    handler = RecordingHandler(delay=0.05)
    await asyncio.gather(
        channel.handle_callback(*signed_encrypted(card_action(event_id="ev-a", open_id="ou_alice")), handler),
        channel.handle_callback(*signed_encrypted(card_action(event_id="ev-b", open_id="ou_bob")), handler),
    )
    assert sorted(c.user_id for c in handler.clicks) == ["ou_alice", "ou_bob"]


async def test_reject_with_reason_reaches_the_handler(channel: FeishuChannel) -> None:
    handler = RecordingHandler()
    reply = await channel.handle_callback(
        *signed_encrypted(card_action(verdict="reject", reason="duplicate invoice")), handler
    )
    assert [(c.verdict, c.reason) for c in handler.clicks] == [("reject", "duplicate invoice")]
    assert reply.body is not None
    assert "Reason: duplicate invoice" in json.dumps(reply.body["card"]["data"])


async def test_replayed_event_is_not_applied_twice(channel: FeishuChannel) -> None:
    handler = RecordingHandler()
    first = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-dup")), handler)
    again = await channel.handle_callback(
        *signed_encrypted(card_action(event_id="ev-dup"), nonce="other"), handler
    )
    assert len(handler.clicks) == 1
    assert again.body == first.body
    assert first.after is not None
    assert again.after is None


async def test_concurrent_redeliveries_share_one_application(channel: FeishuChannel) -> None:
    handler = RecordingHandler(delay=0.2)
    replies = await asyncio.gather(
        *(
            channel.handle_callback(*signed_encrypted(card_action(event_id="ev-race")), handler)
            for _ in range(5)
        )
    )
    assert len(handler.clicks) == 1
    assert len({json.dumps(r.body, sort_keys=True) for r in replies}) == 1


async def test_slow_handler_is_answered_within_the_budget_and_finishes_later(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    channel._reply_budget = 0.1
    handler = RecordingHandler(delay=0.4)
    reply = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-slow")), handler)
    assert (len(handler.clicks), handler.finished) == (1, 0), "answered before the handler finished"
    assert reply.body is not None
    assert reply.body["toast"]["type"] == "info"
    assert "card" not in reply.body
    # Feishu redelivers the unanswered event: it joins the same application.
    again = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-slow")), handler)
    await channel.aclose()
    assert len(handler.clicks) == 1
    assert again.body is not None


async def test_handler_failure_is_an_error_toast_and_a_redelivery_tries_again(channel: FeishuChannel) -> None:
    handler = RecordingHandler(error=RuntimeError("database is locked"))
    reply = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-err")), handler)
    assert reply.body is not None
    assert reply.body["toast"]["type"] == "error"
    assert "database" not in json.dumps(reply.body)
    handler.error = None
    again = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-err")), handler)
    assert again.body is not None
    assert again.body["toast"]["type"] == "success"
    assert len(handler.clicks) == 2


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(
            lambda: fixture_request("req.card_action_trigger.encrypted_bad_signature.json"),
            id="bad-signature",
        ),
        pytest.param(lambda: signed_encrypted(card_action(), timestamp=NOW - 3600), id="stale-timestamp"),
        pytest.param(lambda: signed_encrypted(card_action(token="wrong")), id="wrong-token"),
        pytest.param(lambda: signed_encrypted(b"\x00" * 40), id="undecryptable"),
        pytest.param(lambda: (b"{malformed", {}), id="malformed-json"),
        pytest.param(lambda: signed_encrypted(card_action() | {"event": {"action": {}}}), id="unparseable"),
        pytest.param(lambda: fixture_request("req.card_action_trigger.plain.json"), id="plaintext-downgrade"),
        pytest.param(
            lambda: fixture_request("req.card_action_trigger.encrypted_signed.json"), id="foreign-button"
        ),
    ],
)
async def test_rejected_callbacks_are_never_applied(channel: FeishuChannel, request_: Any) -> None:
    handler = RecordingHandler()
    body, headers = request_()
    with pytest.raises(CallbackRejected) as caught:
        await channel.handle_callback(body, headers, handler)
    assert caught.value.status_code in {400, 401}
    assert handler.clicks == []


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("req.url_verification.plain.json", {"encrypt_key": None, "allow_unsigned": True}),
        ("req.url_verification.encrypted.json", {}),
    ],
)
async def test_url_verification_is_answered(fake: FakeFeishu, name: str, config: dict[str, Any]) -> None:
    channel = make_channel(fake, **config)
    handler = RecordingHandler()
    reply = await channel.handle_callback(*fixture_request(name), handler)
    assert reply.body == fixture("url_verification.response.json")
    assert handler.clicks == []


async def test_other_verified_events_are_acknowledged_and_ignored(channel: FeishuChannel) -> None:
    event = card_action()
    event["header"]["event_type"] = "im.message.receive_v1"
    handler = RecordingHandler()
    reply = await channel.handle_callback(*signed_encrypted(event), handler)
    assert (reply.status_code, reply.body, handler.clicks) == (200, {}, [])


async def test_legacy_click_is_answered_with_the_card_itself(fake: FakeFeishu) -> None:
    channel = make_channel(fake, encrypt_key=None, verification_token="legacy-token", allow_unsigned=True)
    payload = fixture("card_callback.legacy_v1.lark_doc.json")
    payload["action"]["value"] = {"request_id": "req-4", "verdict": "reject"}
    body = json.dumps(payload).encode()
    headers = {
        "X-Lark-Request-Timestamp": str(NOW),
        "X-Lark-Request-Nonce": "abc",
        "X-Lark-Signature": sign(str(NOW), "abc", "legacy-token", body, algorithm="sha1"),
    }
    handler = RecordingHandler()
    reply = await channel.handle_callback(body, headers, handler)
    assert [(c.request_id, c.verdict) for c in handler.clicks] == [("req-4", "reject")]
    assert reply.body is not None
    assert reply.body["schema"] == "2.0"
    assert buttons(dict(reply.body)) == []


def test_grants_are_buttons_that_parse_back_into_the_grant() -> None:
    grants = (GrantChoice("session", 3600, ("payee",)), GrantChoice("agent", 1800))
    rendered = render_card(make_card(grants=grants))
    validate_card(json.dumps(rendered))
    labels = [b["text"]["content"] for b in buttons(rendered)]
    assert labels == [
        "Approve once",
        "Approve for this session (1h)",
        "Approve for this agent (30m)",
        "Reject",
    ]
    for button, grant in zip(buttons(rendered)[1:3], grants, strict=True):
        assert button["confirm"]["title"]["content"].startswith("Approve for this")
        [behavior] = button["behaviors"]
        payload = card_action("req-1", "approve")
        payload["event"]["action"]["value"] = behavior["value"]
        click = parse_click(payload)
        assert (click.verdict, click.grant) == (Verdict.APPROVE, grant)


@pytest.mark.parametrize(
    "grant",
    [
        "agent:1d",
        {"scope": "agent"},
        {"scope": "agent", "seconds": "60", "same": []},
        {"scope": "x", "seconds": 60},
    ],
)
def test_a_value_naming_no_grant_is_refused(grant: Any) -> None:
    payload = card_action("req-1", "approve")
    payload["event"]["action"]["value"]["grant"] = grant
    with pytest.raises(CallbackRejected) as refused:
        parse_click(payload)
    assert refused.value.status_code == 400


def test_a_card_approved_with_a_grant_says_for_what_until_when() -> None:
    card = replace(
        decided(make_card()),
        granted=GrantChoice("session", 3600),
        granted_until=datetime(2024, 5, 1, 10, 35, tzinfo=UTC),
    )
    text = json.dumps(render_card(card))
    assert "Approved for this session until 2024-05-01 10:35 UTC by Alice" in text
    assert "Approved once by Alice" in json.dumps(render_card(decided(make_card())))
