"""The Ed25519 keys receipts are signed with, and signing.

The key in use is the oldest row of ``receipt_key`` without ``retired_at``. With no key at all,
the first start (or the first receipt) makes one and keeps it in the database. An operator who
manages keys gives one instead (``SIGNOFF_RECEIPT_KEY``, or ``SIGNOFF_RECEIPT_KEY_FILE``: the
raw 32-byte private key in base64url, or a PEM file); it is listed with its public half only,
and the keys before it are retired. Rotation (``signoff receipts rotate``) retires the key in
use and starts a new one; retired keys stay published (``GET /v1/receipts/keys``) with the
time they were rotated out, so the receipts they signed still verify and none signed later does.

Signing reads the key in use in the deciding transaction, under a share lock on PostgreSQL:
a rotation waits for the receipts being signed with the old key, and every receipt signed
after it uses the new one.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Mapping
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.db import dialect_of, transaction
from signoff.app.models import ReceiptKey, utcnow
from signoff.hooks.receipts import canonical_bytes, jwk_thumbprint

__all__ = [
    "KeyUnavailable",
    "SigningKey",
    "operator_key",
    "prepare",
    "published",
    "rotate",
    "sign",
    "signing_key",
]

log = logging.getLogger("signoff.receipts")

_KEYS: sa.Table = ReceiptKey.__table__  # type: ignore[attr-defined]
_HELD: dict[str, SigningKey] = {}
"""The operator's keys this process was given at start (:func:`prepare`), by id."""


