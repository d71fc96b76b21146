"""Verifying and decrypting Feishu callbacks: pure functions over raw bytes, headers and a clock.

Order matters. lark-oapi decrypts first and checks the signature afterwards, and
answers each failure with its own exception text, which makes a padding oracle.
Here the signature and its timestamp are checked over the raw bytes *before*
anything is decrypted, and every failure is the same :class:`CallbackRejected`
whose ``reason`` is for the audit log only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from signoff.channels._contract import CallbackRejected

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CLOCK_SKEW",
    "CallbackKind",
    "VerifiedCallback",
    "classify",
    "decrypt",
    "verify_callback",
]

MAX_CLOCK_SKEW = 300.0
"""Seconds a signed request's ``X-Lark-Request-Timestamp`` may differ from our clock."""
MAX_BODY_BYTES = 256 * 1024
"""Card callbacks are a few KB; anything far larger is refused before any work."""

_TIMESTAMP = "x-lark-request-timestamp"
_NONCE = "x-lark-request-nonce"
_SIGNATURE = "x-lark-signature"
_SHA256_HEX_LEN = 64
_SHA1_HEX_LEN = 40
_AES_BLOCK = 16


class CallbackKind(StrEnum):
    URL_VERIFICATION = "url_verification"
    CARD_ACTION = "card_action"
    """``card.action.trigger`` (schema 2.0)."""
    LEGACY_CARD_ACTION = "legacy_card_action"
    """The old message-card callback (``card.action.trigger_v1``)."""
    OTHER = "other"
    """A verified event this channel does not handle."""


class _Scheme(StrEnum):
    NONE = "none"
    SHA256 = "sha256"
    """Events and new callbacks: ``sha256(timestamp + nonce + encrypt_key + body)``."""
    SHA1 = "sha1"
    """Legacy card callbacks: ``sha1(timestamp + nonce + verification_token + body)``."""


@dataclass(frozen=True, slots=True)
class VerifiedCallback:
    """A callback that passed every check, decrypted and parsed."""

    kind: CallbackKind
    payload: Mapping[str, Any]


def _reject(reason: str, status_code: int = 401) -> CallbackRejected:
    return CallbackRejected(reason, status_code=status_code)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # Starlette lower-cases header names; other callers may not.
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def decrypt(encrypted: str, encrypt_key: str) -> bytes:
    """Decrypt an ``{"encrypt": …}`` envelope: AES-256-CBC, key ``sha256(encrypt_key)``, IV prefixed.

    Raises :class:`CallbackRejected` for anything that is not valid base64, whole
    blocks and strict PKCS#7 padding; the reason never says which.
    """
    try:
        from Crypto.Cipher import AES
    except ImportError as exc:  # pragma: no cover - pycryptodome comes with the feishu extra
        raise ImportError("Feishu decryption needs pycryptodome: pip install 'signoff[feishu]'") from exc

    try:
        raw = base64.b64decode(encrypted, validate=True)
    except (binascii.Error, ValueError):
        raise _reject("undecryptable body") from None
    if len(raw) < 2 * _AES_BLOCK or len(raw) % _AES_BLOCK:
        raise _reject("undecryptable body")
    key = hashlib.sha256(encrypt_key.encode()).digest()
    plain = AES.new(key, AES.MODE_CBC, raw[:_AES_BLOCK]).decrypt(raw[_AES_BLOCK:])
    pad = plain[-1]
    if not 1 <= pad <= _AES_BLOCK or plain[-pad:] != bytes([pad]) * pad:
        raise _reject("undecryptable body")
    return plain[:-pad]


def _check_signature(
    body: bytes,
    headers: Mapping[str, str],
    *,
    encrypt_key: str | None,
    verification_token: str | None,
    now: float,
    max_skew: float,
) -> _Scheme:
    signature = _header(headers, _SIGNATURE)
    if not signature:
        return _Scheme.NONE
    timestamp = _header(headers, _TIMESTAMP)
    nonce = _header(headers, _NONCE)
    if timestamp is None or nonce is None:
        raise _reject("signature headers incomplete")

    if len(signature) == _SHA256_HEX_LEN and encrypt_key:
        scheme, secret, algorithm = _Scheme.SHA256, encrypt_key, hashlib.sha256
    elif len(signature) == _SHA1_HEX_LEN and verification_token:
        scheme, secret, algorithm = _Scheme.SHA1, verification_token, hashlib.sha1
    elif encrypt_key:
        raise _reject("signature of unknown form")
    else:
        # Without an encrypt key there is nothing to check a SHA-256 signature against;
        # such requests are authenticated by the verification token instead.
        return _Scheme.NONE

    expected = algorithm((timestamp + nonce + secret).encode() + body).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.lower().encode()):
        raise _reject("signature mismatch")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise _reject("timestamp not a number") from None
    if abs(now - sent_at) > max_skew:
        raise _reject("timestamp outside the allowed window")
    return scheme


