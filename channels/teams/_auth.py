"""Bot Framework authentication: the JWT on every invoke, and the bot's own token for the connector.

Incoming: the Bot Connector signs each request with RS256 under a key of the JWKS its
OpenID metadata names. :class:`InvokeVerifier` checks the signature, the issuer (the
metadata's), the audience (the bot's app id), the validity period (with
:data:`LEEWAY_SECONDS`) and, with the activity, the ``serviceurl`` claim and the key's
endorsement of the activity's ``channelId``. PyJWT does the cryptography and the claims;
the metadata and keys are fetched with httpx, cached for :data:`KEYS_LIFESPAN` and fetched
again for a key id not seen yet (at most once per :data:`REFRESH_COOLDOWN`).

Outgoing: :class:`BotToken` holds a client-credentials token until shortly before it
expires, one fetch at a time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import httpx
import jwt
from jwt.exceptions import InvalidKeyError, InvalidTokenError, PyJWKError

from signoff.channels._contract import (
    CallbackRejected,
    DeliveryError,
    PermanentDeliveryError,
    RetryableDeliveryError,
)
from signoff.channels.teams._config import checked_url

__all__ = [
    "KEYS_LIFESPAN",
    "LEEWAY_SECONDS",
    "REFRESH_COOLDOWN",
    "BotToken",
    "InvokeVerifier",
    "Verified",
    "bearer_token",
    "retry_after",
]

LEEWAY_SECONDS = 60
"""Clock skew allowed on ``exp`` and ``nbf`` (Bot Framework's own SDKs allow 300 s)."""
KEYS_LIFESPAN = 24 * 3600.0
"""Seconds the metadata and its keys are used before they are fetched again."""
REFRESH_COOLDOWN = 30.0
"""An unknown key id fetches the keys again at most this often (PyJWKClient's default)."""
_FETCH_TIMEOUT = 5.0
_TOKEN_MARGIN = 300.0
"""A token is renewed this long before it expires."""
_MAX_TOKEN_CHARS = 16_384


def _moment(value: object) -> TypeGuard[int | float]:
    """Whether a token's time claim is a finite number of seconds."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def bearer_token(headers: Mapping[str, str]) -> str:
    """The token of ``Authorization: Bearer …``; :class:`CallbackRejected` (401) without one."""
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise CallbackRejected("no Bot Framework bearer token")
    if len(token) > _MAX_TOKEN_CHARS:
        raise CallbackRejected("bearer token too long")
    return token


@dataclass(frozen=True, slots=True)
class _Keys:
    issuer: str
    keys: Mapping[str, tuple[jwt.PyJWK, frozenset[str] | None]]
    """kid → the key and its endorsements (None: the key lists none)."""
    fetched: float


@dataclass(frozen=True, slots=True)
class Verified:
    """A token whose signature, issuer, audience and validity have been checked."""

    claims: Mapping[str, Any]
    endorsements: frozenset[str] | None
    """The channels its signing key endorses (None: the key lists none)."""

    def check_activity(self, *, service_url: object, channel_id: object) -> None:
        """That the activity the token came with was sent through the ``serviceurl`` the token
        names, on a channel its key endorses; :class:`CallbackRejected` if not."""
        claimed = self.claims.get("serviceurl", self.claims.get("serviceUrl"))
        if not isinstance(claimed, str) or not isinstance(service_url, str):
            raise CallbackRejected("bearer token or activity names no serviceUrl")
        if claimed.rstrip("/") != service_url.rstrip("/"):
            raise CallbackRejected("activity serviceUrl differs from the token's")
        if self.endorsements is not None and (
            not isinstance(channel_id, str) or channel_id not in self.endorsements
        ):
            raise CallbackRejected("signing key does not endorse the activity's channel", status_code=403)


class InvokeVerifier:
    """Verifies the Bot Framework JWT of a request to the messaging endpoint.

    ``clock`` gives the time for both the token's validity period and the key cache (tests
    pass their own)."""

    def __init__(
        self,
        *,
        app_id: str,
        metadata_url: str,
        client: httpx.AsyncClient,
        clock: Callable[[], float] = time.time,
        cooldown: float = REFRESH_COOLDOWN,
    ) -> None:
        self._app_id = app_id
        self._metadata_url = metadata_url
        self._client = client
        self._clock = clock
        self._cooldown = cooldown
        self._keys: _Keys | None = None
        self._lock = asyncio.Lock()

    async def verify(self, token: str) -> Verified:
        """``token`` verified on its own (signature, issuer, audience, validity); the activity's
        part (:meth:`Verified.check_activity`) follows once the body is read. Raises
        :class:`CallbackRejected` saying why it is refused."""
        try:
            header = jwt.get_unverified_header(token)
        except InvalidTokenError:
            raise CallbackRejected("bearer token is not a JWT") from None
        kid = header.get("kid")
        if header.get("alg") != "RS256" or not isinstance(kid, str) or not kid:
            raise CallbackRejected("bearer token is not RS256 with a key id")
        keys = await self._keys_with(kid)
        found = keys.keys.get(kid)
        if found is None:
            raise CallbackRejected("bearer token signed with an unknown key")
        key, endorsements = found
        now = self._clock()
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self._app_id,
                issuer=keys.issuer,
                # The time claims are checked below against the injected clock.
                options={
                    "require": ["exp", "iss", "aud"],
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidAudienceError:
            raise CallbackRejected("bearer token is for another app (audience)") from None
        except jwt.InvalidIssuerError:
            raise CallbackRejected("bearer token from another issuer") from None
        except jwt.InvalidSignatureError:
            raise CallbackRejected("bearer token signature does not verify") from None
        except InvalidTokenError as exc:
            raise CallbackRejected(f"bearer token refused: {type(exc).__name__}") from None
        exp, nbf = claims.get("exp"), claims.get("nbf")
        # Written so that a time that is no number (NaN included) refuses.
        if not _moment(exp) or not now < exp + LEEWAY_SECONDS:
            raise CallbackRejected("bearer token expired")
        if nbf is not None and (not _moment(nbf) or not nbf - LEEWAY_SECONDS <= now):
            raise CallbackRejected("bearer token not valid yet")
        return Verified(claims, endorsements)

    async def _keys_with(self, kid: str) -> _Keys:
        """The cached keys, fetched when there are none, when they are old, or when they do not
        hold ``kid`` and the last fetch is older than the cooldown."""
        async with self._lock:
            keys, now = self._keys, self._clock()
            stale = keys is None or now - keys.fetched >= KEYS_LIFESPAN
            unknown = keys is not None and kid not in keys.keys and now - keys.fetched >= self._cooldown
            if stale or unknown:
                try:
                    self._keys = keys = await self._fetch(now)
                except DeliveryError as exc:
                    if keys is None or stale:
                        raise CallbackRejected(
                            f"Bot Framework signing keys unavailable: {exc.reason}", status_code=503
                        ) from None
            assert keys is not None
            return keys

    async def _fetch(self, now: float) -> _Keys:
        metadata = await self._json(self._metadata_url, "OpenID metadata")
        issuer, jwks_uri = metadata.get("issuer"), metadata.get("jwks_uri")
        if not isinstance(issuer, str) or not issuer or not isinstance(jwks_uri, str):
            raise PermanentDeliveryError("OpenID metadata names no issuer and jwks_uri")
        try:
            jwks_uri = checked_url(jwks_uri)
        except ValueError as exc:
            raise PermanentDeliveryError(f"OpenID metadata jwks_uri {exc}") from None
        document = await self._json(jwks_uri, "signing keys")
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise PermanentDeliveryError("signing keys document has no keys")
        keys: dict[str, tuple[jwt.PyJWK, frozenset[str] | None]] = {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("kty") != "RSA" or entry.get("use", "sig") != "sig":
                continue
            kid, listed = entry.get("kid"), entry.get("endorsements")
            if not isinstance(kid, str):
                continue
            try:
                key = jwt.PyJWK(entry, algorithm="RS256")
            except (PyJWKError, InvalidKeyError):  # numbers that make no RSA key
                continue
            endorsed = (
                frozenset(e for e in listed if isinstance(e, str)) if isinstance(listed, list) else None
            )
            keys[kid] = (key, endorsed)
        return _Keys(issuer, keys, now)

    async def _json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = await self._client.get(url, timeout=_FETCH_TIMEOUT)
        except httpx.HTTPError as exc:
            raise RetryableDeliveryError(f"{what}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise RetryableDeliveryError(f"{what}: HTTP {response.status_code}")
        try:
            data = response.json()
        except (ValueError, RecursionError):
            raise RetryableDeliveryError(f"{what}: not JSON") from None
        if not isinstance(data, dict):
            raise PermanentDeliveryError(f"{what}: not a JSON object")
        return data


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds, when the response says it."""
    raw = response.headers.get("retry-after")
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


