"""Feishu long-connection mode: lark-oapi's WebSocket client against a loopback fake, in a running loop."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from typing import Any

import pytest

from signoff.channels.feishu import FeishuChannel
from tests.channels.feishu_fake import FakeFeishu, FakeLongConnection, ack_data
from tests.channels.feishu_support import RecordingHandler, buttons, card_action, fixture, make_channel
from tests.waiting import eventually


def ws_channel(fake: FakeFeishu, **config: Any) -> FeishuChannel:
    return make_channel(fake, mode="websocket", verification_token=None, encrypt_key=None, **config)


def long_connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "feishu-long-connection" and t.is_alive()]


async def test_click_over_the_long_connection_is_acked_with_toast_and_card(fake: FakeFeishu) -> None:
    import lark_oapi.ws.client as sdk_ws

    sdk_loop_before = sdk_ws.loop
    fake.add_user("ou_alice", name="Alice Chen", email="alice@example.com")
    handler = RecordingHandler()
    async with FakeLongConnection() as feishu_ws:
        fake.ws_url = feishu_ws.url
        channel = ws_channel(fake)
        # Inside a running loop, as under uvicorn: the SDK's own start() would fail here.
        await channel.start(handler)
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)

        ack = await feishu_ws.push(json.dumps(card_action("req-ws", event_id="ev-ws")).encode())

        assert ack["code"] == 200
        answer = ack_data(ack)
        assert answer["toast"] == {"type": "success", "content": "Recorded: approved."}
        assert answer["card"]["type"] == "raw"
        assert answer["card"]["data"]["schema"] == "2.0"
        assert buttons(answer["card"]["data"]) == []
        assert [(c.request_id, c.user_id) for c in handler.clicks] == [("req-ws", "ou_alice")]
        await eventually(
            lambda: handler.enriched == [("ops-feishu", "ou_alice", "Alice Chen", "alice@example.com")]
        )

        # A re-push of the same event (Feishu retries after 3 s) is answered without applying it again.
        again = await feishu_ws.push(
            json.dumps(card_action("req-ws", event_id="ev-ws")).encode(), message_id="m2"
        )
        assert ack_data(again) == answer
        assert len(handler.clicks) == 1

        await channel.aclose()
    assert long_connection_threads() == []
    assert sdk_ws.loop is sdk_loop_before
    endpoint = fake.calls("POST", "/callback/ws/endpoint")[0].json
    assert endpoint == {"AppID": channel.config.app_id, "AppSecret": "app-secret"}


async def test_a_dropped_connection_is_re_established(fake: FakeFeishu) -> None:
    handler = RecordingHandler()
    async with FakeLongConnection() as feishu_ws:
        fake.ws_url = feishu_ws.url
        channel = ws_channel(fake)
        await channel.start(handler)
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)
        await feishu_ws.drop()
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)
        ack = await feishu_ws.push(json.dumps(card_action(event_id="ev-after-drop")).encode())
        await channel.aclose()
    assert feishu_ws.connections == 2
    assert ack_data(ack)["toast"]["type"] == "success"
    assert len(fake.calls("POST", "/callback/ws/endpoint")) == 2


async def test_ack_payload_has_the_shape_lark_oapi_sends(fake: FakeFeishu) -> None:
    reference = fixture("ws_ack_frame_payload.card_action_trigger.generated.json")
    handler = RecordingHandler()
    async with FakeLongConnection() as feishu_ws:
        fake.ws_url = feishu_ws.url
        channel = ws_channel(fake)
        await channel.start(handler)
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)
        payload = json.loads(fixture("req.card_action_trigger.plain.json")["body_raw"])
        payload["event"]["action"]["value"] = {"request_id": "req-1", "verdict": "approve"}
        ack = await feishu_ws.push(json.dumps(payload).encode())
        await channel.aclose()
    assert set(ack) == set(reference)
    ours, theirs = ack_data(ack), json.loads(base64.b64decode(reference["data"]))
    assert set(ours) == set(theirs) == {"toast", "card"}
    assert ours["card"]["type"] == theirs["card"]["type"] == "raw"
    assert ours["card"]["data"]["schema"] == theirs["card"]["data"]["schema"] == "2.0"


async def test_webhook_and_long_connection_share_deduplication(fake: FakeFeishu) -> None:
    from tests.channels.feishu_support import signed_encrypted

    handler = RecordingHandler()
    async with FakeLongConnection() as feishu_ws:
        fake.ws_url = feishu_ws.url
        channel = make_channel(fake, mode="websocket")  # with callback credentials: both paths open
        await channel.start(handler)
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)
        webhook = await channel.handle_callback(*signed_encrypted(card_action(event_id="ev-both")), handler)
        pushed = await feishu_ws.push(json.dumps(card_action(event_id="ev-both")).encode())
        await channel.aclose()
    assert len(handler.clicks) == 1
    assert ack_data(pushed) == webhook.body


async def test_unusable_pushes_are_refused_without_applying(fake: FakeFeishu) -> None:
    handler = RecordingHandler()
    async with FakeLongConnection() as feishu_ws:
        fake.ws_url = feishu_ws.url
        channel = ws_channel(fake)
        await channel.start(handler)
        await asyncio.wait_for(feishu_ws.connected.wait(), 10)
        foreign = await feishu_ws.push(fixture("req.card_action_trigger.plain.json")["body_raw"].encode())
        other = card_action()
        other["header"]["event_type"] = "im.message.receive_v1"
        ignored = await feishu_ws.push(json.dumps(other).encode(), message_id="m2")
        await channel.aclose()
    assert foreign == {"code": 500}
    assert ignored == {"code": 200}
    assert handler.clicks == []


async def test_refused_credentials_are_logged_and_close_cleanly(
    fake: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    channel = ws_channel(fake)
    fake.apps[channel.config.app_id] = "rotated"
    fake.ws_url = "ws://127.0.0.1:9/ws"
    with caplog.at_level(logging.ERROR, logger="signoff.channels.feishu"):
        await channel.start(RecordingHandler())
        await eventually(lambda: "long connection refused" in caplog.text)
        await channel.aclose()
    assert long_connection_threads() == []


async def test_webhook_mode_starts_nothing(fake: FakeFeishu) -> None:
    channel = make_channel(fake)
    await channel.start(RecordingHandler())
    assert long_connection_threads() == []
    assert fake.calls("POST", "/callback/ws/endpoint") == []
    await channel.aclose()


async def test_two_long_connections_share_one_thread(fake: FakeFeishu) -> None:
    handler = RecordingHandler()
    async with FakeLongConnection() as first_ws, FakeLongConnection() as second_ws:
        fake.ws_url = first_ws.url
        first = ws_channel(fake)
        await first.start(handler)
        await asyncio.wait_for(first_ws.connected.wait(), 10)
        fake.ws_url = second_ws.url
        second = ws_channel(fake)
        await second.start(handler)
        await asyncio.wait_for(second_ws.connected.wait(), 10)
        assert len(long_connection_threads()) == 1

        await first.aclose()
        ack = await second_ws.push(json.dumps(card_action(event_id="ev-second")).encode())
        assert ack_data(ack)["toast"]["type"] == "success"
        await second.aclose()
    assert long_connection_threads() == []
