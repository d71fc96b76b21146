"""Decision webhooks: signed events, owed in the transaction that caused them, sent by the outbox.

A request created or decided, a grant created or revoked: each configured webhook subscribed
to that event is owed one delivery (a ``delivery`` row of kind ``webhook``), written in the
same transaction as the change, so an event is sent if and only if its change committed. Its
body is ``{type, timestamp, data}``: ``data`` is the request as the operator API shows it
(:class:`~signoff.app.schemas.RequestOut`) or the grant (:class:`~signoff.app.schemas.GrantOut`),
as the transaction leaves them (a decision's body includes the grant its approval gave).

The outbox dispatcher sends them (:func:`send`) with the Standard Webhooks signature
(``webhook-id``, ``webhook-timestamp``, ``webhook-signature: v1,<base64 HMAC-SHA256>`` over
``id.timestamp.body``), the same ``webhook-id`` on every attempt. Where an event goes is the
configuration's ``webhooks`` alone: no caller ever names a URL. A webhook that fails never
changes a request.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession
from standardwebhooks import Webhook

from signoff.app.config import GRANT_CREATED, GRANT_REVOKED, REQUEST_CREATED, REQUEST_DECIDED, WebhookConfig
from signoff.app.db import before_commit, subscribers
from signoff.app.deliveries import WEBHOOK, owed_delivery, queue_deliveries
from signoff.app.models import ConfirmationRequest, Grant, Vote, utcnow
from signoff.app.schemas import GrantOut, RequestOut
from signoff.channels import PermanentDeliveryError, RetryableDeliveryError

__all__ = [
    "GRANT_CREATED",
    "GRANT_REVOKED",
    "REQUEST_CREATED",
    "REQUEST_DECIDED",
    "encode",
    "owe",
    "retry_after",
    "send",
    "signed_headers",
]

_ABOUT_GRANTS = (GRANT_CREATED, GRANT_REVOKED)

MAX_RETRY_AFTER = 3600.0
"""Seconds at most that a receiver's ``Retry-After`` holds an event back."""
USER_AGENT = "Signoff-Webhooks/1"
MAX_ANSWER_BYTES = 4096
"""How much of a receiver's answer is read (for the error it names); the rest is never read."""


def owe(session: AsyncSession, event: str, ids: Sequence[str], now: datetime) -> None:
    """Owe ``event`` about the requests (``request.*``) or grants (``grant.*``) ``ids`` to every
    webhook subscribed to it, in ``session``'s transaction. The rows are written just before it
    commits, showing what the transaction leaves; nothing is written if no webhook subscribes."""
    names = tuple(subscribers(session, event))
    if not names or not ids:
        return
    subjects = tuple(ids)

    async def write() -> None:
        await _write(session, event, subjects, names, now)

    before_commit(session, write)


async def _write(
    session: AsyncSession, event: str, ids: Sequence[str], names: Sequence[str], now: datetime
) -> None:
    shown = await (_grants_shown if event in _ABOUT_GRANTS else _requests_shown)(session, ids, now)
    timestamp = _iso(now)
    due = utcnow()  # due at once, whatever time the change was given
    rows = []
    for subject in ids:
        if subject not in shown:
            continue
        request_id, data = shown[subject]
        event_id = f"msg_{uuid.uuid4().hex}"
        payload = {"type": event, "timestamp": timestamp, "data": data}
        rows += [
            owed_delivery(request_id, name, WEBHOOK, due, event_id=event_id, payload=payload)
            for name in names
        ]
    await queue_deliveries(session, rows)