class BotToken:
    """The bot's client-credentials token for the connector, cached until shortly before it
    expires; one request at a time asks for a new one."""

    def __init__(
        self,
        *,
        url: str,
        app_id: str,
        password: str,
        scope: str,
        client: httpx.AsyncClient,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._form = {
            "grant_type": "client_credentials",
            "client_id": app_id,
            "client_secret": password,
            "scope": scope,
        }
        self._client = client
        self._clock = clock
        self._token: tuple[str, float] | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0
        """How many tokens were asked for (a test reads it)."""

    def forget(self, token: str) -> None:
        """Drop ``token`` (the connector refused it): the next call asks for a new one."""
        if self._token is not None and self._token[0] == token:
            self._token = None

    async def get(self) -> str:
        """A valid token; :class:`DeliveryError` when none can be had."""
        async with self._lock:
            if self._token is not None and self._clock() < self._token[1]:
                return self._token[0]
            self.fetches += 1
            try:
                response = await self._client.post(self._url, data=self._form, timeout=10.0)
            except httpx.HTTPError as exc:
                raise RetryableDeliveryError(f"Teams token request failed: {type(exc).__name__}") from None
            try:
                body = response.json()
            except (ValueError, UnicodeDecodeError):
                body = None
            body = body if isinstance(body, dict) else {}
            if response.status_code == 429 or response.status_code >= 500:
                raise RetryableDeliveryError(
                    f"Teams token request failed (HTTP {response.status_code})",
                    retry_after=retry_after(response),
                )
            token, lifetime = body.get("access_token"), body.get("expires_in")
            if response.status_code != 200 or not isinstance(token, str) or not token:
                error = body.get("error") or f"HTTP {response.status_code}"
                lines = str(body.get("error_description") or "").splitlines()
                detail = f": {lines[0][:200]}" if lines else ""
                hint = (
                    " - check app_id, app_password and tenant_id"
                    if error in ("invalid_client", "unauthorized_client", "invalid_request")
                    else ""
                )
                raise PermanentDeliveryError(f"Teams token request refused ({error}{detail}){hint}")
            # The endpoint always says (as a number; some proxies pass it as a string); an hour is
            # what it gives.
            try:
                seconds = float(str(lifetime)) if isinstance(lifetime, int | float | str) else 3600.0
            except ValueError:
                seconds = 3600.0
            self._token = (token, self._clock() + max(seconds - _TOKEN_MARGIN, 30.0))
            return token
