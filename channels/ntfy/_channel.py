"""The ntfy channel's I/O: JSON publishes over httpx, and the actions' callbacks."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

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
)
from signoff.channels.email._links import MAX_TOKEN_CHARS, LinkSigner, LinkToken
from signoff.channels.ntfy import TOPIC, NtfyConfig
from signoff.channels.ntfy._message import Notification, render_notification

__all__ = ["TOKEN_GRACE_SECONDS", "NtfyChannel", "answer_body", "publish_error"]

log = logging.getLogger("signoff.channels.ntfy")

TOKEN_GRACE_SECONDS = 86400
"""How long after the request's deadline an action's token is still read: a tap that comes
late is answered with the request as it stands (410 expired, 409 decided), not as a bad token."""
_REMEMBERED_POSTS = 1024
_MAX_ERROR_CHARS = 200


def _said(response: httpx.Response) -> str:
    """What ntfy said about a refused publish: its JSON error (``{"code", "http", "error"}``),
    else the start of the body."""
    try:
        data = response.json()
    except ValueError:
        data = None
    text = data.get("error") if isinstance(data, dict) else None
    if not isinstance(text, str):
        text = response.text
    return f"{response.status_code} {' '.join(text.split())[:_MAX_ERROR_CHARS]}".strip()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def publish_error(response: httpx.Response, whom: str) -> DeliveryError:
    """Classify a refused publish for the outbox: 429 (ntfy's rate limits) and 5xx are
    retried (honouring ``Retry-After`` when sent); 401 and 403 name the token and the
    topic's access; any other 4xx is permanent. ``whom`` names the recipient, never their
    topic (it is a secret)."""
    code, said = response.status_code, _said(response)
    if code == 429:
        return RetryableDeliveryError(
            f"ntfy rate-limited the notification to {whom}: {said}", retry_after=_retry_after(response)
        )
    if code >= 500:
        return RetryableDeliveryError(f"ntfy failed the notification to {whom}: {said}")
    if code in (401, 403):
        return PermanentDeliveryError(
            f"ntfy refused the notification to {whom} ({said}): give the channel a `token` that may "
            "write to that person's topic (ntfy access, ntfy token)"
        )
    return PermanentDeliveryError(f"ntfy refused the notification to {whom}: {said}")


def answer_body(outcome: ClickOutcome) -> dict[str, Any]:
    """The JSON an action's callback answers with: the contract's answer, the request's
    state and who decided it, and the line for the person."""
    card = outcome.card
    decided_by = card.decided_by.name if card.decided_by is not None else None
    return {
        "answer": outcome.answer.value,
        "status": card.status,
        "decided_by": decided_by,
        "message": outcome.message,
    }


class NtfyChannel:
    """Publishes one notification per approver to their topic; decisions come back as the
    notifications' ``http`` actions on ``POST /callbacks/ntfy/{channel}``.

    A notification cannot be redrawn: a decided request sends nothing, and an action tapped
    later is answered with the request as it stands. Topics a post already reached are
    remembered (per process) while the post is retried, so a temporary failure for one
    approver does not notify the others again; after a crash they may get it twice, and a
    second tap is answered as the first.
    """

    type = "ntfy"

    def __init__(
        self,
        name: str,
        config: NtfyConfig,
        links: LinkSigner,
        *,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._links = links
        self._http = http
        self._own_http = http is None
        self._clock = clock or (lambda: datetime.now(UTC))
        self._sent: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.callback_url = f"{links.base_url}/callbacks/ntfy/{quote(name, safe='')}"

    # --- sending ---------------------------------------------------------------------------

    def _token(self, card: Card, topic: str, verdict: Verdict) -> str:
        expires = int(card.expires_at.timestamp()) + TOKEN_GRACE_SECONDS
        # The topic is sealed: the Reject… page's URL carries this token (browser history).
        token = LinkToken(card.request_id, self.name, topic, verdict, expires)
        return self._links.sign(token, seal_recipient=True)

    def notification(self, card: Card, person: Person, *, reminder: bool = False) -> Notification:
        """What ``person`` (``user_id``: their topic) is sent for ``card``."""
        assert person.user_id is not None
        topic = person.user_id
        reject = self._token(card, topic, Verdict.REJECT)
        return render_notification(
            card,
            topic=topic,
            callback_url=self.callback_url,
            approve_token=self._token(card, topic, Verdict.APPROVE),
            reject_token=reject,
            reject_page=f"{self._links.base_url}/approve/{reject}",
            now=self._clock(),
            priority=self._config.priority,
            reminder=reminder,
        )

    @staticmethod
    def _recipients(people: tuple[Person, ...]) -> list[Person]:
        seen: dict[str, Person] = {}
        for person in people:
            topic = (person.user_id or "").strip()
            if TOPIC.match(topic) and topic not in seen:
                seen[topic] = Person(person.name, topic)
        return list(seen.values())

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._config.timeout_seconds)
        return self._http

    async def _publish(self, notification: Notification, whom: str) -> str:
        """Publish ``notification``; ntfy's message id. Raises a :class:`DeliveryError`."""
        headers = {"Content-Type": "application/json"}
        if self._config.token is not None:
            headers["Authorization"] = f"Bearer {self._config.token.get_secret_value()}"
        try:
            response = await self._client().post(
                f"{self._config.server}/",
                json=notification.as_json(),
                headers=headers,
                timeout=self._config.timeout_seconds,
            )
        except httpx.TimeoutException:
            raise RetryableDeliveryError(
                f"ntfy did not answer in time for the notification to {whom}"
            ) from None
        except httpx.HTTPError as exc:
            raise RetryableDeliveryError(
                f"cannot reach the ntfy server: {type(exc).__name__}: {exc}"[:300]
            ) from None
        if response.status_code != 200:
            raise publish_error(response, whom)
        try:
            data = response.json()
        except ValueError:
            data = None
        ident = data.get("id") if isinstance(data, dict) else None
        return str(ident) if ident else ""

    async def _notify(
        self, card: Card, recipients: list[Person], batch: str, *, reminder: bool = False
    ) -> dict[str, str]:
        """Notify ``recipients`` of ``card`` once each across retries of ``batch`` (a post, or
        one reminder): ntfy's message ids by topic. Raises when a retry could reach someone,
        or when nobody could be reached."""
        sent = self._sent.setdefault(batch, {})
        self._sent.move_to_end(batch)
        while len(self._sent) > _REMEMBERED_POSTS:
            self._sent.popitem(last=False)
        failed: dict[str, DeliveryError] = {}
        for person in recipients:
            assert person.user_id is not None
            if person.user_id in sent:
                continue
            whom = person.name
            try:
                sent[person.user_id] = await self._publish(
                    self.notification(card, person, reminder=reminder), whom
                )
            except DeliveryError as exc:
                failed[person.user_id] = exc
                if isinstance(exc, RetryableDeliveryError):
                    break  # rate-limited or unwell: the others wait for the retry too
        retry = [e for e in failed.values() if isinstance(e, RetryableDeliveryError)]
        if retry:
            delays = [e.retry_after for e in retry if e.retry_after is not None]
            raise RetryableDeliveryError(
                "; ".join(e.reason for e in retry)[:1000], retry_after=max(delays) if delays else None
            )
        if not sent:
            raise PermanentDeliveryError("; ".join(e.reason for e in failed.values())[:1000])
        for error in failed.values():
            log.warning("ntfy notification for %s refused: %s", card.request_id, error.reason)
        self._sent.pop(batch, None)
        return sent

    async def post(self, card: Card) -> MessageRef:
        if not card.is_pending:
            return {"request_id": card.request_id, "message_ids": ""}
        recipients = self._recipients(card.approvers)
        if not recipients:
            raise PermanentDeliveryError(
                "no approver of this gate has an ntfy topic (an ntfy channel notifies only listed "
                "approvers: give each an `ntfy: <topic>` in people)"
            )
        sent = await self._notify(card, recipients, card.request_id)
        # The reference names people and ntfy's message ids, never the topics (secrets).
        return {
            "request_id": card.request_id,
            "message_ids": " ".join(sent[p.user_id] for p in recipients if p.user_id in sent),
            "recipients": ", ".join(p.name for p in recipients if p.user_id in sent),
        }

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Notify each of ``waiting_on`` again, with actions of their own: a reminder, or (for
        approvers an escalation added) the request reaching them for the first time."""
        if not card.is_pending:
            return
        recipients = self._recipients(waiting_on)
        if recipients:
            await self._notify(card, recipients, key, reminder=True)

    async def update(self, ref: MessageRef, card: Card) -> None:
        # A notification cannot be redrawn; a later tap is answered with the request as it stands.
        return None

    async def aclose(self) -> None:
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    # --- receiving -------------------------------------------------------------------------

    async def handle_callback(
        self, body: bytes, headers: Mapping[str, str], handler: ClickHandler
    ) -> CallbackReply:
        """An ``http`` action tapped on a phone: its body is the signed token, as text.

        The answer follows the callback contract: 200 recorded or repeated (the app clears
        the notification), 409 decided otherwise (naming the final state and who), 410
        expired or cancelled; a body that is not this channel's token is refused unread."""
        if len(body) > MAX_TOKEN_CHARS:
            raise CallbackRejected("oversized ntfy action body", status_code=413)
        try:
            text = body.decode("ascii").strip()
        except UnicodeDecodeError:
            raise CallbackRejected("malformed link token", status_code=400) from None
        token = self._links.verify(text, now=self._clock())
        if token.channel != self.name or token.grant is not None:
            raise CallbackRejected("a token of another channel", status_code=403)
        click = Click(
            request_id=token.request_id,
            verdict=token.verdict,
            user_id=token.recipient,
            identity={"via": "ntfy_link", "link": token.choice},
        )
        outcome = await handler.click(self.name, click)
        return CallbackReply(status_code=outcome.answer.status_code, body=answer_body(outcome))

    async def start(self, handler: ClickHandler) -> None:
        return None  # clicks arrive as HTTP callbacks only

    def conversation_of(self, ref: MessageRef | None) -> str | None:
        return None  # each person's own topic: no shared conversation

    async def lookup_user(self, user_id: str) -> tuple[str | None, str | None]:
        return None, None  # ntfy knows nothing about who holds a topic
