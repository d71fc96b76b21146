"""The Teams channel's I/O: the connector's REST calls and the messaging endpoint."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from signoff.channels._clicks import ClickTasks
from signoff.channels._contract import (
    CallbackRejected,
    CallbackReply,
    Card,
    ClickHandler,
    DeliveryError,
    MessageRef,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
)
from signoff.channels.teams._auth import BotToken, InvokeVerifier, bearer_token, retry_after
from signoff.channels.teams._card import invoke_response, message_activity, render_reminder
from signoff.channels.teams._config import TeamsConfig
from signoff.channels.teams._parse import EditRefused, base_conversation, loose, parse_invoke

__all__ = ["MAX_BODY_BYTES", "REPLY_BUDGET", "TeamsChannel"]

log = logging.getLogger("signoff.channels.teams")

MAX_BODY_BYTES = 256 * 1024
"""The largest activity the messaging endpoint reads (a card's inputs included)."""
REPLY_BUDGET = 4.0
"""Seconds a click may take before the invoke is answered anyway (Teams waits about 5 s)."""
_API_TIMEOUT = 10.0
_MAX_ERROR_CHARS = 200
_PATH_SAFE = ":@;=!$&'()*+,-._~"


def _path(conversation: str) -> str:
    return quote(conversation, safe=_PATH_SAFE)


def connector_error(operation: str, response: httpx.Response) -> DeliveryError:
    """A failed connector call as the outbox sees it: 429 and 5xx are retried (honouring
    ``Retry-After``), 401 too (with a new token); anything else is permanent and named."""
    status = response.status_code
    code, message = None, None
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
    detail = (
        f"HTTP {status}"
        + (f" {code}" if code else "")
        + (f": {str(message)[:_MAX_ERROR_CHARS]}" if message else "")
    )
    reason = f"Teams {operation} failed ({detail})"
    if status == 429 or status >= 500:
        return RetryableDeliveryError(reason, retry_after=retry_after(response))
    if status == 401:
        return RetryableDeliveryError(reason + " - the bot's token was refused; a new one is asked for")
    hints = {
        403: " - is the app installed in that team or chat, and the bot allowed to post there?",
        404: " - is conversation_id right, and the message still there?",
        400: " - Teams refused the card or the activity",
    }
    return PermanentDeliveryError(reason + hints.get(status, ""))


class TeamsChannel:
    """Posts approval cards to one Teams conversation and takes their ``Action.Execute`` invokes.

    Build it with :func:`signoff.channels.teams.create`. One httpx client for the token
    endpoint, the connector and the signing keys; no retries of its own (the outbox
    retries deliveries), and nothing slow on the invoke's path but the click itself.
    """

    type: str = "teams"

    def __init__(
        self,
        name: str,
        config: TeamsConfig,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        reply_budget: float = REPLY_BUDGET,
        key_cooldown: float | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._client = client or httpx.AsyncClient(timeout=_API_TIMEOUT, follow_redirects=False)
        self._own_client = client is None
        self._reply_budget = reply_budget
        self._token = BotToken(
            url=config.token_endpoint,
            app_id=config.app_id,
            password=config.app_password.get_secret_value(),
            scope=config.token_scope,
            client=self._client,
        )
        extra = {"cooldown": key_cooldown} if key_cooldown is not None else {}
        self._verifier = InvokeVerifier(
            app_id=config.app_id,
            metadata_url=config.openid_metadata_url,
            client=self._client,
            clock=clock,
            **extra,
        )
        self._clicks = ClickTasks("teams", name, log)

    @property
    def token(self) -> BotToken:
        return self._token

    # Sending

    async def _call(
        self, operation: str, method: str, url: str, body: Mapping[str, Any] | None = None
    ) -> Any:
        token = await self._token.get()
        try:
            response = await self._client.request(
                method, url, json=body, headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as exc:
            raise RetryableDeliveryError(f"Teams {operation} failed: {type(exc).__name__}") from exc
        if response.status_code == 401:
            self._token.forget(token)
        if not 200 <= response.status_code < 300:
            raise connector_error(operation, response)
        try:
            return response.json() if response.content else {}
        except (ValueError, UnicodeDecodeError):
            return {}

    def _activities(self, conversation: str) -> str:
        return f"{self.config.connector}/v3/conversations/{_path(conversation)}/activities"

    async def post(self, card: Card) -> MessageRef:
        """Post the card to the conversation; the reference is ``{"conversation", "activity_id"}``.
        Teams takes no idempotency key: a post whose answer was lost is posted again."""
        conversation = self.config.conversation_id
        answer = await self._call("post card", "POST", self._activities(conversation), message_activity(card))
        activity_id = answer.get("id") if isinstance(answer, dict) else None
        if not isinstance(activity_id, str) or not activity_id:
            raise PermanentDeliveryError("Teams post card answered without an activity id")
        return {"conversation": conversation, "activity_id": activity_id}

    async def update(self, ref: MessageRef, card: Card) -> None:
        """Put the redrawn card in place of the posted one (a decided card has no actions)."""
        conversation, activity_id = ref.get("conversation"), ref.get("activity_id")
        if not conversation or not activity_id:
            raise PermanentDeliveryError(f"not a Teams message reference: {sorted(ref)}")
        url = f"{self._activities(conversation)}/{quote(activity_id, safe='')}"
        await self._call("update card", "PUT", url, {**message_activity(card), "id": activity_id})

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Reply in the card's thread, @-mentioning ``waiting_on``. Teams takes no idempotency
        key: ``key`` is unused."""
        conversation, activity_id = ref.get("conversation"), ref.get("activity_id")
        if not conversation or not activity_id:
            raise PermanentDeliveryError(f"not a Teams message reference: {sorted(ref)}")
        thread = f"{base_conversation(conversation)};messageid={activity_id}"
        body = {**render_reminder(card, waiting_on), "replyToId": activity_id}
        await self._call("send reminder", "POST", self._activities(thread), body)

    def conversation_of(self, ref: MessageRef | None) -> str:
        """The conversation the card is in (without a thread's ``;messageid=``)."""
        conversation = ref.get("conversation") if ref else None
        return base_conversation(conversation or self.config.conversation_id)

    async def lookup_user(self, user_id: str) -> tuple[str | None, str | None]:
        """Name and email of a member of the conversation (``GET …/members/{id}``)."""
        conversation = _path(self.config.conversation_id)
        url = f"{self.config.connector}/v3/conversations/{conversation}/members/{quote(user_id, safe='')}"
        member = await self._call("look up member", "GET", url)
        if not isinstance(member, dict):
            return None, None
        name = member.get("name") if isinstance(member.get("name"), str) and member.get("name") else None
        email = next(
            (
                v
                for v in (member.get("email"), member.get("userPrincipalName"))
                if isinstance(v, str) and "@" in v
            ),
            None,
        )
        return name, email

    # Receiving

    async def handle_callback(
        self, body: bytes, headers: Mapping[str, str], handler: ClickHandler
    ) -> CallbackReply:
        """Verify the Bot Framework JWT, then apply an ``adaptiveCard/action`` invoke.

        The token is checked (signature, issuer, audience, validity) before the body is
        read at all; then the activity's ``serviceUrl`` and ``channelId`` against it. The
        invoke is answered with the card as it stands after the click, with a line for the
        clicker when it did not count. Other verified activities (the bot added to a team,
        a message to it) are acknowledged and their conversation id logged, for setting
        ``conversation_id``.
        """
        if len(body) > MAX_BODY_BYTES:
            raise CallbackRejected("activity too large", status_code=413)
        verified = await self._verifier.verify(bearer_token(headers))
        try:
            activity = json.loads(body)
        except (ValueError, RecursionError):
            raise CallbackRejected("activity is not JSON", status_code=400) from None
        if not isinstance(activity, dict):
            raise CallbackRejected("activity is not an object", status_code=400)
        verified.check_activity(service_url=activity.get("serviceUrl"), channel_id=activity.get("channelId"))
        if activity.get("type") != "invoke" or activity.get("name") != "adaptiveCard/action":
            conversation = activity.get("conversation")
            where = conversation.get("id") if isinstance(conversation, dict) else None
            log.info(
                "teams channel %s: %s activity from conversation %r",
                self.name,
                str(activity.get("type"))[:40],
                str(where)[:300],
            )
            return CallbackReply(body={})
        try:
            click = parse_invoke(activity, tenant_id=self.config.tenant_id)
        except EditRefused as exc:
            return await self._current(activity, handler, str(exc))
        task, fresh = self._clicks.start(click.event_id, lambda: handler.click(self.name, click))
        outcome = await self._clicks.outcome(task, self._reply_budget)
        if isinstance(outcome, str):
            return CallbackReply(body=_message(outcome))
        note = None if outcome.accepted else outcome.message
        after = (
            self._clicks.enrichment(handler, click.user_id, self.lookup_user)
            if fresh and outcome.accepted
            else None
        )
        return CallbackReply(body=invoke_response(outcome.card, note=note), after=after)

    async def _current(self, activity: Mapping[str, Any], handler: ClickHandler, note: str) -> CallbackReply:
        """The card as it stands, with ``note`` (an edit that could not be read)."""
        request_id = loose(loose(loose(activity.get("value")).get("action")).get("data")).get("request_id")
        card = await handler.current_card(self.name, request_id) if isinstance(request_id, str) else None
        if card is None:
            return CallbackReply(body=_message(note))
        return CallbackReply(body=invoke_response(card, note=note))

    # Lifecycle

    async def start(self, handler: ClickHandler) -> None:
        """Nothing to start: invokes arrive at the messaging endpoint."""

    async def aclose(self) -> None:
        """Let clicks in flight finish, then close the HTTP client."""
        await self._clicks.aclose()
        if self._own_client:
            await self._client.aclose()


def _message(text: str) -> dict[str, Any]:
    """An invoke answer Teams shows as a short message instead of a card."""
    return {"statusCode": 200, "type": "application/vnd.microsoft.activity.message", "value": text}
