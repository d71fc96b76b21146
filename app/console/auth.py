"""Console sign-in: signed session cookies with an absolute expiry, and CSRF tokens bound to them.

The cookie holds ``{nonce, expires, operator, fingerprint}``, signed with
itsdangerous (HMAC-SHA1 over a key derived from the secret and a salt). A
visitor gets an anonymous session (a nonce only) on the sign-in page, so the
sign-in form carries a CSRF token too; signing in replaces the nonce. Every
form's token is an HMAC of the session's nonce, so it is useless with any other
cookie. The fingerprint is a hash of the operator's password hash: changing a
password (or removing the operator) ends their sessions. Signing out records the
session as ended in the database (:class:`ConsoleSessionRevocation`), so its
cookie is refused by every replica even if it was copied before.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Request
from itsdangerous import BadSignature, URLSafeSerializer, URLSafeTimedSerializer
from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from sqlalchemy import delete
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import Response

from signoff.app.config import Operator, SignoffConfig
from signoff.app.console.passwords import verify_password, waste_a_verification
from signoff.app.db import dialect_of, insert_ignoring
from signoff.app.deps import RuntimeDep
from signoff.app.models import ConsoleSessionRevocation, utcnow
from signoff.app.operators import operator_voter
from signoff.app.requests.eligibility import Voter
from signoff.app.runtime import Runtime
from signoff.channels import Assurance

__all__ = [
    "COOKIE_PATH",
    "FLASH_COOKIE",
    "SESSION_COOKIE",
    "TOKEN_PREFIX",
    "CheckedFormDep",
    "ConsoleSession",
    "CsrfRefused",
    "Flash",
    "Keys",
    "SignInLimiter",
    "SignInRequired",
    "SignedIn",
    "SignedInDep",
    "authenticate",
    "end_session",
    "ended",
    "safe_next",
    "voter_of",
]

TOKEN_PREFIX = "sop_"
"""How a personal token for the command line starts."""
SESSION_COOKIE = "signoff_session"
FLASH_COOKIE = "signoff_flash"
COOKIE_PATH = "/ui"
HOME = "/ui/"
_SIGNED_TEXT = re.compile(r"[A-Za-z0-9_.-]+")
"""The characters of what :class:`Keys` signs (URL-safe base64 and dots). itsdangerous reads
more: it skips bytes that are not ASCII and takes base64 padding in a signature, so that a
session or a personal token would pass in many spellings; each has one."""


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    nonce: str
    expires: float
    """Unix time; the sign-in ends then however active the operator is."""
    operator: str | None = None
    fingerprint: str | None = None
    person: Mapping[str, Any] | None = None
    """Signed in through OIDC: who the provider said this is (:class:`signoff.app.console.oidc.Claims`
    as a dict); None: an operator's password."""

    @classmethod
    def start(
        cls,
        max_age: float,
        *,
        operator: str | None = None,
        fingerprint: str | None = None,
        person: Mapping[str, Any] | None = None,
    ) -> ConsoleSession:
        return cls(secrets.token_urlsafe(24), time.time() + max_age, operator, fingerprint, person)


@dataclass(frozen=True, slots=True)
class Flash:
    """A one-shot message shown on the next page (the outcome of a decision)."""

    ok: bool
    text: str


def fingerprint(operator: Operator) -> str:
    return hashlib.sha256(operator.password_hash.get_secret_value().encode()).hexdigest()[:16]


