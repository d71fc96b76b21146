"""Mapping Feishu Open API failures to retryable or permanent delivery errors."""

from __future__ import annotations

from collections.abc import Mapping

from signoff.channels._contract import DeliveryError, PermanentDeliveryError, RetryableDeliveryError

__all__ = ["RATE_LIMIT_CODES", "TOKEN_INVALID_CODES", "api_error"]

RATE_LIMIT_CODES = frozenset(
    {
        99991400,  # app/tenant frequency limit (gateway)
        230020,  # per-chat send limit, 5 QPS shared by the chat's bots
        11232,  # message service limit
    }
)
TOKEN_INVALID_CODES = frozenset(
    {
        99991661,  # no access token in the request
        99991663,  # tenant_access_token invalid
        99991668,  # access token invalid
        99991677,  # access token expired
    }
)
"""The cached tenant token went bad (revoked, app secret rotated): fetch a new one and retry."""

_HINTS: dict[int, str] = {
    230001: "invalid request parameter (is chat_id right?)",
    230002: "the bot is not a member of the chat; add the bot to the group",
    230006: "the bot capability is not enabled or the app is not published",
    230011: "the message was withdrawn or deleted, so nothing can reply to it",
    230012: "the bot did not send this message",
    230027: "the app lacks a permission (im:message / im:message:send_as_bot)",
    230099: "Feishu refused the card content",
    99991672: "the app lacks a required permission scope",
    99991401: "the server's IP is not in the app's allow list",
    10003: "invalid app_id",
    10014: "invalid app_secret",
}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    lowered = {key.lower(): value for key, value in headers.items()}
    for name in ("x-ogw-ratelimit-reset", "retry-after"):
        raw = lowered.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw)
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def api_error(
    operation: str,
    *,
    status: int | None,
    code: int | None,
    msg: str | None,
    headers: Mapping[str, str] | None = None,
    log_id: str | None = None,
) -> DeliveryError:
    """Classify one failed call (``status`` None when the HTTP status is unknown).

    Rate limits (HTTP 429 or a rate-limit code), 5xx and invalid cached tokens are
    retryable, with ``retry_after`` from ``x-ogw-ratelimit-reset`` / ``Retry-After``
    when sent. Every other business error (bot not in the chat, bad credentials,
    missing permission, rejected card, …) is permanent and names its code.
    """
    headers = headers or {}
    detail = f"code {code}: {msg or 'no message'}" if code is not None else (msg or "no message")
    hint = _HINTS.get(code) if code is not None else None
    where = f"HTTP {status}, " if status else ""
    reason = f"Feishu {operation} failed ({where}{detail})"
    if hint:
        reason += f" - {hint}"
    if log_id:
        reason += f" [log_id {log_id}]"
    if status == 429 or code in RATE_LIMIT_CODES:
        return RetryableDeliveryError(reason, retry_after=_retry_after(headers))
    if (status is not None and status >= 500) or code in TOKEN_INVALID_CODES:
        return RetryableDeliveryError(reason, retry_after=_retry_after(headers))
    return PermanentDeliveryError(reason)
