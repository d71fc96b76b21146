"""The email channel's I/O: SMTP through aiosmtplib, one connection per post."""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

import aiosmtplib
from aiosmtplib import (
    SMTPAuthenticationError,
    SMTPException,
    SMTPNotSupported,
    SMTPRecipientRefused,
    SMTPRecipientsRefused,
    SMTPResponseException,
)

from signoff.channels._contract import (
    Card,
    DeliveryError,
    GrantChoice,
    MessageRef,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
    Verdict,
)
from signoff.channels.email import IDENTITY, EmailConfig
from signoff.channels.email._links import LinkSigner, LinkToken
from signoff.channels.email._message import Choice, argument_view, message_id, render_message

__all__ = ["EmailChannel", "delivery_error"]

log = logging.getLogger("signoff.channels.email")

_REMEMBERED_POSTS = 1024
_MAX_ERROR_CHARS = 200


def _said(code: int, message: str) -> str:
    text = " ".join(message.split())
    return f"{code} {text[:_MAX_ERROR_CHARS]}".strip()


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def delivery_error(exc: BaseException) -> DeliveryError:
    """Classify a failed SMTP exchange for the outbox.

    A 4xx reply is temporary (retry later); a 5xx reply, a refused login, a server without
    a required extension (STARTTLS, AUTH) or a certificate that does not verify is
    permanent and named; a refused or lost connection and timeouts are retryable.
    """
    if isinstance(exc, SMTPAuthenticationError):
        return PermanentDeliveryError(f"SMTP authentication failed: {_said(exc.code, exc.message)}")
    if isinstance(exc, SMTPRecipientsRefused):
        refused = [delivery_error(r) for r in exc.recipients]
        reason = "; ".join(e.reason for e in refused) or "every recipient was refused"
        if any(isinstance(e, RetryableDeliveryError) for e in refused):
            return RetryableDeliveryError(reason)
        return PermanentDeliveryError(reason)
    if isinstance(exc, SMTPRecipientRefused):
        said = f"recipient {exc.recipient} refused: {_said(exc.code, exc.message)}"
        return RetryableDeliveryError(said) if 400 <= exc.code < 500 else PermanentDeliveryError(said)
    if isinstance(exc, SMTPResponseException):
        said = f"SMTP server answered {_said(exc.code, exc.message)}"
        if 400 <= exc.code < 500:
            return RetryableDeliveryError(said)
        return PermanentDeliveryError(said)
    if _tls_failure(exc):
        return PermanentDeliveryError(f"the SMTP server's certificate did not verify: {exc}"[:300])
    if isinstance(exc, SMTPException) and "STARTTLS" in str(exc):
        return PermanentDeliveryError(
            f"the SMTP server does not offer STARTTLS ({exc}): for a relay on this host or network "
            "without TLS add ?starttls=false to smtp_url (smtp://host:25?starttls=false); "
            "else use its TLS port (smtps://host:465)"[:300]
        )
    if isinstance(exc, SMTPNotSupported):
        return PermanentDeliveryError(f"SMTP server does not support what smtp_url asks: {exc}"[:300])
    if isinstance(exc, TimeoutError):
        return RetryableDeliveryError("SMTP timeout")
    if isinstance(exc, ConnectionError | OSError):
        return RetryableDeliveryError(f"cannot reach the SMTP server: {type(exc).__name__}: {exc}"[:300])
    if isinstance(exc, SMTPException):
        return PermanentDeliveryError(f"SMTP error: {exc}"[:300])
    return RetryableDeliveryError(f"{type(exc).__name__}: {exc}"[:300])


@dataclass(frozen=True, slots=True)
class _Recipient:
    name: str
    address: str