def _json_object(data: bytes | str, *, reason: str, status_code: int) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise _reject(reason, status_code) from None
    if not isinstance(value, dict):
        raise _reject(reason, status_code)
    return value


def classify(payload: Mapping[str, Any]) -> CallbackKind:
    """What a decrypted callback payload is."""
    if payload.get("type") == "url_verification":
        return CallbackKind.URL_VERIFICATION
    header = payload.get("header")
    if payload.get("schema") == "2.0" and isinstance(header, dict):
        if header.get("event_type") == "card.action.trigger":
            return CallbackKind.CARD_ACTION
        return CallbackKind.OTHER
    if "open_id" in payload and isinstance(payload.get("action"), dict):
        return CallbackKind.LEGACY_CARD_ACTION
    return CallbackKind.OTHER


def _token_matches(sent: object, expected: str) -> bool:
    # Text no encoder can carry (a lone surrogate, written ``\\ud800`` in JSON) is compared
    # as it is, and matches no token: anyone may post it to a channel taking unsigned callbacks.
    return isinstance(sent, str) and hmac.compare_digest(
        sent.encode("utf-8", "surrogatepass"), expected.encode()
    )


def verify_callback(
    body: bytes,
    headers: Mapping[str, str],
    *,
    encrypt_key: str | None,
    verification_token: str | None,
    now: float,
    max_skew: float = MAX_CLOCK_SKEW,
    allow_unsigned: bool = False,
) -> VerifiedCallback:
    """Check, decrypt and classify one webhook callback.

    1. Without an encrypt key nothing is signed with a secret of its own (the
       legacy SHA-1 signature is keyed with the verification token, which every
       callback carries), so such callbacks are refused unless ``allow_unsigned``.
    2. A signature, when present, is checked over the raw bytes together with its
       timestamp window, before anything is decrypted.
    3. With an encrypt key, the body must be an encrypted envelope (plaintext is
       a downgrade and refused, legacy callbacks included); it is then decrypted.
    4. Each kind must carry the authentication it is entitled to: card actions
       and other events the SHA-256 signature when an encrypt key is set, and the
       verification token (``header.token``) when one is configured; legacy card
       callbacks the SHA-1 signature; ``url_verification`` the token (Feishu does
       not sign it; with an encrypt key, decrypting it proves the sender knows it).

    Raises :class:`CallbackRejected` (401, or 400/413 for malformed or oversized
    bodies) on any failure.
    """
    if not encrypt_key and not verification_token:
        raise _reject("no callback credentials configured")
    if not encrypt_key and not allow_unsigned:
        raise _reject("unsigned callback: no encrypt key, allow_unsigned off")
    if len(body) > MAX_BODY_BYTES:
        raise _reject("body too large", 413)

    scheme = _check_signature(
        body,
        headers,
        encrypt_key=encrypt_key,
        verification_token=verification_token,
        now=now,
        max_skew=max_skew,
    )
    outer = _json_object(body, reason="body is not a JSON object", status_code=400)

    encrypted = outer.get("encrypt")
    if encrypted is not None:
        if not encrypt_key:
            raise _reject("encrypted body but no encrypt key configured")
        if not isinstance(encrypted, str):
            raise _reject("undecryptable body")
        # Same status and reason as a padding failure: garbage that decrypts must look no different.
        payload = _json_object(decrypt(encrypted, encrypt_key), reason="undecryptable body", status_code=401)
    elif encrypt_key:
        # A legacy callback too: its SHA-1 signature is keyed with the verification token
        # alone, which must not be enough once an encrypt key is set.
        raise _reject("plaintext body while an encrypt key is configured")
    else:
        payload = outer

    kind = classify(payload)
    if kind is CallbackKind.URL_VERIFICATION:
        if verification_token is not None and not _token_matches(payload.get("token"), verification_token):
            raise _reject("verification token mismatch")
        if verification_token is None and encrypted is None:
            raise _reject("unauthenticated url_verification")
    elif kind is CallbackKind.LEGACY_CARD_ACTION:
        if scheme is not _Scheme.SHA1:
            raise _reject("legacy card callback without a valid signature")
    else:
        if scheme is _Scheme.SHA1:
            raise _reject("legacy signature on a schema 2.0 callback")
        if encrypt_key and scheme is not _Scheme.SHA256:
            raise _reject("unsigned callback")
        if verification_token is not None:
            header = payload.get("header")
            sent = header.get("token") if isinstance(header, dict) else payload.get("token")
            if not _token_matches(sent, verification_token):
                raise _reject("verification token mismatch")
    return VerifiedCallback(kind=kind, payload=payload)
