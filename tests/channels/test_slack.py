"""SlackChannel against a fake Slack Web API on loopback: delivery, callbacks, Socket Mode."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from signoff.channels import (
    CallbackRejected,
    CallbackReply,
    InteractiveChannel,
    PermanentDeliveryError,
    RetryableDeliveryError,
    Verdict,
)
from signoff.channels.slack import (
    REASON_BLOCK_ID,
    REJECT_MODAL_CALLBACK_ID,
    SlackChannel,
    SlackConfig,
    create,
    render_card,
)
from signoff.channels.slack import _channel as slack_channel_module
from tests.channels.fake_slack import APP_TOKEN, CHANNEL, FakeSlack, Scripted
from tests.channels.slack_support import (
    NOW,
    SECRET,
    RecordingHandler,
    approve_payload,
    card,
    decided,
    fixture,
    form_body,
    refuse,
    reject_payload,
    signed,
    submission_payload,
)
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]


def make_channel(data: dict[str, Any], *, now: float = NOW) -> SlackChannel:
    return SlackChannel("ops-slack", SlackConfig.model_validate(data), clock=lambda: now)


@pytest.fixture
async def channel(slack_config_data: dict[str, Any]) -> AsyncIterator[SlackChannel]:
    ch = make_channel(slack_config_data)
    yield ch
    await ch.aclose()


async def deliver(
    ch: SlackChannel, payload: dict[str, Any], handler: RecordingHandler, **extra: str
) -> CallbackReply:
    body = form_body(payload)
    return await ch.handle_callback(body, signed(body) | extra, handler)


async def finish(reply: CallbackReply) -> None:
    """What the router's background task does after answering Slack."""
    if reply.after is not None:
        await reply.after()


# -- configuration and construction -----------------------------------------------------------


def test_config_refuses_unknown_keys_and_bad_tokens(slack_config_data: dict[str, Any]) -> None:
    SlackConfig.model_validate(slack_config_data | {"app_token": APP_TOKEN})
    with pytest.raises(ValidationError, match="extra"):
        SlackConfig.model_validate(slack_config_data | {"token": "x"})
    with pytest.raises(ValidationError, match="app-level token"):
        SlackConfig.model_validate(slack_config_data | {"app_token": "xoxb-a-bot-token"})
    with pytest.raises(ValidationError, match="must not be empty"):
        SlackConfig.model_validate(slack_config_data | {"signing_secret": "  "})
    with pytest.raises(ValidationError):
        SlackConfig.model_validate(slack_config_data | {"type": "feishu"})


def test_socket_mode_needs_no_signing_secret_and_the_webhook_needs_one(
    slack_config_data: dict[str, Any],
) -> None:
    without = {k: v for k, v in slack_config_data.items() if k != "signing_secret"}
    assert SlackConfig.model_validate(without | {"app_token": APP_TOKEN}).signing_secret is None
    with pytest.raises(ValidationError, match=r"needs signing_secret, .* or app_token"):
        SlackConfig.model_validate(without)


async def test_a_socket_mode_channel_without_a_signing_secret_refuses_every_posted_callback(
    slack_config_data: dict[str, Any],
) -> None:
    without = {k: v for k, v in slack_config_data.items() if k != "signing_secret"}
    ch = make_channel(without | {"app_token": APP_TOKEN})
    body = form_body(approve_payload())
    handler = RecordingHandler()
    try:
        with pytest.raises(CallbackRejected, match="Socket Mode"):
            await ch.handle_callback(body, signed(body), handler)
        assert handler.clicks == []
    finally:
        await ch.aclose()


def test_secrets_do_not_leak_through_repr(slack_config_data: dict[str, Any]) -> None:
    config = SlackConfig.model_validate(slack_config_data)

    assert SECRET not in repr(config)
    assert "xoxb-" not in repr(config)


async def test_create_builds_an_interactive_channel(slack_config_data: dict[str, Any]) -> None:
    ch = create("ops-slack", SlackConfig.model_validate(slack_config_data))

    assert isinstance(ch, InteractiveChannel)
    assert (ch.name, ch.type) == ("ops-slack", "slack")
    await ch.aclose()


