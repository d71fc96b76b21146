"""Feishu channel against a fake Open API on loopback: lark-oapi over real HTTP, errors included."""

from __future__ import annotations

import asyncio
import json

import pytest

from signoff.channels import PermanentDeliveryError, RetryableDeliveryError
from signoff.channels.feishu import FeishuChannel, api_error, render_card
from tests.channels.feishu_fake import MESSAGES_PATH, TOKEN_PATH, USERS_PATH, FakeFeishu
from tests.channels.feishu_support import (
    CHAT,
    RecordingHandler,
    buttons,
    card_action,
    decided,
    make_card,
    make_channel,
    signed_encrypted,
)


@pytest.fixture
async def channel(fake: FakeFeishu) -> FeishuChannel:
    return make_channel(fake)


def stored_card(fake: FakeFeishu, message_id: str) -> dict[str, object]:
    content: dict[str, object] = json.loads(fake.messages[message_id]["content"])
    return content


async def test_post_sends_an_interactive_card_to_the_chat(fake: FakeFeishu, channel: FeishuChannel) -> None:
    card = make_card(request_id="req-post")
    ref = await channel.post(card)

    assert set(ref) == {"message_id"}
    [token_call] = fake.calls("POST", TOKEN_PATH)
    assert token_call.json == {"app_id": channel.config.app_id, "app_secret": "app-secret"}
    [send] = fake.calls("POST", MESSAGES_PATH)
    assert send.query == {"receive_id_type": "chat_id"}
    assert send.headers["authorization"].startswith(f"Bearer t-{channel.config.app_id}-")
    assert send.headers["content-type"] == "application/json; charset=utf-8"
    body = send.json
    assert (body["receive_id"], body["msg_type"], body["uuid"]) == (CHAT, "interactive", "req-post")
    assert isinstance(body["content"], str)
    assert json.loads(body["content"]) == render_card(card)
    assert fake.messages[ref["message_id"]]["chat_id"] == CHAT