class EmailChannel:
    """Sends each approver of a card one message with a signed link per choice.

    Decisions are made at the links (``/approve/{token}`` on the server), so a decided card
    sends nothing: every remaining link says the request is decided when opened. Addresses a
    post already reached are remembered (per process) while the post is retried, so a
    temporary failure for one approver does not mail the others again; after a crash the
    same ``Message-ID`` is sent again, which mail stores de-duplicate on.
    """

    type = "email"

    def __init__(self, name: str, config: EmailConfig, links: LinkSigner) -> None:
        self.name = name
        self._config = config
        self._server = config.server
        self._links = links
        self._sent: OrderedDict[str, dict[str, str]] = OrderedDict()

    def _recipients(self, card: Card) -> list[_Recipient]:
        seen: dict[str, _Recipient] = {}
        for person in card.approvers:
            address = (person.user_id or "").strip()
            if IDENTITY.is_user_id(address) and address.lower() not in seen:
                seen[address.lower()] = _Recipient(person.name, address)
        return list(seen.values())

    def choices(self, card: Card, address: str) -> list[Choice]:
        """The links in ``address``'s message: Approve (once), each grant, Reject; Reject
        only when the message cannot show every argument field."""
        expires = int(card.expires_at.timestamp())

        def url(verdict: Verdict, grant: GrantChoice | None = None) -> str:
            return self._links.url(LinkToken(card.request_id, self.name, address, verdict, expires, grant))

        if not argument_view(card).complete:
            return [Choice("reject", "Reject", url(Verdict.REJECT))]
        return [
            Choice("approve", "Approve once" if card.grants else "Approve", url(Verdict.APPROVE)),
            *(
                Choice("grant", g.label(), url(Verdict.APPROVE, g), g.explain(card.agent_id, card.tool_name))
                for g in card.grants
            ),
            Choice("reject", "Reject", url(Verdict.REJECT)),
        ]

    def _client(self) -> aiosmtplib.SMTP:
        server = self._server
        return aiosmtplib.SMTP(
            hostname=server.host,
            port=server.port,
            username=server.username,
            password=server.password,
            use_tls=server.implicit_tls,
            start_tls=server.starttls,
            cert_bundle=server.ca_file,
            timeout=self._config.timeout_seconds,
        )

    async def post(self, card: Card) -> MessageRef:
        if not card.is_pending:
            return {"request_id": card.request_id, "message_ids": ""}
        recipients = self._recipients(card)
        if not recipients:
            raise PermanentDeliveryError(
                "no approver of this gate has an email address (an email channel mails only listed "
                "approvers: give each an `email` in people)"
            )
        sent, failed = await self._mail(card, recipients, card.request_id)
        ref = {
            "request_id": card.request_id,
            "message_ids": " ".join(sent[r.address.lower()] for r in recipients if r.address.lower() in sent),
            "recipients": ",".join(r.address for r in recipients if r.address.lower() in sent),
        }
        if failed:
            ref["refused"] = "; ".join(e.reason for e in failed.values())[:1000]
        return ref

    async def remind(self, ref: MessageRef, card: Card, waiting_on: tuple[Person, ...], *, key: str) -> None:
        """Mail each of ``waiting_on`` the request again, with links of their own: a reminder,
        or (for approvers an escalation added) the request reaching them for the first time."""
        if not card.is_pending:
            return
        seen: dict[str, _Recipient] = {}
        for person in waiting_on:
            address = (person.user_id or "").strip()
            if IDENTITY.is_user_id(address) and address.lower() not in seen:
                seen[address.lower()] = _Recipient(person.name, address)
        if seen:
            await self._mail(card, list(seen.values()), key, reminder=True)

    async def _mail(
        self, card: Card, recipients: list[_Recipient], batch: str, *, reminder: bool = False
    ) -> tuple[dict[str, str], dict[str, DeliveryError]]:
        """Send ``card`` to ``recipients`` once each across retries of ``batch`` (a post, or one
        reminder): the Message-IDs sent, by address, and the refusals. Raises when a retry could
        reach someone, or when nobody could be reached."""
        sent = self._sent.setdefault(batch, {})
        self._sent.move_to_end(batch)
        while len(self._sent) > _REMEMBERED_POSTS:
            self._sent.popitem(last=False)
        failed: dict[str, DeliveryError] = {}
        todo = [r for r in recipients if r.address.lower() not in sent]
        if todo:
            smtp = self._client()
            try:
                await smtp.connect()
                for recipient in todo:
                    msg = render_message(
                        card,
                        sender=self._config.sender,
                        recipient=Person(recipient.name, recipient.address),
                        address=recipient.address,
                        choices=self.choices(card, recipient.address),
                        message_id=message_id(card, recipient.address, self._config.sender_domain, batch),
                        now=datetime.now(UTC),
                        reminder=reminder,
                    )
                    try:
                        await smtp.send_message(msg)
                    except (SMTPRecipientsRefused, SMTPResponseException) as exc:
                        # This recipient's envelope or message was refused; the connection
                        # goes on to the next one (a lost connection ends the send, below).
                        failed[recipient.address] = delivery_error(exc)
                    else:
                        sent[recipient.address.lower()] = str(msg["Message-ID"])
                with contextlib.suppress(SMTPException, OSError, TimeoutError):
                    await smtp.quit()  # what was sent is sent, whatever the goodbye says
            except (SMTPException, OSError, TimeoutError) as exc:
                raise delivery_error(exc) from exc
            finally:
                smtp.close()
        retry = [e for e in failed.values() if isinstance(e, RetryableDeliveryError)]
        if retry:
            raise RetryableDeliveryError("; ".join(e.reason for e in retry))
        if not sent:
            raise PermanentDeliveryError("; ".join(e.reason for e in failed.values()))
        for address, error in failed.items():
            log.warning("approval email for %s to %s refused: %s", card.request_id, address, error.reason)
        self._sent.pop(batch, None)
        return sent, failed

    async def update(self, ref: MessageRef, card: Card) -> None:
        # Mail cannot be redrawn, and a message per vote would be noise: each link shows the
        # request as it stands when it is opened.
        return None

    async def aclose(self) -> None:
        return None