class Keys:
    """Everything signed with the console's secret: sessions, CSRF tokens, flash messages."""

    def __init__(self, secret: str, *, max_age: float) -> None:
        self.max_age = max_age
        self._sessions = URLSafeSerializer(secret, salt="signoff.console.session")
        self._flash = URLSafeTimedSerializer(secret, salt="signoff.console.flash")
        self._tokens = URLSafeSerializer(secret, salt="signoff.cli.personal-token")
        self._csrf_key = hmac.new(secret.encode(), b"signoff.console.csrf", hashlib.sha256).digest()

    def encode(self, session: ConsoleSession) -> str:
        data: dict[str, Any] = {
            "n": session.nonce,
            "e": session.expires,
            "o": session.operator,
            "f": session.fingerprint,
        }
        if session.person is not None:
            data["p"] = dict(session.person)
        return self._sessions.dumps(data)

    def encode_token(self, session: ConsoleSession) -> str:
        """A personal token for the command line: ``session``'s identity, signed apart from
        cookies (a token is never a cookie, nor a cookie a token)."""
        data: dict[str, Any] = {"n": session.nonce, "e": session.expires, "o": session.operator}
        data["f"] = session.fingerprint
        if session.person is not None:
            data["p"] = dict(session.person)
        return TOKEN_PREFIX + self._tokens.dumps(data)

    def decode_token(self, raw: str | None) -> ConsoleSession | None:
        """The identity a personal token carries, or None if it is forged or past its expiry."""
        if not raw or not raw.startswith(TOKEN_PREFIX):
            return None
        return self.decode(raw.removeprefix(TOKEN_PREFIX), serializer=self._tokens)

    def decode(
        self, raw: str | None, *, serializer: URLSafeSerializer | None = None
    ) -> ConsoleSession | None:
        """The session in a cookie, or None if it is missing, forged or past its expiry."""
        if not raw or not _SIGNED_TEXT.fullmatch(raw):
            return None
        try:
            data: Any = (serializer or self._sessions).loads(raw)
            person = data.get("p")
            if person is not None and not isinstance(person, dict):
                return None
            session = ConsoleSession(str(data["n"]), float(data["e"]), data["o"], data["f"], person)
        except (BadSignature, KeyError, TypeError, ValueError, AttributeError):
            return None
        return session if session.expires > time.time() else None

    def csrf_token(self, session: ConsoleSession) -> str:
        return hmac.new(self._csrf_key, session.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: ConsoleSession | None, token: object) -> bool:
        if session is None or not isinstance(token, str) or not token:
            return False
        return hmac.compare_digest(token.encode(), self.csrf_token(session).encode())

    def encode_flash(self, flash: Flash) -> str:
        return self._flash.dumps([flash.ok, flash.text])

    def decode_flash(self, raw: str | None) -> Flash | None:
        if not raw:
            return None
        try:
            ok, text = self._flash.loads(raw, max_age=120)
        except (BadSignature, TypeError, ValueError):
            return None
        return Flash(bool(ok), str(text))


@dataclass(frozen=True, slots=True)
class SignedIn:
    """The operator behind a request; their votes are cast as ``person``."""

    operator: str
    person: str
    name: str
    csrf: str
    session: ConsoleSession
    voter: Voter | None = None
    """Signed in through OIDC: who votes (with their groups, aliases and assurance); None: the
    operator ``person``, identified by their password."""

    def may_operate(self, config: SignoffConfig) -> bool:
        """Whether they may act for the service (switches, revoking grants): an operator, or a
        person signed in through OIDC whom an operator entry decides as."""
        if self.voter is None:
            return True
        person = self.voter.person
        return person is not None and any((o.person or n) == person for n, o in config.operators.items())


class SignInRequired(Exception):
    """No valid session: send the browser to the sign-in page (and back to ``next`` after)."""

    def __init__(self, next_url: str, *, recheck: bool = False) -> None:
        super().__init__(next_url)
        self.next_url = next_url
        self.recheck = recheck
        """The session is signed in through OIDC and due to be checked with the provider again."""


class CsrfRefused(Exception):
    """A form came without the CSRF token of the session it was sent with."""


SIGN_IN_FAILURES = parse("5/15minutes")
"""Failed sign-ins allowed per client address and operator name, in a moving window."""
ADDRESS_FAILURES = parse("20/15minutes")
"""Failed sign-ins allowed per client address, whichever names it tries."""


