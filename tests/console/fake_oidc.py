"""An OpenID Connect provider on a loopback port, behaving like a real one for the parts the
console uses: discovery, an authorization endpoint that signs in whoever the test names,
a token endpoint (client_secret_basic, single-use codes bound to their redirect URI and PKCE
S256 challenge), userinfo, and a JWKS that can rotate. Its keys are RSA keys made with
``cryptography``; ID tokens are signed with joserfc.

Tests bend one thing at a time to attack the console: :attr:`FakeProvider.tamper` overrides
claims of the next ID tokens, :attr:`FakeProvider.forge` signs them with a key it does not
publish, :meth:`FakeProvider.rotate` publishes a new key and signs with it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jwt
from joserfc.jwk import RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.conftest import _Uvicorn, free_port

CLIENT_ID = "signoff-console"
CLIENT_SECRET = "console-client-secret-0123456789"


def rsa_key(kid: str) -> RSAKey:
    """A fresh 2048-bit RSA key (made with ``cryptography``) as a JWK named ``kid``."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return RSAKey.import_key(pem, {"kid": kid, "use": "sig", "alg": "RS256"})


@dataclass
class Account:
    subject: str
    email: str
    name: str = ""
    groups: list[str] = field(default_factory=list)
    email_verified: bool | None = True
    """None: the provider never says (Microsoft Entra ID)."""


@dataclass
class _Code:
    account: Account
    client_id: str
    redirect_uri: str
    nonce: str | None
    challenge: str
    used: bool = False


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


class FakeProvider:
    """The provider; ``async with`` serves it on ``url``."""

    def __init__(self, *, groups_in_id_token: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.issuer = self.url
        """What discovery and the ID tokens name as the issuer (a test may change it)."""
        self.clients = {CLIENT_ID: CLIENT_SECRET}
        self.keys = [rsa_key("key-1")]
        self.signing = self.keys[0]
        self.account: Account | None = None
        """Who is signed in at the provider (None: the authorization endpoint refuses)."""
        self.tamper: dict[str, Any] = {}
        self.forge = False
        self.groups_in_id_token = groups_in_id_token
        self.prompts: list[str | None] = []
        """The ``prompt`` of each sign-in answered."""
        self.jwks_fetches = 0
        self.discovery_fetches = 0
        self._codes: dict[str, _Code] = {}
        self._tokens: dict[str, Account] = {}
        app = Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
                Route("/userinfo", self._userinfo),
                Route("/jwks", self._jwks),
            ]
        )
        self._server = _Uvicorn(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._task: Any = None

    async def __aenter__(self) -> FakeProvider:
        import asyncio

        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
            if self._task.done():
                self._task.result()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.stop.set()
        await self._task

    def rotate(self, *, keep_old: bool = False) -> RSAKey:
        """Publish a new key and sign with it from now on (the old one withdrawn, unless ``keep_old``)."""
        key = rsa_key(f"key-{len(self.keys) + 1}-{secrets.token_hex(3)}")
        self.keys = [*self.keys, key] if keep_old else [key]
        self.signing = key
        return key

    # --- the endpoints ------------------------------------------------------------------------

    async def _discovery(self, request: Request) -> Response:
        self.discovery_fetches += 1
        return JSONResponse(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.url}/authorize",
                "token_endpoint": f"{self.url}/token",
                "userinfo_endpoint": f"{self.url}/userinfo",
                "jwks_uri": f"{self.url}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "scopes_supported": ["openid", "email", "profile", "groups"],
            }
        )

    async def _jwks(self, request: Request) -> Response:
        self.jwks_fetches += 1
        return JSONResponse({"keys": [k.as_dict(private=False) for k in self.keys]})

    async def _authorize(self, request: Request) -> Response:
        q = request.query_params
        if self.clients.get(q.get("client_id", "")) is None:
            return JSONResponse({"error": "invalid_client"}, status_code=400)
        redirect_uri = q.get("redirect_uri", "")
        if not redirect_uri.startswith("http://127.0.0.1:"):
            return JSONResponse({"error": "invalid_request", "error_description": "redirect_uri"}, 400)
        back = {"state": q.get("state", "")}
        if q.get("response_type") != "code" or "openid" not in q.get("scope", "").split():
            return RedirectResponse(f"{redirect_uri}?{urlencode({**back, 'error': 'invalid_request'})}", 302)
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            refused = {**back, "error": "invalid_request", "error_description": "PKCE S256 required"}
            return RedirectResponse(f"{redirect_uri}?{urlencode(refused)}", 302)
        if self.account is None:  # nobody signed in here, or the account is disabled
            error = "login_required" if q.get("prompt") == "none" else "access_denied"
            return RedirectResponse(f"{redirect_uri}?{urlencode({**back, 'error': error})}", 302)
        self.prompts.append(q.get("prompt"))
        code = secrets.token_urlsafe(16)
        self._codes[code] = _Code(
            self.account, q["client_id"], redirect_uri, q.get("nonce"), q["code_challenge"]
        )
        return RedirectResponse(f"{redirect_uri}?{urlencode({'code': code, **back})}", 302)

    def _client(self, request: Request, form: Any) -> str | None:
        header = request.headers.get("authorization", "")
        if header.startswith("Basic "):
            client_id, _, secret = base64.b64decode(header[6:]).decode().partition(":")
        else:
            client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        return client_id if self.clients.get(client_id) == secret else None

    async def _token(self, request: Request) -> Response:
        form = await request.form()
        client_id = self._client(request, form)
        if client_id is None:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        found = self._codes.get(str(form.get("code", "")))
        if found is None or found.used or found.client_id != client_id:
            return JSONResponse({"error": "invalid_grant", "error_description": "code unknown or used"}, 400)
        found.used = True  # single use, as RFC 6749 §4.1.2 demands
        if form.get("redirect_uri") != found.redirect_uri:
            return JSONResponse({"error": "invalid_grant", "error_description": "redirect_uri"}, 400)
        if _s256(str(form.get("code_verifier", ""))) != found.challenge:
            return JSONResponse({"error": "invalid_grant", "error_description": "PKCE verifier"}, 400)
        access = secrets.token_urlsafe(24)
        self._tokens[access] = found.account
        return JSONResponse(
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": self.id_token(found.account, client_id, found.nonce),
            }
        )

    def id_token(self, account: Account, client_id: str, nonce: str | None) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": account.subject,
            "aud": client_id,
            "iat": now,
            "exp": now + 300,
            "email": account.email,
            "name": account.name,
        }
        if account.email_verified is not None:
            claims["email_verified"] = account.email_verified
        if nonce is not None:
            claims["nonce"] = nonce
        if self.groups_in_id_token:
            claims["groups"] = account.groups
        claims.update(self.tamper)
        key = self.signing
        if self.forge:  # the published kid, someone else's key
            key = rsa_key(str(self.signing.kid))
        return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)

    async def _userinfo(self, request: Request) -> Response:
        header = request.headers.get("authorization", "")
        account = self._tokens.get(header.removeprefix("Bearer ")) if header.startswith("Bearer ") else None
        if account is None:
            return JSONResponse({"error": "invalid_token"}, status_code=401)
        return JSONResponse(
            {
                "sub": account.subject,
                "email": account.email,
                "name": account.name,
                "groups": account.groups,
                **({} if account.email_verified is None else {"email_verified": account.email_verified}),
            }
        )
