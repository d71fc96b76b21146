"""The Slack channel's I/O: the Web API client, the callback flow and Socket Mode."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from signoff.channels._contract import (
    CallbackRejected,
    CallbackReply,
    Card,
    Click,
    ClickHandler,
    ClickOutcome,
    DeliveryError,
    MessageRef,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
    Verdict,
    encodable,
)
from signoff.channels.slack import SlackConfig
from signoff.channels.slack._blocks import (
    ACTION_REJECT,
    REASON_BLOCK_ID,
    argument_view,
    edit_block_id,
    escape_mrkdwn,
    reason_required_by,
    render_card,
    render_edit_modal,
    render_reject_modal,
    render_reminder,
)
from signoff.channels.slack._payload import (
    EditPress,
    actions_of,
    click_from_block_actions,
    click_from_view_submission,
    edit_from_view_submission,
    edit_press,
    lower_headers,
    parse_payload,
    verify_request,
)

__all__ = ["PERMANENT_ERRORS", "TRANSIENT_ERRORS", "SlackChannel", "delivery_error"]

log = logging.getLogger("signoff.channels.slack")

TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
"""Slack error codes worth retrying. Any other code describes the request or the
installation and is permanent; these are the ones a misconfigured deployment hits:"""
PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "no_permission",
        "missing_scope",
        "msg_too_long",
        "invalid_blocks",
        "invalid_arguments",
        "message_not_found",
        "cant_update_message",
        "edit_window_closed",
        "restricted_action",
        "team_access_not_granted",
    }
)

_API_TIMEOUT_SECONDS = 10
# ``trigger_id`` expires three seconds after the click, and the acknowledgement
# has to go out within the same three seconds.
_VIEWS_OPEN_TIMEOUT_SECONDS = 2.5
_SEEN_EVENTS = 1024
_MAX_ERROR_CHARS = 300
_TRANSPORT_ERRORS = (SlackClientError, aiohttp.ClientError, TimeoutError, OSError)


def delivery_error(exc: Exception) -> DeliveryError:
    """Classify a failed Web API call for the outbox: retry later, or give up with the reason.

    429 / ``ratelimited`` carries ``Retry-After``; 5xx, transient error codes,
    network errors and timeouts are retryable; every other Slack error code
    (``channel_not_found``, ``invalid_auth``, …) is permanent and named.
    """
    if isinstance(exc, SlackApiError):
        status = int(getattr(exc.response, "status_code", 0) or 0)
        data = getattr(exc.response, "data", None)
        code = data.get("error") if isinstance(data, dict) else None
        if status == 429 or code == "ratelimited":
            return RetryableDeliveryError("ratelimited", retry_after=_retry_after(exc.response))
        if status >= 500:
            return RetryableDeliveryError(f"http_{status}" + (f": {code}" if code else ""))
        if isinstance(code, str) and code:
            if code in TRANSIENT_ERRORS:
                return RetryableDeliveryError(code)
            return PermanentDeliveryError(code)
        if status == 408:
            return RetryableDeliveryError("http_408")
        return PermanentDeliveryError(f"http_{status}")
    if isinstance(exc, SlackRequestError):
        return PermanentDeliveryError(f"invalid request: {exc}")
    if isinstance(exc, TimeoutError):
        return RetryableDeliveryError("timeout")
    return RetryableDeliveryError(f"network error: {type(exc).__name__}")


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None) or {}
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                seconds = float(value)
            except ValueError:
                return None
            return seconds if seconds >= 0 else None
    return None


class SlackChannel:
    """Posts approval cards to one Slack channel and takes clicks from its interactivity callbacks.

    One :class:`AsyncWebClient` per channel, built once from the configuration.
    Its retry handlers are off: the server's outbox retries deliveries and
    honours ``Retry-After`` itself, and nothing may sleep on the 3-second
    acknowledgement path.
    """

    type: str = "slack"

    def __init__(self, name: str, config: SlackConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._config = config
        self._clock = clock
        self._client = AsyncWebClient(
            token=config.bot_token.get_secret_value(),
            base_url=config.base_url or AsyncWebClient.BASE_URL,
            timeout=_API_TIMEOUT_SECONDS,
            retry_handlers=[],
        )
        self._socket: SocketModeClient | None = None
        self._socket_task: asyncio.Task[None] | None = None
        # Click keys seen lately, so a redelivered or double-clicked press does not
        # post a second ephemeral or try to reuse a spent trigger_id.
        self._seen: OrderedDict[str, None] = OrderedDict()

    async def post(self, card: Card) -> MessageRef:
        """Post ``card`` to the configured channel; the reference is ``{"channel", "ts"}``."""
        text, blocks = render_card(card)
        try:
            response = await self._client.chat_postMessage(
                channel=self._config.channel,
                text=text,
                blocks=blocks,
                unfurl_links=False,
                unfurl_media=False,
            )
        except _TRANSPORT_ERRORS as exc:
            raise delivery_error(exc) from exc
        channel, ts = response.get("channel"), response.get("ts")
        if not isinstance(channel, str) or not isinstance(ts, str):
            # Posted, but unaddressable: retrying would post a second card.
            raise PermanentDeliveryError("chat.postMessage answered without channel and ts")
        return {"channel": channel, "ts": ts}

    async def update(self, ref: MessageRef, card: Card) -> None:
        """Redraw a posted card (a decided card loses its buttons) with ``chat.update``."""
        channel, ts = ref.get("channel"), ref.get("ts")
        if not channel or not ts:
            raise PermanentDeliveryError(f"not a Slack message reference: {sorted(ref)}")
        text, blocks = render_card(card)
        try:
            await self._client.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
        except _TRANSPORT_ERRORS as exc:
            raise delivery_error(exc) from exc

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Reply in the card's thread (``chat.postMessage`` with ``thread_ts``), mentioning
        ``waiting_on``; needs no scope beyond ``chat:write``. Slack takes no idempotency key:
        ``key`` is unused (a reply whose answer was lost is sent again)."""
        channel, ts = ref.get("channel"), ref.get("ts")
        if not channel or not ts:
            raise PermanentDeliveryError(f"not a Slack message reference: {sorted(ref)}")
        try:
            await self._client.chat_postMessage(
                channel=channel,
                thread_ts=ts,
                text=render_reminder(card, waiting_on),
                unfurl_links=False,
                unfurl_media=False,
            )
        except _TRANSPORT_ERRORS as exc:
            raise delivery_error(exc) from exc

    async def handle_callback(
        self, body: bytes, headers: Mapping[str, str], handler: ClickHandler
    ) -> CallbackReply:
        """Verify the signature, then parse and apply one interactivity callback.

        Answers at once: Approve is applied before the reply, Reject opens the
        reason modal before the reply, and the reply's ``after`` does the slow
        work (telling a refused clicker why, looking the clicker up).
        """
        secret = self._config.signing_secret
        if secret is None:
            raise CallbackRejected("this channel receives clicks over Socket Mode (no signing_secret)")
        verify_request(body, headers, secret.get_secret_value(), self._clock())
        payload = parse_payload(body)
        retry = lower_headers(headers).get("x-slack-retry-num")
        if retry is not None:
            # Harmless (event ids repeat, the server ignores a second vote); logged
            # because Slack does not document whether interactivity is ever redelivered.
            log.info("slack channel %s: redelivery #%s of a callback", self.name, retry)
        return await self._dispatch(payload, handler)

    async def start(self, handler: ClickHandler) -> None:
        """Connect over Socket Mode when an app-level token is configured; otherwise do nothing.

        Returns at once: slack-sdk connects, and reconnects, in the background.
        """
        if self._config.app_token is None or self._socket is not None:
            return
        socket = SocketModeClient(
            app_token=self._config.app_token.get_secret_value(),
            web_client=self._client,
            logger=log,
        )
        socket.socket_mode_request_listeners.append(partial(self._on_socket_request, handler))
        self._socket = socket
        # slack-sdk leaves its Socket Mode coroutines unannotated.
        connecting = socket.connect()  # type: ignore[no-untyped-call]
        self._socket_task = asyncio.create_task(connecting, name=f"slack-socket-mode-{self.name}")

    async def aclose(self) -> None:
        """Close the Socket Mode connection, if any (Web API sessions are per call)."""
        socket, task = self._socket, self._socket_task
        self._socket, self._socket_task = None, None
        if task is not None and not task.done():
            task.cancel()
        if socket is not None:
            await socket.close()  # type: ignore[no-untyped-call]
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _dispatch(self, payload: Mapping[str, Any], handler: ClickHandler) -> CallbackReply:
        """The one handler behind both the webhook and Socket Mode."""
        kind = payload.get("type")
        if kind == "block_actions":
            return await self._on_block_actions(payload, handler)
        if kind == "view_submission":
            return await self._on_view_submission(payload, handler)
        if kind == "url_verification":
            challenge = str(payload.get("challenge", ""))
            if not encodable(challenge):
                raise CallbackRejected("url_verification with a challenge that is not text", status_code=400)
            return CallbackReply(body={"challenge": challenge})
        return CallbackReply()

    async def _on_block_actions(self, payload: Mapping[str, Any], handler: ClickHandler) -> CallbackReply:
        press = edit_press(payload)
        if press is not None:
            return await self._open_edit(press, handler)
        click = click_from_block_actions(payload)
        if click is None:
            return CallbackReply()
        first = self._first_sighting(click.event_id)
        channel_id = click.identity.get("channel_id")
        if click.verdict is Verdict.APPROVE:
            outcome = await handler.click(self.name, click)
            return CallbackReply(after=partial(self._after_click, handler, click, outcome, channel_id, first))
        if not first:
            return CallbackReply()
        trigger_id = payload.get("trigger_id")
        if not isinstance(trigger_id, str) or not trigger_id:
            return CallbackReply(
                after=partial(self._tell, channel_id, click.user_id, "Could not open the rejection form.")
            )
        block_id = next(
            (a.get("block_id") for a in actions_of(payload) if a.get("action_id") == ACTION_REJECT), None
        )
        view = render_reject_modal(
            click.request_id,
            reason_required=isinstance(block_id, str) and reason_required_by(block_id),
            channel_id=channel_id,
        )
        try:
            async with asyncio.timeout(_VIEWS_OPEN_TIMEOUT_SECONDS):
                await self._client.views_open(trigger_id=trigger_id, view=view)
        except _TRANSPORT_ERRORS as exc:
            log.warning("slack channel %s: views.open failed: %s", self.name, delivery_error(exc).reason)
            message = "Could not open the rejection form in time; please click Reject again."
            return CallbackReply(after=partial(self._tell, channel_id, click.user_id, message))
        return CallbackReply()

    async def _open_edit(self, press: EditPress, handler: ClickHandler) -> CallbackReply:
        """Open the "Edit and approve" modal with the request's current values (within the
        trigger's three seconds); a request no longer open to changes is said so instead."""
        if not self._first_sighting(press.event_id):
            return CallbackReply()
        card = await handler.current_card(self.name, press.request_id)
        message = None
        if card is None or not card.is_pending:
            message = "This request is no longer pending."
        elif not card.editable:
            message = "This request's arguments cannot be changed here."
        elif not argument_view(card).complete:
            message = "This call does not fit on a card; open it in Signoff to see it whole and decide there."
        elif press.trigger_id is None:
            message = "Could not open the edit form."
        if message is not None or card is None:
            text = message or "This request no longer exists."
            return CallbackReply(after=partial(self._tell, press.channel_id, press.user_id, text))
        view = render_edit_modal(card, channel_id=press.channel_id)
        try:
            async with asyncio.timeout(_VIEWS_OPEN_TIMEOUT_SECONDS):
                await self._client.views_open(trigger_id=press.trigger_id, view=view)
        except _TRANSPORT_ERRORS as exc:
            log.warning("slack channel %s: views.open failed: %s", self.name, delivery_error(exc).reason)
            text = "Could not open the edit form in time; please click Edit and approve again."
            return CallbackReply(after=partial(self._tell, press.channel_id, press.user_id, text))
        return CallbackReply()

    async def _on_view_submission(self, payload: Mapping[str, Any], handler: ClickHandler) -> CallbackReply:
        edited = edit_from_view_submission(payload)
        if edited is not None:
            # Refusals are shown on the modal, over its first input.
            if edited.click is None:
                errors = {edit_block_id(0): (edited.problem or "")[:_MAX_ERROR_CHARS]}
                return CallbackReply(body={"response_action": "errors", "errors": errors})
            outcome = await handler.click(self.name, edited.click)
            after = partial(self._enrich, handler, edited.click.user_id)
            if outcome.answer.ok:
                return CallbackReply(body={"response_action": "clear"}, after=after)
            errors = {edit_block_id(0): outcome.message[:_MAX_ERROR_CHARS]}
            return CallbackReply(body={"response_action": "errors", "errors": errors}, after=after)
        click = click_from_view_submission(payload)
        if click is None:
            return CallbackReply()
        outcome = await handler.click(self.name, click)
        after = partial(self._enrich, handler, click.user_id)
        if outcome.answer.ok:  # recorded, or the same decision again: the modal closes
            return CallbackReply(body={"response_action": "clear"}, after=after)
        errors = {REASON_BLOCK_ID: outcome.message[:_MAX_ERROR_CHARS]}
        return CallbackReply(body={"response_action": "errors", "errors": errors}, after=after)

    async def _after_click(
        self,
        handler: ClickHandler,
        click: Click,
        outcome: ClickOutcome,
        channel_id: str | None,
        first: bool,
    ) -> None:
        if not outcome.accepted and first:
            await self._tell(channel_id, click.user_id, outcome.message)
        await self._enrich(handler, click.user_id)

    async def _tell(self, channel_id: str | None, user_id: str, text: str) -> None:
        """An ephemeral note to the clicker; a Home-tab click has no channel to put it in."""
        if channel_id is None:
            return
        try:
            await self._client.chat_postEphemeral(channel=channel_id, user=user_id, text=escape_mrkdwn(text))
        except _TRANSPORT_ERRORS as exc:
            log.warning(
                "slack channel %s: chat.postEphemeral failed: %s", self.name, delivery_error(exc).reason
            )

    def conversation_of(self, ref: MessageRef | None) -> str:
        """The Slack channel id the card is in: as ``chat.postMessage`` answered, or the
        configured one for a card not posted yet."""
        channel = ref.get("channel") if ref else None
        return channel or self._config.channel

    async def lookup_user(self, user_id: str) -> tuple[str | None, str | None]:
        """The clicker's name and email (``users.info``; the email needs ``users:read.email``)."""
        try:
            response = await self._client.users_info(user=user_id)
        except _TRANSPORT_ERRORS as exc:
            raise delivery_error(exc) from exc
        user = response.get("user")
        if not isinstance(user, dict):
            return None, None
        profile = user.get("profile")
        if not isinstance(profile, dict):
            profile = {}
        name = _first_text(
            profile.get("real_name"), user.get("real_name"), profile.get("display_name"), user.get("name")
        )
        return name, _first_text(profile.get("email"))

    async def _enrich(self, handler: ClickHandler, user_id: str) -> None:
        """Look the clicker up and hand their name and email to the server."""
        try:
            name, email = await self.lookup_user(user_id)
        except DeliveryError as exc:
            log.warning("slack channel %s: users.info failed: %s", self.name, exc.reason)
            return
        if name is None and email is None:
            return
        await handler.enrich_identity(self.name, user_id, name=name, email=email)

    async def _on_socket_request(
        self, handler: ClickHandler, client: AsyncBaseSocketModeClient, request: SocketModeRequest
    ) -> None:
        reply = CallbackReply()
        if request.type == "interactive":
            reply = await self._dispatch(request.payload, handler)
        # The envelope ack is Socket Mode's HTTP 200; a view_submission's response_action rides on it.
        body = dict(reply.body) if reply.body else None
        await client.send_socket_mode_response(
            SocketModeResponse(envelope_id=request.envelope_id, payload=body)
        )
        if reply.after is not None:
            await reply.after()

    def _first_sighting(self, key: str | None) -> bool:
        if key is None:
            return True
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > _SEEN_EVENTS:
            self._seen.popitem(last=False)
        return True


def _first_text(*values: Any) -> str | None:
    """Slack profile fields may be missing, null or empty; take the first real one."""
    for value in values:
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None