class SignInLimiter:
    """Failed console sign-ins, counted per (client address, operator name) and per address.

    Past :data:`SIGN_IN_FAILURES` for one name, or :data:`ADDRESS_FAILURES` in all,
    sign-ins from that address (as that name, or at all) are refused without checking
    the password until the oldest failure leaves the window. Never per name alone: a
    stranger's failures would lock the operator out everywhere. A success clears only
    its own (address, name) count, so one good account cannot buy an address more
    guesses at others. Counted in memory by each process (each replica counts its own).
    """

    def __init__(
        self, per_name: RateLimitItem = SIGN_IN_FAILURES, per_address: RateLimitItem = ADDRESS_FAILURES
    ) -> None:
        self._per_name = per_name
        self._per_address = per_address
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def _limits(self, address: str, name: str) -> list[tuple[RateLimitItem, tuple[str, ...]]]:
        return [(self._per_address, ("address", address)), (self._per_name, ("as", address, name))]

    def retry_after(self, address: str, name: str) -> int:
        """Seconds until a sign-in from ``address`` as ``name`` may be tried (0: now)."""
        for limit, key in self._limits(address, name):
            if not self._limiter.test(limit, *key):
                reset = self._limiter.get_window_stats(limit, *key).reset_time
                return max(1, math.ceil(reset - time.time()))
        return 0

    def failed(self, address: str, name: str) -> None:
        for limit, key in self._limits(address, name):
            self._limiter.hit(limit, *key)

    def succeeded(self, address: str, name: str) -> None:
        self._limiter.clear(self._per_name, "as", address, name)


def limiter_of(request: Request) -> SignInLimiter:
    limiter: SignInLimiter = request.app.state.sign_in_limiter
    return limiter


def keys_of(request: Request) -> Keys:
    keys: Keys = request.app.state.console_keys
    return keys


def session_of(request: Request) -> ConsoleSession | None:
    return keys_of(request).decode(request.cookies.get(SESSION_COOKIE))


def voter_of(
    session: ConsoleSession, config: SignoffConfig, *, via: str, assurance: Assurance
) -> Voter | None:
    """Who votes with ``session`` (a console sign-in, or the identity in a personal token) when
    it still holds, identified at ``assurance`` (a password's, or the token's); None if it no
    longer holds (the password changed, the operator removed, OIDC reconfigured)."""
    if session.operator is None:
        return None
    if session.person is not None:
        from signoff.app.console import oidc

        voter = oidc.session_voter(session, config)
        if voter is None:
            return None
        if assurance is Assurance.OIDC:
            return voter
        return replace(voter, assurance=assurance, identity={**(voter.identity or {}), "via": via})
    if not config.console.password_sign_in:
        return None
    operator = config.operators.get(session.operator)
    if operator is None or session.fingerprint != fingerprint(operator):
        return None
    return operator_voter(operator.person or session.operator, config, via=via, assurance=assurance)


def _signed_in(request: Request, config: SignoffConfig) -> SignedIn | None:
    session = session_of(request)
    if session is None or session.operator is None:
        return None
    if session.person is not None:
        from signoff.app.console import oidc  # only where OIDC sessions exist

        voter = oidc.session_voter(session, config)
        if voter is None:
            return None
        return SignedIn(
            operator=session.operator,
            person=voter.key,
            name=voter.name or voter.key,
            csrf=keys_of(request).csrf_token(session),
            session=session,
            voter=voter,
        )
    if not config.console.password_sign_in:
        return None  # password sign-in turned off: its sessions end too
    operator = config.operators.get(session.operator)
    if operator is None or session.fingerprint != fingerprint(operator):
        return None
    person = operator.person or session.operator
    return SignedIn(
        operator=session.operator,
        person=person,
        name=config.display_name(person),
        csrf=keys_of(request).csrf_token(session),
        session=session,
    )


def _digest(session: ConsoleSession) -> str:
    return hashlib.sha256(session.nonce.encode()).hexdigest()


