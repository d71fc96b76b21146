"""Console sign-in through the organisation's identity provider (OpenID Connect), with Authlib.

``GET /ui/login/oidc`` reads the provider's discovery document (once, then kept), and sends
the browser to its authorization endpoint with a fresh ``state``, ``nonce`` and PKCE (S256)
challenge; those three and where to return go in a short-lived signed cookie (path
``/ui/oidc``), never in the URL. ``GET /ui/oidc/callback`` takes the cookie once (it is
cleared whatever happens), refuses a ``state`` other than the cookie's, trades the code (with
the PKCE verifier) at the token endpoint, and has Authlib check the ID token: its signature
against the provider's keys (fetched again once when the token names a key not seen yet, so a
rotated key is taken and a forged one is not), the issuer, the audience (this client), the
expiry, the nonce, ``azp`` and ``at_hash``. Claims the ID token lacks (the groups, the
username claim) come from the userinfo endpoint, whose subject must be the token's.

The person signed in maps to ``people`` (:func:`person_of`) and votes as themselves, at
:attr:`Assurance.OIDC`, with the groups the provider named (``group:NAME`` approvers) and the
provider's subject as an alias against self-approval. The session cookie carries those claims;
changing the issuer or the client ends every such session (its fingerprint).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from signoff.app.config import OidcConfig, SignoffConfig, identity_key
from signoff.app.requests.eligibility import GROUP_PREFIX, Voter
from signoff.channels import Assurance

__all__ = [
    "FLOW_COOKIE",
    "FLOW_PATH",
    "Claims",
    "OidcClients",
    "SignInRefused",
    "callback_url",
    "fingerprint",
    "keep_groups",
    "person_of",
    "session_voter",
]

log = logging.getLogger("signoff")

FLOW_COOKIE = "signoff_oidc"
FLOW_PATH = "/ui/oidc"
CALLBACK_PATH = "/ui/oidc/callback"
FLOW_SECONDS = 600
"""How long a sign-in may take at the provider before its state is refused."""
LEEWAY_SECONDS = 60
"""Clock difference allowed with the provider on the ID token's times."""
MAX_GROUPS = 50
"""Groups kept in the session (those the configuration names as approvers)."""
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""ID token algorithms taken: signed with the provider's private key, never with a shared one."""


