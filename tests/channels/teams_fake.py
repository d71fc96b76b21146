"""A fake Bot Framework on loopback: OpenID metadata, signing keys, the token endpoint and the
Teams connector, answering as the real services do, errors included.

Keys are RSA keys made here with ``cryptography``; :meth:`FakeBotFramework.invoke` signs an
``adaptiveCard/action`` invoke as the Bot Connector sends one to a messaging endpoint (a JWT
with ``iss``, ``aud``, ``serviceurl``, ``nbf``, ``exp``, under a key listed with the
``msteams`` endorsement). The token endpoint takes the client-credentials grant and refuses
a wrong secret (``invalid_client``, AADSTS7000215) or tenant; the connector takes only its
own live tokens, posts to known conversations (and to a thread under a card it holds), puts
updates only over messages it holds, refuses a card over 28 KB (413) and can be told to
fail the next call with a 429 + ``Retry-After`` or a 5xx. Every call is recorded.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

APP_ID = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
PASSWORD = "test-client-secret~0123456789"
CONVERSATION = "19:c0ffee0123456789abcdef@thread.tacv2"
ISSUER = "https://api.botframework.com"
MAX_ACTIVITY_BYTES = 28 * 1024


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: Any
    token: str | None


@dataclass(frozen=True)
class Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    html: bool = False


class FakeBotFramework:
    """``await fake.start()``; point a Teams channel at :attr:`metadata_url`, :attr:`token_url`
    and :attr:`service_url`; ``await fake.close()``."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.published: list[str] = []
        self.endorsements: dict[str, list[str]] = {}
        self.calls: list[Call] = []
        self.conversations: set[str] = {CONVERSATION}
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        """(conversation, activity id) → the activity as last posted or put."""
        self.replies: list[tuple[str, dict[str, Any]]] = []
        self.members: dict[str, dict[str, Any]] = {}
        self.tokens: set[str] = set()
        self.key_fetches = 0
        self._ids = itertools.count(1_700_000_000_001)
        self._scripted: defaultdict[str, deque[Scripted]] = defaultdict(deque)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.rotate()

    # Keys and tokens

    def rotate(self, *, keep: bool = True) -> str:
        """A new signing key, published (beside the old ones when ``keep``); its kid."""
        kid = uuid.uuid4().hex
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.endorsements[kid] = ["msteams"]
        self.published = [*self.published, kid] if keep else [kid]
        return kid

    @property
    def kid(self) -> str:
        """The key the Bot Connector signs with now."""
        return self.published[-1]

    def sign(
        self, claims: dict[str, Any], *, kid: str | None = None, key: rsa.RSAPrivateKey | None = None
    ) -> str:
        kid = kid or self.kid
        private = key or self.keys[kid]
        return jwt.encode(claims, private, algorithm="RS256", headers={"kid": kid, "x5t": kid, "typ": "JWT"})

    def claims(self, **changes: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "serviceurl": self.service_url,
            "nbf": now - 10,
            "exp": now + 3600,
            "iss": ISSUER,
            "aud": APP_ID,
        }
        claims.update(changes)
        return {k: v for k, v in claims.items() if v is not None}

    def activity(
        self,
        request_id: str,
        verb: str = "approve",
        *,
        aad: str,
        name: str = "Someone",
        data: dict[str, Any] | None = None,
        reply_to: str | None = None,
        conversation: str = CONVERSATION,
        tenant: str = TENANT,
        activity_id: str | None = None,
    ) -> dict[str, Any]:
        """An ``adaptiveCard/action`` invoke as Teams sends it when someone presses a card's
        ``Action.Execute`` in a channel: the card's inputs merged into ``data``."""
        reply_to = reply_to or next(iter(i for (c, i) in self.messages if c == conversation), "1700000000000")
        return {
            "name": "adaptiveCard/action",
            "type": "invoke",
            "timestamp": "2026-12-02T17:00:00.000Z",
            "localTimestamp": "2026-12-02T18:00:00.000+01:00",
            "id": activity_id or f"f:{uuid.uuid4().int % 10**19}",
            "channelId": "msteams",
            "serviceUrl": self.service_url,
            "from": {"id": f"29:1{aad.replace('-', '')[:20]}", "name": name, "aadObjectId": aad},
            "conversation": {
                "isGroup": True,
                "conversationType": "channel",
                "tenantId": tenant,
                "id": f"{conversation};messageid={reply_to}",
            },
            "recipient": {"id": f"28:{APP_ID}", "name": "Signoff"},
            "entities": [{"locale": "en-US", "platform": "Web", "type": "clientInfo"}],
            "channelData": {
                "channel": {"id": conversation},
                "team": {"id": conversation},
                "tenant": {"id": tenant},
                "source": {"name": "message"},
                "legacy": {"replyToId": reply_to},
            },
            "replyToId": reply_to,
            "value": {
                "action": {
                    "type": "Action.Execute",
                    "title": verb.capitalize(),
                    "verb": verb,
                    "data": {"request_id": request_id, **(data or {})},
                },
                "trigger": "manual",
            },
            "locale": "en-US",
        }

    def invoke(self, activity: dict[str, Any], *, token: str | None = None) -> tuple[bytes, dict[str, str]]:
        """The request the Bot Connector makes to the messaging endpoint for ``activity``."""
        token = token or self.sign(self.claims(serviceurl=activity.get("serviceUrl")))
        headers = {"content-type": "application/json; charset=utf-8", "authorization": f"Bearer {token}"}
        return json.dumps(activity).encode(), headers

    # Server

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metadata_url(self) -> str:
        return f"{self.origin}/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return f"{self.origin}/{TENANT}/oauth2/v2.0/token"

    @property
    def service_url(self) -> str:
        return f"{self.origin}/teams/"

    def config(self, **changes: Any) -> dict[str, Any]:
        """A channel's configuration pointing at this fake."""
        return {
            "type": "teams",
            "app_id": APP_ID,
            "app_password": PASSWORD,
            "tenant_id": TENANT,
            "conversation_id": CONVERSATION,
            "service_url": self.service_url,
            "openid_metadata_url": self.metadata_url,
            "token_url": self.token_url,
            **changes,
        }

    async def start(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_get("/v1/.well-known/openidconfiguration", self._metadata)
        app.router.add_get("/v1/.well-known/keys", self._jwks)
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token)
        app.router.add_post("/teams/v3/conversations/{conversation}/activities", self._post)
        app.router.add_put("/teams/v3/conversations/{conversation}/activities/{activity}", self._put)
        app.router.add_get("/teams/v3/conversations/{conversation}/members/{member}", self._member)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def fail_next(self, kind: str, answer: Scripted) -> None:
        """Answer the next ``post``, ``put``, ``token`` or ``member`` call with ``answer``."""
        self._scripted[kind].append(answer)

    def calls_to(self, method: str, fragment: str = "") -> list[Call]:
        return [c for c in self.calls if c.method == method and fragment in c.path]

    def card(self, activity_id: str, conversation: str = CONVERSATION) -> dict[str, Any]:
        """The Adaptive Card of a message as the conversation shows it now."""
        content: dict[str, Any] = self.messages[(conversation, activity_id)]["attachments"][0]["content"]
        return content

    def _scripted_answer(self, kind: str) -> web.Response | None:
        if not self._scripted[kind]:
            return None
        answer = self._scripted[kind].popleft()
        if answer.html:
            return web.Response(
                status=answer.status, text="<html>Bad gateway</html>", content_type="text/html"
            )
        body = {"error": {"code": "ServiceError", "message": "Too many requests or an outage"}}
        return web.json_response(body, status=answer.status, headers=answer.headers)

    async def _metadata(self, request: web.Request) -> web.Response:
        self.calls.append(Call("GET", request.path, None, None))
        return web.json_response(
            {
                "issuer": ISSUER,
                "authorization_endpoint": "https://invalid.botframework.com",
                "jwks_uri": f"{self.origin}/v1/.well-known/keys",
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            }
        )

    async def _jwks(self, request: web.Request) -> web.Response:
        self.key_fetches += 1
        self.calls.append(Call("GET", request.path, None, None))
        keys = []
        for kid in self.published:
            numbers = self.keys[kid].public_key().public_numbers()
            keys.append(
                {
                    "kty": "RSA",
                    "use": "sig",
                    "kid": kid,
                    "x5t": kid,
                    "n": _b64(numbers.n),
                    "e": _b64(numbers.e),
                    "endorsements": self.endorsements[kid],
                }
            )
        return web.json_response({"keys": keys})

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.calls.append(
            Call("POST", request.path, {k: v for k, v in form.items() if k != "client_secret"}, None)
        )
        if (scripted := self._scripted_answer("token")) is not None:
            return scripted
        if request.match_info["tenant"] != TENANT:
            return web.json_response(
                {"error": "invalid_request", "error_description": "AADSTS90002: Tenant not found."},
                status=400,
            )
        if (
            form.get("grant_type") != "client_credentials"
            or form.get("scope") != "https://api.botframework.com/.default"
        ):
            return web.json_response(
                {
                    "error": "invalid_scope",
                    "error_description": "AADSTS70011: The provided value for scope is not valid.",
                },
                status=400,
            )
        if form.get("client_id") != APP_ID or form.get("client_secret") != PASSWORD:
            return web.json_response(
                {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided. Ensure the secret "
                    "being sent in the request is the client secret value, not the client secret ID.",
                },
                status=401,
            )
        token = f"eyJ0eXAiOiJKV1Qi.fake.{uuid.uuid4().hex}"
        self.tokens.add(token)
        return web.json_response(
            {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}
        )

    def _authorised(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        return token if token in self.tokens else None

    async def _connector(self, request: web.Request, kind: str) -> tuple[Any, web.Response | None]:
        body = await request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        token = request.headers.get("Authorization", "").removeprefix("Bearer ") or None
        self.calls.append(Call(request.method, unquote(request.path), data, token))
        if (scripted := self._scripted_answer(kind)) is not None:
            return data, scripted
        if self._authorised(request) is None:
            return data, web.json_response(
                {"message": "Authorization has been denied for this request."}, status=401
            )
        if len(body) > MAX_ACTIVITY_BYTES:
            return data, web.json_response(
                {"error": {"code": "MessageSizeTooBig", "message": "Message size too big"}}, status=413
            )
        if kind in ("post", "put") and not _valid_activity(data):
            return data, web.json_response(
                {
                    "error": {
                        "code": "BadArgument",
                        "message": "Activity is not a message with an Adaptive Card",
                    }
                },
                status=400,
            )
        return data, None

    async def _post(self, request: web.Request) -> web.Response:
        data, refused = await self._connector(request, "post")
        if refused is not None:
            return refused
        conversation = unquote(request.match_info["conversation"])
        base, _, thread = conversation.partition(";messageid=")
        if base not in self.conversations or (thread and (base, thread) not in self.messages):
            return web.json_response(
                {"error": {"code": "ConversationNotFound", "message": "Conversation not found."}}, status=404
            )
        activity_id = str(next(self._ids))
        if thread:
            self.replies.append((thread, data))
        else:
            self.messages[(base, activity_id)] = data
        return web.json_response({"id": activity_id}, status=201)

    async def _put(self, request: web.Request) -> web.Response:
        data, refused = await self._connector(request, "put")
        if refused is not None:
            return refused
        key = (unquote(request.match_info["conversation"]), unquote(request.match_info["activity"]))
        if key not in self.messages:
            return web.json_response(
                {"error": {"code": "ActivityNotFoundInConversation", "message": "Activity not found."}},
                status=404,
            )
        self.messages[key] = data
        return web.json_response({"id": key[1]})

    async def _member(self, request: web.Request) -> web.Response:
        _, refused = await self._connector(request, "member")
        if refused is not None:
            return refused
        member = self.members.get(unquote(request.match_info["member"]).lower())
        if member is None:
            return web.json_response(
                {"error": {"code": "MemberNotFoundInConversation", "message": "Member not found."}},
                status=404,
            )
        return web.json_response(member)


def _valid_activity(data: Any) -> bool:
    """A message activity whose Adaptive Cards are 1.4 or later (``Action.Execute`` needs 1.4)."""
    if not isinstance(data, dict) or data.get("type") != "message":
        return False
    for attachment in data.get("attachments") or []:
        content = attachment.get("content") if isinstance(attachment, dict) else None
        if attachment.get("contentType") != "application/vnd.microsoft.card.adaptive" or not isinstance(
            content, dict
        ):
            return False
        if content.get("type") != "AdaptiveCard" or float(content.get("version", "0")) < 1.4:
            return False
    return bool(data.get("attachments") or data.get("text"))