async def test_a_retried_post_does_not_duplicate_the_message(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    card = make_card(request_id="req-twice")
    first = await channel.post(card)
    second = await channel.post(card)
    assert first == second
    assert len(fake.messages) == 1
    assert len(fake.calls("POST", MESSAGES_PATH)) == 2
    # The tenant token is fetched once and cached by the SDK.
    assert len(fake.calls("POST", TOKEN_PATH)) == 1


async def test_long_request_ids_still_make_a_valid_uuid(fake: FakeFeishu, channel: FeishuChannel) -> None:
    await channel.post(make_card(request_id="r" * 80))
    uuid = fake.calls("POST", MESSAGES_PATH)[0].json["uuid"]
    assert 0 < len(uuid) <= 50


async def test_update_patches_the_card_and_removes_its_buttons(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    card = make_card()
    ref = await channel.post(card)
    assert buttons(stored_card(fake, ref["message_id"]))

    await channel.update(ref, decided(card, "rejected", reason="not this quarter"))

    [patch] = fake.calls("PATCH", MESSAGES_PATH)
    assert patch.path == f"{MESSAGES_PATH}/{ref['message_id']}"
    assert set(patch.json) == {"content"}
    stored = stored_card(fake, ref["message_id"])
    assert buttons(stored) == []
    assert stored["header"] == render_card(decided(card, "rejected", reason="not this quarter"))["header"]
    assert "Reason: not this quarter" in fake.messages[ref["message_id"]]["content"]


async def test_expired_and_cancelled_cards_are_redrawn_without_buttons(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    ref = await channel.post(make_card())
    for status in ("expired", "cancelled"):
        await channel.update(ref, make_card(status=status))
        assert buttons(stored_card(fake, ref["message_id"])) == []
    assert len(fake.messages[ref["message_id"]]["history"]) == 3


async def test_lookup_user(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.add_user("ou_alice", name="Alice Chen", email="alice@example.com")
    fake.add_user("ou_bob", name="Bob", email="", enterprise_email="bob@corp.example")
    assert await channel.lookup_user("ou_alice") == ("Alice Chen", "alice@example.com")
    assert await channel.lookup_user("ou_bob") == ("Bob", "bob@corp.example")
    call = fake.calls("GET", USERS_PATH)[0]
    assert (call.path, call.query) == (f"{USERS_PATH}ou_alice", {"user_id_type": "open_id"})


async def test_accepted_click_enriches_the_identity_afterwards(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    fake.add_user("ou_alice", name="Alice Chen", email="alice@example.com")
    handler = RecordingHandler()
    reply = await channel.handle_callback(*signed_encrypted(card_action()), handler)
    assert fake.calls("GET", USERS_PATH) == []  # nothing slow before the answer
    assert reply.after is not None
    await reply.after()
    assert handler.enriched == [("ops-feishu", "ou_alice", "Alice Chen", "alice@example.com")]


async def test_failed_lookup_skips_enrichment_quietly(fake: FakeFeishu, channel: FeishuChannel) -> None:
    handler = RecordingHandler()
    reply = await channel.handle_callback(*signed_encrypted(card_action(open_id="ou_unknown")), handler)
    assert reply.after is not None
    await reply.after()
    assert handler.enriched == []
    assert len(fake.calls("GET", USERS_PATH)) == 1


# Errors


async def test_rate_limit_is_retryable_with_retry_after(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.fail(
        "POST",
        MESSAGES_PATH,
        status=429,
        body={"code": 99991400, "msg": "request trigger frequency limit"},
        headers={"x-ogw-ratelimit-reset": "7"},
    )
    with pytest.raises(RetryableDeliveryError) as caught:
        await channel.post(make_card())
    assert caught.value.retry_after == 7.0
    assert "99991400" in caught.value.reason
    assert fake.messages == {}
    await channel.post(make_card())
    assert len(fake.messages) == 1


async def test_per_chat_limit_is_retryable(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.fail(
        "POST",
        MESSAGES_PATH,
        status=400,
        body={"code": 230020, "msg": "This operation triggers the frequency limit."},
    )
    with pytest.raises(RetryableDeliveryError) as caught:
        await channel.post(make_card())
    assert caught.value.retry_after is None


async def test_server_errors_that_are_not_json_are_retryable(
    fake: FakeFeishu, channel: FeishuChannel
) -> None:
    fake.fail("PATCH", MESSAGES_PATH, status=502, body="<html>502 Bad Gateway</html>")
    ref = await channel.post(make_card())
    with pytest.raises(RetryableDeliveryError, match="not JSON"):
        await channel.update(ref, make_card(status="expired"))


async def test_json_5xx_is_retryable(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.fail("POST", MESSAGES_PATH, status=500, body={"code": 1000004, "msg": "internal error"})
    with pytest.raises(RetryableDeliveryError, match="HTTP 500"):
        await channel.post(make_card())


async def test_bot_outside_the_chat_is_permanent(fake: FakeFeishu) -> None:
    channel = make_channel(fake, join=False)
    with pytest.raises(PermanentDeliveryError) as caught:
        await channel.post(make_card())
    assert "230002" in caught.value.reason
    assert "add the bot to the group" in caught.value.reason
    assert "log_id" in caught.value.reason


async def test_unknown_chat_is_permanent(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    del fake.chats[CHAT]  # the group was disbanded
    with pytest.raises(PermanentDeliveryError, match="230001"):
        await channel.post(make_card())


async def test_wrong_app_secret_is_permanent(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    fake.apps[channel.config.app_id] = "rotated-secret"
    with pytest.raises(PermanentDeliveryError) as caught:
        await channel.post(make_card())
    assert "tenant_access_token" in caught.value.reason
    assert "10014" in caught.value.reason
    assert fake.calls("POST", MESSAGES_PATH) == []


async def test_token_endpoint_outage_is_retryable(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.fail("POST", TOKEN_PATH, status=503, body="Service Unavailable")
    with pytest.raises(RetryableDeliveryError):
        await channel.post(make_card())
    await channel.post(make_card())
    assert len(fake.messages) == 1


async def test_revoked_token_is_dropped_from_the_sdk_cache(fake: FakeFeishu, channel: FeishuChannel) -> None:
    await channel.post(make_card(request_id="a"))
    fake.revoke_tokens()
    with pytest.raises(RetryableDeliveryError, match="99991663"):
        await channel.post(make_card(request_id="b"))
    await channel.post(make_card(request_id="b"))
    assert len(fake.calls("POST", TOKEN_PATH)) == 2
    assert len(fake.messages) == 2


async def test_patching_an_unknown_message_is_permanent(channel: FeishuChannel) -> None:
    with pytest.raises(PermanentDeliveryError, match="230001"):
        await channel.update({"message_id": "om_missing"}, make_card(status="expired"))
    with pytest.raises(PermanentDeliveryError, match="no message_id"):
        await channel.update({}, make_card(status="expired"))


async def test_unreachable_api_is_retryable(fake: FakeFeishu) -> None:
    channel = make_channel(fake, base_url="http://127.0.0.1:9")
    with pytest.raises(RetryableDeliveryError, match="ConnectionError"):
        await channel.post(make_card())


async def test_calls_do_not_block_the_event_loop(fake: FakeFeishu, channel: FeishuChannel) -> None:
    fake.slow("POST", MESSAGES_PATH, 0.5)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await channel.post(make_card())
    ticker.cancel()
    assert ticks >= 15


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, None, True),
        (400, 99991400, True),
        (400, 230020, True),
        (400, 11232, True),
        (503, None, True),
        (400, 99991663, True),
        (400, 230002, False),
        (400, 230099, False),
        (403, 99991672, False),
        (None, 10014, False),
        (400, 123456, False),
    ],
)
def test_error_classification(status: int | None, code: int | None, retryable: bool) -> None:
    error = api_error("send card", status=status, code=code, msg="m", headers={"Retry-After": "3"})
    assert isinstance(error, RetryableDeliveryError) is retryable
    assert isinstance(error, PermanentDeliveryError) is not retryable
    if retryable:
        assert error.retry_after == 3.0  # type: ignore[attr-defined]
