"""Signed one-click links: a token per recipient and choice, bound to one request.

A token is ``<payload>.<signature>``: the payload is compact JSON (version, request id,
channel, recipient, verdict, grant, expiry) in unpadded base64url, the signature an
HMAC-SHA256 of the payload's text under the server's link key, also base64url. Both halves
are compared as text, so no other spelling of the same bytes (base64's unused low bits)
passes: any change to a token refuses it. A recipient that is a secret (an ntfy topic, which
reads its person's notifications) is sealed: AES-GCM under a key derived from the link key,
so a token in a URL (browser history, a proxy's log) does not give it away. Pure functions of
the key and the clock (and, for a sealed recipient, a random nonce).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from signoff.channels._contract import CallbackRejected, GrantChoice, Verdict

__all__ = ["MAX_TOKEN_CHARS", "LinkSigner", "LinkToken"]

MAX_TOKEN_CHARS = 2048
"""Longer tokens are refused unread (a request id, a channel, an address and a grant fit well within)."""
_VERSION = 1
_CONTEXT = b"signoff.email.link.v1."
_SEAL_CONTEXT = b"signoff.link.recipient-seal.v1"
_NONCE = 12


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or not all(c.isascii() and (c.isalnum() or c in "-_") for c in text):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class LinkToken:
    """What one link may do: ``recipient`` casts ``verdict`` (with ``grant``) on ``request_id``
    as posted to ``channel``, until ``expires_at`` (Unix seconds: the request's deadline)."""

    request_id: str
    channel: str
    recipient: str
    verdict: Verdict
    expires_at: int
    grant: GrantChoice | None = None

    @property
    def choice(self) -> str:
        """``approve``, ``grant`` or ``reject``."""
        return "grant" if self.grant is not None else self.verdict.value

    def payload(self) -> list[Any]:
        grant = self.grant.as_dict() if self.grant is not None else None
        return [
            _VERSION,
            self.request_id,
            self.channel,
            self.recipient,
            self.verdict.value,
            grant,
            self.expires_at,
        ]

    @classmethod
    def from_payload(cls, data: object) -> LinkToken:
        if not isinstance(data, list) or len(data) != 7 or data[0] != _VERSION:
            raise ValueError("not a link of this version")
        _, request_id, channel, recipient, verdict, grant, expires_at = data
        if not all(isinstance(v, str) and v for v in (request_id, channel, recipient)):
            raise ValueError("a link names its request, channel and recipient")
        if isinstance(expires_at, bool) or not isinstance(expires_at, int):
            raise ValueError("a link carries its expiry")
        return cls(
            request_id=request_id,
            channel=channel,
            recipient=recipient,
            verdict=Verdict(verdict),
            expires_at=expires_at,
            grant=GrantChoice.from_dict(grant) if grant is not None else None,
        )


class LinkSigner:
    """Makes and checks link tokens with one key, and the URLs that carry them.

    ``base_url`` is ``SIGNOFF_PUBLIC_URL``; a link is ``{base_url}/approve/{token}``.
    """

    def __init__(self, key: bytes, base_url: str) -> None:
        if len(key) < 16:
            raise ValueError("a link key has at least 16 bytes")
        self._key = key
        self._seal = AESGCM(hmac.new(key, _SEAL_CONTEXT, hashlib.sha256).digest())
        self.base_url = base_url.rstrip("/")

    def _signature(self, payload: str) -> str:
        return _b64(hmac.new(self._key, _CONTEXT + payload.encode("ascii"), hashlib.sha256).digest())

    def sign(self, token: LinkToken, *, seal_recipient: bool = False) -> str:
        """The token's text; with ``seal_recipient`` its recipient is not readable in it
        (:meth:`verify` opens it)."""
        data = token.payload()
        if seal_recipient:
            nonce = os.urandom(_NONCE)
            sealed = self._seal.encrypt(nonce, token.recipient.encode(), _SEAL_CONTEXT)
            data[3] = {"sealed": _b64(nonce + sealed)}
        payload = _b64(json.dumps(data, separators=(",", ":"), ensure_ascii=True).encode())
        return f"{payload}.{self._signature(payload)}"

    def _opened(self, data: object) -> object:
        """``data`` (a token's payload) with its recipient unsealed, if it is sealed."""
        if isinstance(data, list) and len(data) > 3 and isinstance(data[3], dict):
            sealed = data[3].get("sealed")
            raw = _unb64(sealed) if isinstance(sealed, str) and len(data[3]) == 1 else b""
            try:
                recipient = self._seal.decrypt(raw[:_NONCE], raw[_NONCE:], _SEAL_CONTEXT)
            except InvalidTag:
                raise ValueError("a sealed recipient this key did not seal") from None
            data = [*data[:3], recipient.decode(), *data[4:]]
        return data

    def url(self, token: LinkToken) -> str:
        return f"{self.base_url}/approve/{self.sign(token)}"

    def verify(self, text: str, *, now: datetime) -> LinkToken:
        """The token ``text`` carries, if this key signed it and it has not expired at ``now``.

        Raises :class:`CallbackRejected` (``reason`` for the audit log) otherwise.
        """
        if not isinstance(text, str) or len(text) > MAX_TOKEN_CHARS or text.count(".") != 1:
            raise CallbackRejected("malformed link token", status_code=400)
        payload, signature = text.split(".")
        try:
            _unb64(payload)
            _unb64(signature)
        except (ValueError, binascii.Error):
            raise CallbackRejected("malformed link token", status_code=400) from None
        if not hmac.compare_digest(signature.encode("ascii"), self._signature(payload).encode("ascii")):
            raise CallbackRejected("bad link signature", status_code=403)
        try:
            token = LinkToken.from_payload(self._opened(json.loads(_unb64(payload))))
        except (ValueError, TypeError):
            # Signed by this key but not readable: a token of another version.
            raise CallbackRejected("unreadable link token", status_code=400) from None
        if now.timestamp() >= token.expires_at:
            raise CallbackRejected("link expired", status_code=410)
        return token