class KeyUnavailable(RuntimeError):
    """The key in use is held by the operator and this process was not given it."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _raw_public(key: Ed25519PrivateKey) -> str:
    return _b64(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


class SigningKey:
    """A private key and its id (the RFC 7638 thumbprint of its public half)."""

    __slots__ = ("kid", "private", "x")

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.x = _raw_public(private)
        self.kid = jwk_thumbprint(self.x)


@cache
def _loaded(private_b64: str) -> SigningKey:
    return SigningKey(Ed25519PrivateKey.from_private_bytes(_unb64(private_b64)))


def parse_key(text: str) -> SigningKey:
    """A private key from its raw 32 bytes in base64url, or from a PEM (PKCS#8) text."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        key = serialization.load_pem_private_key(text.encode(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the receipt key's PEM holds no Ed25519 private key")
        return _loaded(_b64(_raw_private(key)))
    try:
        raw = _unb64(text)
    except ValueError:
        raise ValueError("the receipt key is neither base64url nor PEM") from None
    if len(raw) != 32:
        raise ValueError(f"the receipt key is {len(raw)} bytes; an Ed25519 private key is 32")
    return _loaded(text.rstrip("="))


def operator_key(key: str | None, key_file: Path | None) -> SigningKey | None:
    """The key the settings give (``SIGNOFF_RECEIPT_KEY`` or ``SIGNOFF_RECEIPT_KEY_FILE``), if any.
    Raises ValueError naming what is wrong with it."""
    if key:
        return parse_key(key)
    if key_file is not None:
        try:
            text = key_file.read_text()
        except OSError as exc:
            raise ValueError(f"SIGNOFF_RECEIPT_KEY_FILE {key_file} cannot be read: {exc.strerror}") from None
        return parse_key(text)
    return None


def _from_settings() -> SigningKey | None:
    """The operator's key this process's environment names (``SIGNOFF_RECEIPT_KEY[_FILE]``, the
    settings' ``receipt_key`` and ``receipt_key_file``), read now."""
    path = os.environ.get("SIGNOFF_RECEIPT_KEY_FILE")
    return operator_key(os.environ.get("SIGNOFF_RECEIPT_KEY"), Path(path) if path else None)


_ACTIVE = (
    select(ReceiptKey)
    .where(col(ReceiptKey.retired_at).is_(None))
    .order_by(col(ReceiptKey.created_at), col(ReceiptKey.kid))
    .limit(1)
)


async def _insert(session: AsyncSession, key: SigningKey, *, source: str, now: datetime) -> ReceiptKey:
    row = ReceiptKey(
        kid=key.kid,
        public_key=key.x,
        private_key=_b64(_raw_private(key.private)) if source == "database" else None,
        source=source,
        created_at=now,
    )
    await session.exec(sa.insert(_KEYS).values(**row.model_dump()))
    return row


async def signing_key(session: AsyncSession, *, operator: SigningKey | None = None) -> SigningKey:
    """The key in use, read in ``session``'s transaction (made and kept when there is none).
    ``operator``: the operator's key, if this process has it (else it is read from the settings)."""
    stmt = _ACTIVE.with_for_update(read=True) if dialect_of(session) == "postgresql" else _ACTIVE
    row = (await session.exec(stmt)).first()
    if row is None:
        given = operator or _from_settings()
        key = given or SigningKey(Ed25519PrivateKey.generate())
        await _insert(session, key, source="operator" if given else "database", now=utcnow())
        return key
    if row.private_key is not None:
        return _loaded(row.private_key)
    held = operator or _HELD.get(row.kid) or _from_settings()
    if held is None or held.kid != row.kid:
        raise KeyUnavailable(
            f"the receipt key in use ({row.kid}) is held by the operator and this process was not "
            "given it: set SIGNOFF_RECEIPT_KEY or SIGNOFF_RECEIPT_KEY_FILE to it, or rotate to a new key"
        )
    return held


def sign(payload: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    """The receipt ``{payload, key_id, signature}``: Ed25519 over the payload's JCS bytes."""
    signature = key.private.sign(canonical_bytes(dict(payload)))
    return {"payload": dict(payload), "key_id": key.kid, "signature": _b64(signature)}


async def _retire_all(session: AsyncSession, *, keep: str | None = None) -> None:
    # Lock the keys in use first: receipts being signed with them finish before the time of
    # their retirement is taken, so none is signed after it.
    active = select(ReceiptKey.kid).where(col(ReceiptKey.retired_at).is_(None))
    if dialect_of(session) == "postgresql":
        active = active.with_for_update()
    kids = [k for k in (await session.exec(active)).all() if k != keep]
    if kids:
        await session.exec(sa.update(_KEYS).where(_KEYS.c.kid.in_(kids)).values(retired_at=utcnow()))


async def rotate(session: AsyncSession) -> SigningKey:
    """Retire the key in use and start a new one, kept in the database. The new key."""
    await _retire_all(session)
    key = SigningKey(Ed25519PrivateKey.generate())
    await _insert(session, key, source="database", now=utcnow())
    return key


async def prepare(sessions: async_sessionmaker[AsyncSession], operator: SigningKey | None) -> str:
    """At start: the operator's key in use (listed, the keys before it retired), or a key of the
    database's own when there is none yet. The id of the key in use."""
    async with transaction(sessions) as session:
        if operator is not None:
            _HELD[operator.kid] = operator
            known = await session.get(ReceiptKey, operator.kid)
            await _retire_all(session, keep=operator.kid)
            if known is None:
                await _insert(session, operator, source="operator", now=utcnow())
                log.info("receipts are signed with the operator's key %s", operator.kid)
            elif known.retired_at is not None:
                # Given again after it was rotated out: in use again from its first start.
                await session.exec(
                    sa.update(_KEYS).where(_KEYS.c.kid == operator.kid).values(retired_at=None)
                )
            return operator.kid
        key = await signing_key(session)
        return key.kid


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


async def published(session: AsyncSession) -> dict[str, Any]:
    """Every key receipts were signed with, as a JWKS (``GET /v1/receipts/keys``)."""
    rows = (await session.exec(select(ReceiptKey).order_by(col(ReceiptKey.created_at)))).all()
    return {
        "keys": [
            {
                "kid": r.kid,
                "kty": "OKP",
                "crv": "Ed25519",
                "x": r.public_key,
                "alg": "EdDSA",
                "use": "sig",
                "not_before": _iso(r.created_at),
                "not_after": _iso(r.retired_at),
            }
            for r in rows
        ]
    }
