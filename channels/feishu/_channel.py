"""The Feishu / Lark channel: thin I/O around the pure render, verify and parse functions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import SecretStr

from signoff.channels._clicks import RECORDING, ClickTasks
from signoff.channels._contract import (
    CallbackRejected,
    CallbackReply,
    Card,
    ClickHandler,
    MessageRef,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
    encodable,
)
from signoff.channels.feishu._card import ToastType, callback_body, render_card, render_reminder
from signoff.channels.feishu._config import FeishuConfig
from signoff.channels.feishu._errors import TOKEN_INVALID_CODES, api_error
from signoff.channels.feishu._parse import EditRefused, parse_click
from signoff.channels.feishu._security import CallbackKind, classify, verify_callback
from signoff.channels.feishu._ws import LongConnection

__all__ = ["REPLY_BUDGET", "FeishuChannel"]

logger = logging.getLogger("signoff.channels.feishu")

REPLY_BUDGET = 2.5
"""Seconds a click may take before the callback is answered anyway (Feishu waits 3 s)."""
_UUID_MAX = 50

T = TypeVar("T")


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def _message_uuid(request_id: str) -> str:
    # Feishu de-duplicates sends by uuid for an hour; it accepts at most 50 characters.
    if len(request_id) <= _UUID_MAX:
        return request_id
    return hashlib.sha256(request_id.encode()).hexdigest()[:_UUID_MAX]


class FeishuChannel:
    """Posts approval cards to one Feishu / Lark group chat and receives their clicks.

    Build it with :func:`signoff.channels.feishu.create`. lark-oapi is synchronous (its
    ``a*`` methods still fetch the tenant token synchronously), so every API call
    runs in a worker thread and never blocks the event loop.
    """

    type: str = "feishu"

    def __init__(
        self,
        name: str,
        config: FeishuConfig,
        client: Any,
        *,
        clock: Callable[[], float] = time.time,
        reply_budget: float = REPLY_BUDGET,
    ) -> None:
        self.name = name
        self.config = config
        self._client = client
        self._clock = clock
        self._reply_budget = reply_budget
        self._clicks = ClickTasks("Feishu", name, logger)
        self._connection: LongConnection | None = None

    # Sending

    async def post(self, card: Card) -> MessageRef:
        """Send the card to the chat, with the request id as the idempotency ``uuid``."""
        from lark_oapi.api.im.v1 import CreateMessageRequest, CreateMessageRequestBody

        request = (
            CreateMessageRequest.builder()
            .receive_id_type("chat_id")
            .request_body(
                CreateMessageRequestBody.builder()
                .receive_id(self.config.chat_id)
                .msg_type("interactive")
                .content(json.dumps(render_card(card), ensure_ascii=False))
                .uuid(_message_uuid(card.request_id))
                .build()
            )
            .build()
        )
        response = await self._call("send card", lambda: self._client.im.v1.message.create(request))
        message_id = getattr(response.data, "message_id", None)
        if not message_id:
            # The uuid makes a second attempt safe: Feishu returns the same message.
            raise RetryableDeliveryError("Feishu send card succeeded without a message_id")
        return {"message_id": message_id}

    async def update(self, ref: MessageRef, card: Card) -> None:
        """Redraw a posted card in place (``PATCH im/v1/messages``); decided cards have no buttons."""
        from lark_oapi.api.im.v1 import PatchMessageRequest, PatchMessageRequestBody

        message_id = ref.get("message_id")
        if not message_id:
            raise PermanentDeliveryError("message reference has no message_id")
        request = (
            PatchMessageRequest.builder()
            .message_id(message_id)
            .request_body(
                PatchMessageRequestBody.builder()
                .content(json.dumps(render_card(card), ensure_ascii=False))
                .build()
            )
            .build()
        )
        await self._call("update card", lambda: self._client.im.v1.message.patch(request))

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Reply to the card (``POST im/v1/messages/:message_id/reply``) with a ``post`` message
        that @-mentions ``waiting_on``; ``key`` is its idempotency ``uuid``, so a retried
        reminder is sent once."""
        from lark_oapi.api.im.v1 import ReplyMessageRequest, ReplyMessageRequestBody

        message_id = ref.get("message_id")
        if not message_id:
            raise PermanentDeliveryError("message reference has no message_id")
        request = (
            ReplyMessageRequest.builder()
            .message_id(message_id)
            .request_body(
                ReplyMessageRequestBody.builder()
                .msg_type("post")
                .content(json.dumps(render_reminder(card, waiting_on), ensure_ascii=False))
                .uuid(_message_uuid(key))
                .build()
            )
            .build()
        )
        await self._call("send reminder", lambda: self._client.im.v1.message.reply(request))

    def conversation_of(self, ref: MessageRef | None) -> str:
        """The group chat the card is in: the one this channel posts to."""
        return self.config.chat_id

    async def lookup_user(self, open_id: str) -> tuple[str | None, str | None]:
        """Name and email of a user (``contact.v3.user.get``), ``None`` where not visible to the app."""
        from lark_oapi.api.contact.v3 import GetUserRequest

        request = GetUserRequest.builder().user_id(open_id).user_id_type("open_id").build()
        response = await self._call("look up user", lambda: self._client.contact.v3.user.get(request))
        user = getattr(response.data, "user", None)
        name = getattr(user, "name", None) or None
        email = getattr(user, "email", None) or getattr(user, "enterprise_email", None) or None
        return name, email

    async def _call(self, operation: str, call: Callable[[], T]) -> T:
        return await asyncio.to_thread(self._call_sync, operation, call)

    def _call_sync(self, operation: str, call: Callable[[], T]) -> T:
        from lark_oapi.core.exception import ObtainAccessTokenException

        try:
            response: Any = call()
        except ObtainAccessTokenException as exc:
            raise api_error(
                f"{operation} (tenant_access_token)", status=None, code=exc.code, msg=exc.msg
            ) from exc
        except OSError as exc:  # requests' ConnectionError, Timeout, … are OSErrors
            raise RetryableDeliveryError(f"Feishu {operation} failed: {type(exc).__name__}") from exc
        except ValueError as exc:
            # A proxy or gateway answered with something that is not JSON (an HTML 502 page).
            raise RetryableDeliveryError(f"Feishu {operation} failed: response was not JSON") from exc
        except Exception as exc:
            logger.exception("Feishu channel %s: unexpected error during %s", self.name, operation)
            raise RetryableDeliveryError(f"Feishu {operation} failed: {type(exc).__name__}") from exc
        if response.success():
            return response  # type: ignore[no-any-return]
        if response.code in TOKEN_INVALID_CODES:
            self._forget_token()
        raw = response.raw
        headers: Mapping[str, str] = getattr(raw, "headers", None) or {}
        # The SDK looks the log id up with exact case; HTTP/1.1 servers may send it lower-cased.
        log_id = next((value for key, value in headers.items() if key.lower() == "x-tt-logid"), None)
        raise api_error(
            operation,
            status=getattr(raw, "status_code", None),
            code=response.code,
            msg=response.msg,
            headers=headers,
            log_id=log_id,
        )

    def _forget_token(self) -> None:
        # The SDK caches tenant tokens process-wide by app_id until shortly before
        # expiry; a revoked token would otherwise be reused for up to two hours.
        from lark_oapi.core.token.manager import TokenManager

        TokenManager.cache.set(f"self_tenant_token:{self.config.app_id}", "", 0)

    # Receiving

    async def handle_callback(
        self, body: bytes, headers: Mapping[str, str], handler: ClickHandler
    ) -> CallbackReply:
        """Verify (signature and timestamp before decryption), decrypt, check the token, then act.

        ``url_verification`` is answered with its challenge; a card click is
        applied through ``handler`` and answered within the reply budget with a
        toast and the redrawn card. Raises :class:`CallbackRejected` for anything
        that fails verification or does not parse; nothing is applied then.
        """
        verified = verify_callback(
            body,
            headers,
            encrypt_key=_secret(self.config.encrypt_key),
            verification_token=_secret(self.config.verification_token),
            now=self._clock(),
            allow_unsigned=self.config.allow_unsigned,
        )
        if verified.kind is CallbackKind.URL_VERIFICATION:
            challenge = verified.payload.get("challenge")
            if not isinstance(challenge, str) or not encodable(challenge):
                raise CallbackRejected("url_verification without a challenge", status_code=400)
            return CallbackReply(body={"challenge": challenge})
        if verified.kind is CallbackKind.CARD_ACTION:
            return await self._apply_click(verified.payload, handler, legacy=False)
        if verified.kind is CallbackKind.LEGACY_CARD_ACTION:
            return await self._apply_click(verified.payload, handler, legacy=True)
        return CallbackReply(body={})

    async def _handle_pushed(self, payload: bytes, handler: ClickHandler) -> Mapping[str, Any] | None:
        """A long-connection push: already authenticated by the connection, plaintext JSON."""
        try:
            data = json.loads(payload)
        except ValueError:
            raise CallbackRejected("pushed event is not JSON", status_code=400) from None
        if not isinstance(data, dict) or classify(data) is not CallbackKind.CARD_ACTION:
            return None
        reply = await self._apply_click(data, handler, legacy=False)
        if reply.after is not None:
            self._clicks.spawn(reply.after())
        return reply.body

    async def _apply_click(
        self, payload: Mapping[str, Any], handler: ClickHandler, *, legacy: bool
    ) -> CallbackReply:
        try:
            click = parse_click(payload, legacy=legacy)
        except EditRefused as exc:
            return CallbackReply(body=callback_body("warning", str(exc)))
        task, fresh = self._clicks.start(click.event_id, lambda: handler.click(self.name, click))
        outcome = await self._clicks.outcome(task, self._reply_budget)
        if isinstance(outcome, str):
            return CallbackReply(body=callback_body("info" if outcome == RECORDING else "error", outcome))
        if legacy:
            # The old callback answers with the card itself.
            body: Mapping[str, Any] = render_card(outcome.card)
        else:
            # The callback contract as a toast: recorded, the same decision again (as it
            # stands), or why not (decided otherwise, expired or cancelled, refused).
            kind: ToastType = "success" if outcome.accepted else "info" if outcome.answer.ok else "warning"
            body = callback_body(kind, outcome.message, outcome.card)
        after = (
            self._clicks.enrichment(handler, click.user_id, self.lookup_user)
            if fresh and outcome.accepted
            else None
        )
        return CallbackReply(body=body, after=after)

    # Lifecycle

    async def start(self, handler: ClickHandler) -> None:
        """Open the long connection when ``mode`` is ``websocket``; a webhook channel does nothing."""
        if self.config.mode != "websocket" or self._connection is not None:
            return
        secret = self.config.app_secret.get_secret_value()
        self._connection = LongConnection(
            channel_name=self.name,
            app_id=self.config.app_id,
            app_secret=secret,
            origin=self.config.api_origin,
            handle=lambda payload: self._handle_pushed(payload, handler),
            answer_timeout=self._reply_budget + 0.5,
        )
        await self._connection.start()

    async def aclose(self) -> None:
        """Close the long connection and let clicks in flight finish."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.stop()
        await self._clicks.aclose()