async def ended(runtime: Runtime, session: ConsoleSession) -> bool:
    """Whether ``session`` (or the personal token carrying it) was signed out or revoked."""
    return await _ended(runtime, session)


async def _ended(runtime: Runtime, session: ConsoleSession) -> bool:
    async with runtime.reads() as db:
        found = await db.exec(
            select(ConsoleSessionRevocation.session_digest).where(
                col(ConsoleSessionRevocation.session_digest) == _digest(session)
            )
        )
        return found.first() is not None


async def end_session(db: AsyncSession, session: ConsoleSession, *, operator: str) -> None:
    """Sign ``session`` out for good: from this transaction's commit on, every replica refuses
    its cookie. Sessions past their expiry (refused anyway) are forgotten meanwhile."""
    now = utcnow()
    await db.exec(delete(ConsoleSessionRevocation).where(col(ConsoleSessionRevocation.expires_at) < now))
    table = ConsoleSessionRevocation.__table__  # type: ignore[attr-defined]
    row = {
        "session_digest": _digest(session),
        "operator": operator,
        "revoked_at": now,
        "expires_at": datetime.fromtimestamp(session.expires, UTC),
    }
    # Signing out twice (two tabs) records it once.
    await db.exec(insert_ignoring(dialect_of(db), table, ("session_digest",)), params=[row])


async def current_operator(request: Request, runtime: Runtime) -> SignedIn | None:
    """The signed-in operator, if the request carries a live session (not signed out)."""
    who = _signed_in(request, runtime.config)
    if who is None or await _ended(runtime, who.session):
        return None
    return who


async def signed_in(request: Request, runtime: RuntimeDep) -> SignedIn:
    who = await current_operator(request, runtime)
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if who is None:
        raise SignInRequired(target if request.method == "GET" else HOME)
    if who.voter is not None:
        from signoff.app.console import oidc

        if oidc.due_for_recheck(who.session, runtime.config):
            # Nothing is done on a sign-in the provider has not confirmed lately.
            raise SignInRequired(target if request.method == "GET" else HOME, recheck=True)
    return who


SignedInDep = Annotated[SignedIn, Depends(signed_in)]


async def csrf_checked_form(request: Request, who: SignedInDep) -> FormData:
    form = await request.form()
    if not keys_of(request).csrf_ok(who.session, form.get("csrf_token")):
        raise CsrfRefused
    return form


CheckedFormDep = Annotated[FormData, Depends(csrf_checked_form)]


async def authenticate(config: SignoffConfig, name: str, password: str) -> Operator | None:
    """The operator if ``password`` is theirs (argon2 runs in a worker thread)."""
    operator = config.operators.get(name)
    if operator is None:
        await run_in_threadpool(waste_a_verification, password)
        return None
    ok = await run_in_threadpool(verify_password, operator.password_hash.get_secret_value(), password)
    return operator if ok else None


def set_session(response: Response, request: Request, session: ConsoleSession) -> None:
    keys = keys_of(request)
    response.set_cookie(
        SESSION_COOKIE,
        keys.encode(session),
        max_age=max(int(session.expires - time.time()), 1),
        path=COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def clear_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True, samesite="lax")


def set_flash(response: Response, request: Request, flash: Flash) -> None:
    response.set_cookie(
        FLASH_COOKIE,
        keys_of(request).encode_flash(flash),
        max_age=120,
        path=COOKIE_PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def read_flash(request: Request) -> Flash | None:
    return keys_of(request).decode_flash(request.cookies.get(FLASH_COOKIE))


def forget_flash(request: Request, response: Response) -> None:
    """Remove a flash message from the browser once a page has shown it."""
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(FLASH_COOKIE, path=COOKIE_PATH, httponly=True, samesite="lax")


def safe_next(value: object) -> str:
    """A console path to return to after signing in; anything else (another site) goes home."""
    if not isinstance(value, str) or not value.startswith(COOKIE_PATH) or "\\" in value:
        return HOME
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or value.startswith("//"):
        return HOME
    return value