class SignInRefused(Exception):
    """The sign-in cannot complete; ``reason`` says why, in one line for the sign-in page.
    ``answered``: the refusal comes after the callback proved to be the answer to a sign-in
    this browser started (its state cookie and ``state`` agree); a callback that is not (a
    link from elsewhere) is refused without being taken for the provider's word."""

    def __init__(self, reason: str, *, answered: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.answered = answered


@dataclass(frozen=True, slots=True)
class Claims:
    """Who the provider says signed in, as the session keeps it."""

    issuer: str
    subject: str
    username: str
    email: str | None = None
    email_verified: bool | None = None
    name: str | None = None
    groups: tuple[str, ...] = field(default_factory=tuple)
    checked: float = 0.0
    """When the provider last confirmed this sign-in (Unix time)."""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "groups": list(self.groups)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Claims | None:
        try:
            groups = data.get("groups") or []
            return cls(
                issuer=str(data["issuer"]),
                subject=str(data["subject"]),
                username=str(data["username"]),
                email=_text(data.get("email")),
                email_verified=data.get("email_verified")
                if isinstance(data.get("email_verified"), bool)
                else None,
                name=_text(data.get("name")),
                groups=tuple(str(g) for g in groups if isinstance(g, str)),
                checked=float(data.get("checked") or 0.0),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def fingerprint(oidc: OidcConfig) -> str:
    """Binds a session to the provider and client it signed in through."""
    return hashlib.sha256(f"oidc\0{oidc.issuer}\0{oidc.client_id}".encode()).hexdigest()[:16]


def callback_url(public_url: str | None, request: Request) -> str:
    """Where the provider returns: ``SIGNOFF_PUBLIC_URL`` + ``/ui/oidc/callback`` (the request's
    own base when unset, for a server reached at one address)."""
    base = public_url or str(request.base_url).rstrip("/")
    return base + CALLBACK_PATH


def _named_groups(config: SignoffConfig) -> set[str]:
    """Every group the configuration names as an approver (spelling-insensitive)."""
    found: set[str] = set()
    for _, gates in ((a, config.confirmation_gates(a)) for a in config.agents):
        for _, gate in gates:
            listed = [*gate.approvers, *(x for e in gate.escalate for x in e.approvers)]
            found.update(
                identity_key(x.removeprefix(GROUP_PREFIX)) for x in listed if x.startswith(GROUP_PREFIX)
            )
    return found


def person_of(claims: Claims, config: SignoffConfig) -> str | None:
    """The directory key of whoever signed in: a person whose ``oidc`` id is the provider's
    subject; else, by ``username_claim``, a person with that email (verified, or not said to be
    with ``trust_unverified_email``), or for any other
    claim a person with that key or email. Never by a channel id (a username the person may
    choose must not claim someone's Slack id)."""
    oidc = config.console.oidc
    by_subject = config.person_for("oidc", claims.subject)
    if by_subject is not None:
        return by_subject
    if oidc is None:
        return None
    wanted = identity_key(claims.username)
    if oidc.username_claim == "email":
        if not (claims.email_verified or (claims.email_verified is None and oidc.trust_unverified_email)):
            return None
        return next(
            (k for k, p in config.people.items() if p.email and identity_key(p.email) == wanted), None
        )
    for key, person in config.people.items():
        if identity_key(key) == wanted or (person.email and identity_key(person.email) == wanted):
            return key
    return None


def due_for_recheck(session: Any, config: SignoffConfig) -> bool:
    """Whether an OIDC session's last confirmation by the provider is older than
    ``console.oidc.recheck_seconds`` (the provider is asked again before anything is shown or done)."""
    oidc = config.console.oidc
    claims = Claims.from_dict(session.person) if session.person is not None else None
    if oidc is None or claims is None:
        return False
    return time.time() - claims.checked >= oidc.recheck_seconds


def session_voter(session: Any, config: SignoffConfig) -> Voter | None:
    """Who votes from an OIDC console session (None: the session no longer holds: OIDC was
    turned off, or another provider or client configured)."""
    oidc = config.console.oidc
    if oidc is None or session.fingerprint != fingerprint(oidc) or session.person is None:
        return None
    claims = Claims.from_dict(session.person)
    if claims is None:
        return None
    person = person_of(claims, config)
    return Voter(
        channel="web",
        user_id=claims.username,
        name=config.display_name(person) if person else (claims.name or claims.username),
        person=person,
        identity={"via": "console", "issuer": claims.issuer, "subject": claims.subject},
        email=claims.email,
        operator=True,
        assurance=Assurance.OIDC,
        groups=frozenset(claims.groups),
        aliases=(claims.subject,),
    )


def _flow_serializer(secret_key: bytes) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret_key, salt="signoff.console.oidc")


class OidcClients:
    """One Authlib client per provider configuration (the discovery document and the keys it
    fetched are kept with it), and the signed cookie that carries a sign-in's state."""

    def __init__(self, secret: str) -> None:
        self._flows = _flow_serializer(
            hmac.new(secret.encode(), b"signoff.console.oidc", hashlib.sha256).digest()
        )
        self._clients: dict[OidcConfig, Any] = {}

    def client(self, oidc: OidcConfig) -> Any:
        from authlib.integrations.starlette_client import OAuth

        found = self._clients.get(oidc)
        if found is None:
            registry = OAuth()
            found = registry.register(
                "oidc",
                client_id=oidc.client_id,
                client_secret=oidc.client_secret.get_secret_value(),
                server_metadata_url=f"{oidc.issuer}/.well-known/openid-configuration",
                client_kwargs={
                    "scope": " ".join(oidc.scopes),
                    "code_challenge_method": "S256",
                    "timeout": 10,
                },
            )
            self._clients = {oidc: found}  # a changed configuration replaces the old client
        return found

    async def _metadata(self, oidc: OidcConfig) -> dict[str, Any]:
        client = self.client(oidc)
        try:
            metadata: dict[str, Any] = await client.load_server_metadata()
        except Exception as exc:
            self._clients.pop(oidc, None)  # try discovery again next time
            log.warning("console: OIDC discovery at %s failed: %r", oidc.issuer, exc)
            raise SignInRefused(
                f"The identity provider {oidc.issuer} could not be reached ({type(exc).__name__}); "
                "try again, or check console.oidc.issuer"
            ) from None
        if metadata.get("issuer") != oidc.issuer:
            self._clients.pop(oidc, None)
            raise SignInRefused(
                f"The identity provider's discovery document names issuer {metadata.get('issuer')!r}, "
                f"not {oidc.issuer!r}; set console.oidc.issuer to the provider's issuer"
            )
        # Only algorithms signed with the provider's private key, whatever the document offers.
        offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        metadata["id_token_signing_alg_values_supported"] = [a for a in offered if a in ASYMMETRIC] or [
            "RS256"
        ]
        return metadata

    async def start(
        self, oidc: OidcConfig, *, redirect_uri: str, next_url: str, silent: bool = False
    ) -> tuple[str, str]:
        """The provider's authorization URL to send the browser to, and the flow cookie's value
        (``silent``: the provider is to answer without a prompt, confirming a sign-in)."""
        await self._metadata(oidc)
        extra = {"prompt": "none"} if silent else {}
        found = await self.client(oidc).create_authorization_url(redirect_uri, **extra)
        flow = {
            "state": found["state"],
            "nonce": found["nonce"],
            "verifier": found["code_verifier"],
            "redirect_uri": redirect_uri,
            "next": next_url,
        }
        return str(found["url"]), self._flows.dumps(flow)

    def set_flow(self, response: Response, request: Request, value: str) -> None:
        response.set_cookie(
            FLOW_COOKIE,
            value,
            max_age=FLOW_SECONDS,
            path=FLOW_PATH,
            httponly=True,
            samesite="lax",  # the provider's redirect back is a top-level GET
            secure=request.url.scheme == "https",
        )

    @staticmethod
    def clear_flow(response: Response) -> None:
        response.delete_cookie(FLOW_COOKIE, path=FLOW_PATH, httponly=True, samesite="lax")

    def _flow(self, raw: str | None) -> dict[str, str]:
        if not raw:
            raise SignInRefused(
                "This sign-in was not started here or took longer than 10 minutes; sign in again"
            )
        try:
            flow: Any = self._flows.loads(raw, max_age=FLOW_SECONDS)
        except BadSignature:
            raise SignInRefused(
                "This sign-in's state is forged or older than 10 minutes; sign in again"
            ) from None
        if not isinstance(flow, dict) or not all(
            isinstance(flow.get(k), str) for k in ("state", "nonce", "verifier")
        ):
            raise SignInRefused("This sign-in's state is unreadable; sign in again")
        return {str(k): str(v) for k, v in flow.items()}

    async def finish(self, oidc: OidcConfig, request: Request) -> tuple[Claims, str]:
        """Check the provider's answer and return who signed in, and where to go next.

        Raises :class:`SignInRefused` for anything that does not hold (the state, the code,
        the ID token's signature, issuer, audience, expiry or nonce). The state is checked
        first: an ``error`` only counts as the provider's in the answer to this browser's own
        sign-in."""
        params = request.query_params
        flow = self._flow(request.cookies.get(FLOW_COOKIE))
        state, code = params.get("state") or "", params.get("code") or ""
        if not hmac.compare_digest(state.encode(), flow["state"].encode()):
            raise SignInRefused("This sign-in's state does not match the one it started with; sign in again")
        try:
            return await self._finish(oidc, request, flow, code)
        except SignInRefused as exc:
            exc.answered = True  # the answer to this browser's own sign-in
            raise

    async def _finish(
        self, oidc: OidcConfig, request: Request, flow: dict[str, str], code: str
    ) -> tuple[Claims, str]:
        from authlib.integrations.base_client import OAuthError
        from joserfc.errors import JoseError

        params = request.query_params
        if params.get("error"):
            text = (params.get("error_description") or params["error"])[:300]
            raise SignInRefused(f"The identity provider refused the sign-in: {text}")
        if not code:
            raise SignInRefused("The identity provider sent no authorization code; sign in again")
        metadata = await self._metadata(oidc)
        client = self.client(oidc)
        try:
            token = await client.fetch_access_token(
                redirect_uri=flow["redirect_uri"], code=code, code_verifier=flow["verifier"]
            )
        except OAuthError as exc:
            raise SignInRefused(
                f"The identity provider refused the authorization code ({exc.error}); sign in again"
            ) from None
        except Exception as exc:
            log.warning("console: OIDC token request to %s failed: %r", oidc.issuer, exc)
            raise SignInRefused("The identity provider's token endpoint failed; try again") from None
        if not isinstance(token, dict) or "id_token" not in token:
            raise SignInRefused("The identity provider returned no ID token; is the openid scope allowed?")
        options = {
            "iss": {"essential": True, "value": oidc.issuer},
            "aud": {"essential": True, "value": oidc.client_id},
            "sub": {"essential": True},
            "exp": {"essential": True},
        }
        try:
            claims = await client.parse_id_token(
                token, nonce=flow["nonce"], claims_options=options, leeway=LEEWAY_SECONDS
            )
        except JoseError as exc:
            log.warning("console: ID token from %s refused: %s", oidc.issuer, exc)
            raise SignInRefused(f"The ID token was refused ({_jose_reason(exc)}); sign in again") from None
        except Exception as exc:
            log.warning("console: checking the ID token from %s failed: %r", oidc.issuer, exc)
            raise SignInRefused("The ID token could not be checked; try again") from None
        values: dict[str, Any] = dict(claims)
        wanted = [oidc.username_claim, *([oidc.groups_claim] if oidc.groups_claim else [])]
        if any(c not in values for c in wanted) and metadata.get("userinfo_endpoint"):
            values = {**(await self._userinfo(client, token, str(values["sub"]))), **values}
        return _claims(oidc, values, self._groups_kept(values, oidc)), flow.get("next", "/ui/")

    @staticmethod
    async def _userinfo(client: Any, token: dict[str, Any], subject: str) -> dict[str, Any]:
        try:
            info = dict(await client.userinfo(token=token))
        except Exception as exc:
            log.warning("console: OIDC userinfo failed: %r", exc)
            raise SignInRefused("The identity provider's userinfo endpoint failed; try again") from None
        if info.get("sub") != subject:
            raise SignInRefused("The identity provider's userinfo names another subject than the ID token")
        return info

    @staticmethod
    def _groups_kept(values: Mapping[str, Any], oidc: OidcConfig) -> list[str]:
        raw = values.get(oidc.groups_claim) if oidc.groups_claim else None
        if isinstance(raw, str):
            raw = [raw]
        return [g for g in raw if isinstance(g, str)] if isinstance(raw, list) else []


def _claims(oidc: OidcConfig, values: Mapping[str, Any], groups: list[str]) -> Claims:
    username = _text(values.get(oidc.username_claim))
    if username is None:
        raise SignInRefused(
            f"The identity provider did not say {oidc.username_claim!r} for this account; ask for the "
            "claim's scope in console.oidc.scopes, or set console.oidc.username_claim"
        )
    return Claims(
        checked=time.time(),
        issuer=str(values["iss"]),
        subject=str(values["sub"]),
        username=username,
        email=_text(values.get("email")),
        email_verified=_verified(values.get("email_verified")),
        name=_text(values.get("name")),
        groups=tuple(groups),
    )


def _verified(value: object) -> bool | None:
    """``email_verified`` as the provider said it: None when it did not say; True only for
    ``true`` (or the string ``"true"``, as some providers' userinfo spells it); anything else
    said (``"false"``, ``0``, …) is False."""
    if value is None or isinstance(value, bool):
        return value
    return isinstance(value, str) and value.strip().lower() == "true"


def keep_groups(claims: Claims, config: SignoffConfig) -> Claims:
    """``claims`` with only the groups the configuration names as approvers (a session cookie
    holds a few kilobytes; a provider may list hundreds of groups)."""
    named = _named_groups(config)
    kept = [g for g in claims.groups if identity_key(g) in named][:MAX_GROUPS]
    return Claims(**{**asdict(claims), "groups": tuple(kept)})


def _jose_reason(exc: Exception) -> str:
    """What was wrong with the ID token, in a few words."""
    name = type(exc).__name__
    known = {
        "BadSignatureError": "its signature is not the provider's",
        "InvalidKeyIdError": "it is signed with a key the provider does not publish",
        "ExpiredTokenError": "it has expired",
        "InvalidTokenError": "it is not valid yet",
        "MissingClaimError": "a required claim is missing",
    }
    if name == "InvalidClaimError":
        claim = str(getattr(exc, "claim", "") or exc)
        return f"its {claim} claim is wrong" if claim else "a claim is wrong"
    return known.get(name, str(exc) or name)