def test_config_imports_without_slack_sdk() -> None:
    code = """
import sys
sys.modules["slack_sdk"] = None  # what an install without the slack extra looks like
import signoff.channels.slack as slack
config = slack.SlackConfig(type="slack", bot_token="xoxb-1", signing_secret="s", channel="C1")
slack.render_card  # the pure functions are usable too
try:
    slack.create("ops", config)
except ImportError as exc:
    print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )

    assert "pip install 'signoff[slack]'" in result.stdout


# -- delivery ----------------------------------------------------------------------------------


async def test_post_sends_text_and_blocks_and_returns_the_message_ref(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    ref = await channel.post(card())

    [call] = fake_slack.calls_to("chat.postMessage")
    expected_text, expected_blocks = render_card(card())
    assert call.token == "xoxb-test-bot-token"
    assert call.args["channel"] == CHANNEL
    assert call.args["text"] == expected_text
    assert call.args["blocks"] == expected_blocks
    assert (call.args["unfurl_links"], call.args["unfurl_media"]) == (False, False)
    assert ref == {"channel": CHANNEL, "ts": "1700000000.000001"}


async def test_update_after_a_decision_leaves_no_buttons(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    ref = await channel.post(card())
    assert any(b["type"] == "actions" for b in fake_slack.messages[(ref["channel"], ref["ts"])]["blocks"])

    await channel.update(ref, decided(card(), "approved"))

    message = fake_slack.messages[(ref["channel"], ref["ts"])]
    assert not any(b["type"] == "actions" for b in message["blocks"])
    assert "✅ *Approved once* by <@U0ANA>" in json.dumps(message["blocks"], ensure_ascii=False)
    assert message["text"].startswith("Approved:")


async def test_rate_limit_is_retryable_with_retry_after_and_not_retried_inside(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    fake_slack.fail_next("chat.postMessage", Scripted(429, "ratelimited", {"Retry-After": "7"}))

    with pytest.raises(RetryableDeliveryError) as caught:
        await channel.post(card())

    assert (caught.value.reason, caught.value.retry_after) == ("ratelimited", 7.0)
    # The outbox honours Retry-After; slack-sdk must not have slept and retried on its own.
    assert len(fake_slack.calls_to("chat.postMessage")) == 1
    assert fake_slack.messages == {}


async def test_rate_limit_without_a_usable_retry_after(channel: SlackChannel, fake_slack: FakeSlack) -> None:
    fake_slack.fail_next("chat.update", Scripted(429, "ratelimited", {"Retry-After": "soon"}))
    ref = await channel.post(card())

    with pytest.raises(RetryableDeliveryError) as caught:
        await channel.update(ref, card())

    assert caught.value.retry_after is None


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (Scripted(503, html=True), "http_503"),
        (Scripted(500, html=True), "http_500"),
        (Scripted(200, "internal_error"), "internal_error"),
        (Scripted(200, "service_unavailable"), "service_unavailable"),
    ],
)
async def test_server_trouble_is_retryable(
    channel: SlackChannel, fake_slack: FakeSlack, answer: Scripted, reason: str
) -> None:
    fake_slack.fail_next("chat.postMessage", answer)

    with pytest.raises(RetryableDeliveryError) as caught:
        await channel.post(card())

    assert caught.value.reason == reason
    assert len(fake_slack.calls_to("chat.postMessage")) == 1


@pytest.mark.parametrize(
    "code",
    ["not_in_channel", "is_archived", "account_inactive", "token_revoked", "msg_too_long", "missing_scope"],
)
async def test_permanent_error_codes(channel: SlackChannel, fake_slack: FakeSlack, code: str) -> None:
    fake_slack.fail_next("chat.postMessage", Scripted(200, code))

    with pytest.raises(PermanentDeliveryError) as caught:
        await channel.post(card())

    assert caught.value.reason == code


async def test_unknown_channel_is_permanent(slack_config_data: dict[str, Any]) -> None:
    ch = make_channel(slack_config_data | {"channel": "C0NOWHERE"})

    with pytest.raises(PermanentDeliveryError) as caught:
        await ch.post(card())

    assert caught.value.reason == "channel_not_found"


async def test_bad_token_is_permanent(slack_config_data: dict[str, Any]) -> None:
    ch = make_channel(slack_config_data | {"bot_token": "xoxb-revoked"})

    with pytest.raises(PermanentDeliveryError) as caught:
        await ch.post(card())

    assert caught.value.reason == "invalid_auth"


async def test_updating_a_vanished_message_is_permanent(channel: SlackChannel) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        await channel.update({"channel": CHANNEL, "ts": "1.000"}, card())

    assert caught.value.reason == "message_not_found"


async def test_update_refuses_a_reference_from_another_channel_type(channel: SlackChannel) -> None:
    with pytest.raises(PermanentDeliveryError):
        await channel.update({"message_id": "om_1"}, card())


async def test_unreachable_slack_is_retryable(slack_config_data: dict[str, Any]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ch = make_channel(slack_config_data | {"base_url": f"http://127.0.0.1:{port}/api/"})

    with pytest.raises(RetryableDeliveryError) as caught:
        await ch.post(card())

    assert caught.value.reason.startswith("network error")


async def test_slow_slack_is_retryable(
    slack_config_data: dict[str, Any], fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slack_channel_module, "_API_TIMEOUT_SECONDS", 0.2)
    ch = make_channel(slack_config_data)
    fake_slack.fail_next("chat.postMessage", Scripted(delay=1.0))

    with pytest.raises(RetryableDeliveryError) as caught:
        await ch.post(card())

    assert caught.value.reason == "timeout"


# -- callbacks: verification -------------------------------------------------------------------


async def test_derived_fixture_verifies_and_a_foreign_button_changes_nothing(
    slack_config_data: dict[str, Any], fake_slack: FakeSlack
) -> None:
    request = fixture("derived/signed_block_actions_request.json")
    ch = make_channel(slack_config_data | {"signing_secret": request["signing_secret"]})
    handler = RecordingHandler()

    reply = await ch.handle_callback(request["raw_body"].encode(), request["headers"], handler)

    assert (reply.status_code, reply.body, reply.after) == (200, None, None)
    assert handler.clicks == []
    assert fake_slack.calls == []


async def test_replay_after_five_minutes_is_rejected(slack_config_data: dict[str, Any]) -> None:
    ch = make_channel(slack_config_data, now=NOW + 301)
    handler = RecordingHandler()

    with pytest.raises(CallbackRejected) as caught:
        await deliver(ch, approve_payload(), handler)

    assert caught.value.status_code == 401
    assert handler.clicks == []


async def test_forged_signature_is_rejected_before_parsing(channel: SlackChannel) -> None:
    handler = RecordingHandler()
    body = form_body(approve_payload())

    with pytest.raises(CallbackRejected) as caught:
        await channel.handle_callback(body, signed(body, secret="forged"), handler)

    assert caught.value.status_code == 401
    assert handler.clicks == []


async def test_garbage_without_a_signature_is_a_401_not_a_400(channel: SlackChannel) -> None:
    with pytest.raises(CallbackRejected) as caught:
        await channel.handle_callback(b"\xff not a form", {}, RecordingHandler())

    assert caught.value.status_code == 401


async def test_signed_garbage_is_a_400(channel: SlackChannel) -> None:
    with pytest.raises(CallbackRejected) as caught:
        await channel.handle_callback(b"foo=bar", signed(b"foo=bar"), RecordingHandler())

    assert caught.value.status_code == 400


# -- callbacks: Approve ------------------------------------------------------------------------


async def test_approve_is_applied_before_the_ack_and_the_clicker_looked_up_after(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler()

    reply = await deliver(channel, approve_payload(), handler)

    assert (reply.status_code, reply.body) == (200, None)
    [(channel_name, click)] = handler.clicks
    assert channel_name == "ops-slack"
    assert (click.verdict, click.request_id, click.user_id) == (Verdict.APPROVE, "req-1", "W111")
    assert click.identity["team_id"] == "T111"
    assert click.identity["action_ts"] == "1596530385.194939"
    assert fake_slack.calls == []  # nothing slow before the acknowledgement

    await finish(reply)

    assert fake_slack.calls_to("chat.postEphemeral") == []
    assert [c.args["user"] for c in fake_slack.calls_to("users.info")] == ["W111"]
    assert handler.enriched == [("ops-slack", "W111", "Primary Owner", None)]


async def test_refused_click_is_told_why_once_even_when_redelivered(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler(refuse("You are not an approver of this request."))

    first = await deliver(channel, approve_payload(), handler)
    again = await deliver(channel, approve_payload(), handler, **{"X-Slack-Retry-Num": "1"})
    await finish(first)
    await finish(again)

    # The server sees both (its vote uniqueness makes the second a no-op) ...
    assert [c.event_id for _, c in handler.clicks] == ["1596530385.194939:W111"] * 2
    # ... but the clicker gets one note.
    [note] = fake_slack.calls_to("chat.postEphemeral")
    assert note.args == {
        "channel": CHANNEL,
        "user": "W111",
        "text": "You are not an approver of this request.",
    }


async def test_ephemeral_text_cannot_ping(channel: SlackChannel, fake_slack: FakeSlack) -> None:
    handler = RecordingHandler(refuse("Already rejected by <!channel> & co."))

    await finish(await deliver(channel, approve_payload(), handler))

    [note] = fake_slack.calls_to("chat.postEphemeral")
    assert note.args["text"] == "Already rejected by &lt;!channel&gt; &amp; co."


async def test_two_separate_clicks_each_get_an_answer(channel: SlackChannel, fake_slack: FakeSlack) -> None:
    handler = RecordingHandler(refuse("Already approved by Ana."))
    second_click = approve_payload()
    second_click["actions"][0]["action_ts"] = "1596530386.000001"

    for payload in (approve_payload(), second_click):
        await finish(await deliver(channel, payload, handler))

    assert len(fake_slack.calls_to("chat.postEphemeral")) == 2


async def test_home_tab_click_is_applied_without_an_ephemeral(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    payload = fixture("block_actions_slack_docs_home_tab.json")
    payload["actions"][0].update(action_id="signoff_approve", value="req-1")
    handler = RecordingHandler(refuse("This request has expired."))

    reply = await deliver(channel, payload, handler)
    await finish(reply)

    assert [c.request_id for _, c in handler.clicks] == ["req-1"]
    assert fake_slack.calls_to("chat.postEphemeral") == []
    # users.info does not know this user: nothing to enrich, nothing raised.
    assert len(fake_slack.calls_to("users.info")) == 1
    assert handler.enriched == []


async def test_slack_failures_after_the_ack_are_contained(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler(refuse("Already decided."))
    fake_slack.fail_next("chat.postEphemeral", Scripted(500, html=True))
    fake_slack.fail_next("users.info", Scripted(429, "ratelimited", {"Retry-After": "30"}))

    await finish(await deliver(channel, approve_payload(), handler))

    assert len(fake_slack.calls_to("chat.postEphemeral")) == 1
    assert handler.enriched == []


# -- callbacks: Reject and the reason modal ----------------------------------------------------


async def test_reject_opens_the_reason_modal_before_the_ack(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler()

    reply = await deliver(channel, reject_payload(), handler)

    assert (reply.status_code, reply.body, reply.after) == (200, None, None)
    assert handler.clicks == []  # nothing is decided until the form is submitted
    [call] = fake_slack.calls_to("views.open")
    assert call.args["trigger_id"] == "111.222.valid"
    view = call.args["view"]
    assert view["callback_id"] == REJECT_MODAL_CALLBACK_ID
    assert json.loads(view["private_metadata"]) == {"request_id": "req-1", "channel_id": CHANNEL}
    [reason] = [b for b in view["blocks"] if b.get("block_id") == REASON_BLOCK_ID]
    assert reason["optional"] is True


async def test_reject_on_a_card_that_needs_a_reason_makes_the_input_required(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    _, blocks = render_card(card(require_reject_reason=True))
    [actions] = [b for b in blocks if b["type"] == "actions"]

    await deliver(channel, reject_payload(block_id=actions["block_id"]), RecordingHandler())

    [call] = fake_slack.calls_to("views.open")
    [reason] = [b for b in call.args["view"]["blocks"] if b.get("block_id") == REASON_BLOCK_ID]
    assert reason["optional"] is False


async def test_redelivered_reject_does_not_reuse_the_trigger(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler()

    await deliver(channel, reject_payload(), handler)
    again = await deliver(channel, reject_payload(), handler, **{"X-Slack-Retry-Num": "1"})

    assert len(fake_slack.calls_to("views.open")) == 1
    assert again.after is None


async def test_failed_modal_tells_the_clicker(channel: SlackChannel, fake_slack: FakeSlack) -> None:
    fake_slack.fail_next("views.open", Scripted(200, "expired_trigger_id"))

    reply = await deliver(channel, reject_payload(), RecordingHandler())
    await finish(reply)

    assert reply.status_code == 200
    [note] = fake_slack.calls_to("chat.postEphemeral")
    assert note.args["user"] == "W111"
    assert "rejection form" in note.args["text"]


async def test_slow_modal_is_cut_off_inside_the_three_seconds(
    channel: SlackChannel, fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slack_channel_module, "_VIEWS_OPEN_TIMEOUT_SECONDS", 0.2)
    fake_slack.fail_next("views.open", Scripted(delay=2.0))

    reply = await deliver(channel, reject_payload(), RecordingHandler())

    assert len(fake_slack.calls_to("views.open")) == 1
    assert fake_slack.scripted_sent == [], "answered before Slack's slow views.open returned"
    await finish(reply)
    assert len(fake_slack.calls_to("chat.postEphemeral")) == 1


async def test_submitted_reason_rejects_and_closes_the_modal(
    channel: SlackChannel, fake_slack: FakeSlack
) -> None:
    handler = RecordingHandler()

    reply = await deliver(channel, submission_payload("Not during the freeze."), handler)

    assert reply.body == {"response_action": "clear"}
    [(_, click)] = handler.clicks
    assert (click.verdict, click.request_id, click.reason) == (
        Verdict.REJECT,
        "req-1",
        "Not during the freeze.",
    )
    await finish(reply)
    assert handler.enriched == [("ops-slack", "W111", "Primary Owner", None)]


async def test_refused_submission_shows_the_reason_on_the_form(channel: SlackChannel) -> None:
    handler = RecordingHandler(refuse("This gate needs a reason to reject."))

    reply = await deliver(channel, submission_payload(None), handler)

    assert reply.status_code == 200
    assert reply.body == {
        "response_action": "errors",
        "errors": {REASON_BLOCK_ID: "This gate needs a reason to reject."},
    }
    assert handler.clicks[0][1].reason is None


async def test_other_apps_view_submission_is_ignored(channel: SlackChannel) -> None:
    handler = RecordingHandler()

    reply = await deliver(channel, fixture("view_submission_bolt_python_input_block.json"), handler)

    assert (reply.body, reply.after, handler.clicks) == (None, None, [])


# -- callbacks: other payloads -----------------------------------------------------------------


async def test_url_verification_is_answered_after_verification(channel: SlackChannel) -> None:
    body = json.dumps(fixture("url_verification_slack_docs.json")).encode()

    reply = await channel.handle_callback(body, signed(body), RecordingHandler())

    assert reply.body == {"challenge": fixture("url_verification_slack_docs.json")["challenge"]}
    with pytest.raises(CallbackRejected):
        await channel.handle_callback(body, {}, RecordingHandler())


async def test_signed_ssl_check_is_answered(channel: SlackChannel) -> None:
    body = b"ssl_check=1&token=abc"

    reply = await channel.handle_callback(body, signed(body), RecordingHandler())

    assert (reply.status_code, reply.body) == (200, None)


@pytest.mark.parametrize("kind", ["view_closed", "interactive_message", "shortcut", "block_suggestion"])
async def test_unknown_payload_types_change_nothing(
    channel: SlackChannel, fake_slack: FakeSlack, kind: str
) -> None:
    handler = RecordingHandler()

    reply = await deliver(channel, approve_payload() | {"type": kind}, handler)

    assert (reply.status_code, reply.body, reply.after) == (200, None, None)
    assert handler.clicks == []
    assert fake_slack.calls == []


# -- Socket Mode -------------------------------------------------------------------------------


async def next_ack(fake: FakeSlack) -> dict[str, Any]:
    return await asyncio.wait_for(fake.acks.get(), timeout=5)


async def test_socket_mode_routes_envelopes_through_the_same_handler(
    slack_config_data: dict[str, Any], fake_slack: FakeSlack
) -> None:
    # Socket Mode alone: no signing secret (the webhook is not used)
    without = {k: v for k, v in slack_config_data.items() if k != "signing_secret"}
    ch = make_channel(without | {"app_token": APP_TOKEN})
    handler = RecordingHandler()
    try:
        await ch.start(handler)
        await asyncio.wait_for(fake_slack.socket_connected.wait(), timeout=5)
        [opened] = fake_slack.calls_to("apps.connections.open")
        assert opened.token == APP_TOKEN

        await fake_slack.send_envelope(
            {"envelope_id": "env-1", "type": "interactive", "payload": approve_payload()}
        )
        assert await next_ack(fake_slack) == {"envelope_id": "env-1"}
        assert [c.verdict for _, c in handler.clicks] == [Verdict.APPROVE]
        await eventually(lambda: handler.enriched)

        await fake_slack.send_envelope(
            {
                "envelope_id": "env-2",
                "type": "interactive",
                "payload": submission_payload("no"),
                "accepts_response_payload": True,
            }
        )
        assert await next_ack(fake_slack) == {"envelope_id": "env-2", "payload": {"response_action": "clear"}}
        assert [(c.verdict, c.reason) for _, c in handler.clicks][1] == (Verdict.REJECT, "no")

        await fake_slack.send_envelope(
            {"envelope_id": "env-3", "type": "events_api", "payload": {"event": {}}}
        )
        assert await next_ack(fake_slack) == {"envelope_id": "env-3"}
        assert len(handler.clicks) == 2
    finally:
        await ch.aclose()


async def test_start_without_an_app_token_does_nothing(channel: SlackChannel, fake_slack: FakeSlack) -> None:
    await channel.start(RecordingHandler())
    await asyncio.sleep(0.05)

    assert fake_slack.calls == []
