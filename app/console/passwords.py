"""Operators' passwords: argon2id hashes (argon2-cffi with its RFC 9106 defaults)."""

from __future__ import annotations

import logging
import secrets
from functools import cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

__all__ = ["hash_password", "verify_password", "waste_a_verification"]

log = logging.getLogger("signoff")
_hasher = PasswordHasher()


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for the config's ``operators.NAME.password_hash``."""
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    """Whether ``password`` matches; a hash that is not argon2 never matches (and is logged)."""
    try:
        return _hasher.verify(password_hash, password)
    except VerificationError:
        return False
    except InvalidHashError:
        log.error(
            "an operator's password_hash is not an argon2 hash; "
            "make one with `signoff operators hash-password`"
        )
        return False


@cache
def _decoy() -> str:
    return _hasher.hash(secrets.token_urlsafe(16))


def waste_a_verification(password: str) -> None:
    """Take as long as a real check, so a wrong name is not told apart from a wrong password."""
    verify_password(_decoy(), password)