async def _requests_shown(
    session: AsyncSession, ids: Sequence[str], now: datetime
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each request as the operator API shows it, by id (three queries for them all)."""
    fresh = {"populate_existing": True}  # rows this transaction changed through Core statements
    requests = (
        await session.exec(
            select(ConfirmationRequest).where(col(ConfirmationRequest.id).in_(ids)).execution_options(**fresh)
        )
    ).all()
    votes: dict[str, list[Vote]] = {rid: [] for rid in ids}
    stmt = select(Vote).where(col(Vote.request_id).in_(ids)).order_by(col(Vote.id)).execution_options(**fresh)
    for vote in (await session.exec(stmt)).all():
        votes[vote.request_id].append(vote)
    given: dict[str, list[Grant]] = {rid: [] for rid in ids}
    stmt_g = select(Grant).where(col(Grant.request_id).in_(ids)).order_by(col(Grant.created_at))
    for grant in (await session.exec(stmt_g.execution_options(**fresh))).all():
        given[grant.request_id].append(grant)
    return {
        r.id: (r.id, RequestOut.of(r, votes[r.id], given[r.id], now=now).model_dump(mode="json"))
        for r in requests
    }


async def _grants_shown(
    session: AsyncSession, ids: Sequence[str], now: datetime
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each grant as the operator API lists it, by id, with the request it was given with."""
    stmt = select(Grant).where(col(Grant.id).in_(ids)).execution_options(populate_existing=True)
    return {
        g.id: (g.request_id, GrantOut.of(g, now).model_dump(mode="json"))
        for g in (await session.exec(stmt)).all()
    }


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def encode(payload: Mapping[str, Any]) -> bytes:
    """The body sent: compact UTF-8 JSON (the same bytes on every attempt)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def signed_headers(hook: WebhookConfig, event_id: str, body: bytes, now: datetime) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` sent at ``now`` (whole seconds)."""
    sent = datetime.fromtimestamp(int(now.timestamp()), UTC)
    signature = Webhook(hook.signing_key()).sign(event_id, sent, body.decode())
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(sent.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


def retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number or an HTTP date), capped at
    :data:`MAX_RETRY_AFTER`; None without a usable one."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(raw) - now).total_seconds()
        except (TypeError, ValueError):
            return None
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


async def send(
    client: httpx.AsyncClient,
    hook: WebhookConfig,
    *,
    event_id: str,
    payload: Mapping[str, Any],
    now: datetime,
) -> None:
    """POST one event, signed. Returns on a 2xx answer; raises :class:`RetryableDeliveryError` for
    a timeout, a connection error, 408, 429 or 5xx (with the receiver's ``Retry-After``), and
    :class:`PermanentDeliveryError` for any other answer (redirects are not followed).

    The whole exchange, not each read, is bounded by the webhook's ``timeout``, and no more than
    :data:`MAX_ANSWER_BYTES` of the answer is read: a receiver that answers slowly, or without
    end, holds the outbox no longer than that."""
    body = encode(payload)
    try:
        async with (
            asyncio.timeout(hook.timeout),
            client.stream(
                "POST",
                hook.url,
                content=body,
                headers=signed_headers(hook, event_id, body, now),
                timeout=hook.timeout,
                follow_redirects=False,
            ) as response,
        ):
            status = response.status_code
            if 200 <= status < 300:
                return
            said = " ".join((await _beginning(response))[:200].split())
    except (httpx.TimeoutException, TimeoutError):
        raise RetryableDeliveryError(f"no answer within {hook.timeout:g}s") from None
    except httpx.HTTPError as exc:
        raise RetryableDeliveryError(f"network error: {type(exc).__name__}") from None
    reason = f"HTTP {status}" + (f": {said}" if said else "")
    if status in (408, 429) or status >= 500:
        raise RetryableDeliveryError(reason, retry_after=retry_after(response.headers, now))
    if 300 <= status < 400:
        reason += " (redirects are not followed: configure the URL it points to)"
    raise PermanentDeliveryError(reason)


async def _beginning(response: httpx.Response) -> str:
    """The first :data:`MAX_ANSWER_BYTES` of ``response``'s body, as text."""
    read = bytearray()
    async for chunk in response.aiter_bytes():
        read += chunk
        if len(read) >= MAX_ANSWER_BYTES:
            break
    return bytes(read[:MAX_ANSWER_BYTES]).decode(response.encoding or "utf-8", errors="replace")
