"""A fake Feishu Open API on loopback, for driving lark-oapi over real HTTP in tests.

It behaves like the parts of the real API the channel uses, including its errors:
tenant tokens per app (unknown app → 10003, wrong secret → 10014, revoked token →
99991663), message create with uuid idempotency and membership checks (230002),
strict card JSON 2.0 validation (230099, the way Feishu refuses unknown
properties), message patch (only the sender may patch, update_multi required), replies to a
message (``text`` or ``post``, with uuid idempotency; the message must exist and the bot
be in its chat, 230011 / 230002; ``at`` elements and ``<at user_id>`` tags recorded as
mentions),
contact lookup, the long-connection endpoint, and injectable faults (429 with
``x-ogw-ratelimit-reset``, 5xx pages that are not JSON, delays). Every request is
recorded so tests can assert what was sent.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES_PATH = "/open-apis/im/v1/messages"
USERS_PATH = "/open-apis/contact/v3/users/"
WS_ENDPOINT_PATH = "/callback/ws/endpoint"


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Fault:
    method: str
    path_prefix: str
    status: int
    body: dict[str, Any] | str
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    delay: float = 0.0


class CardInvalid(Exception):
    pass


MAX_CARD_BYTES = 30 * 1024
"""Cards are limited to 30 KB (Lark's message patch and delayed-update pages)."""
_CARD_KEYS = {"schema", "config", "header", "body", "card_link"}
_TEXT_KEYS = {"tag", "content"}
_ELEMENT_KEYS = {
    "div": {"tag", "text", "element_id"},
    "markdown": {"tag", "content", "element_id"},
    "hr": {"tag", "element_id"},
    "button": {"tag", "name", "text", "type", "behaviors", "confirm", "form_action_type", "element_id"},
    "form": {"tag", "name", "elements", "element_id"},
    "input": {
        "tag",
        "name",
        "required",
        "max_length",
        "placeholder",
        "label",
        "element_id",
        # open.feishu.cn feishu-cards/card-json-v2-components/interactive-components/input.md
        "default_value",
        "disabled",
        "width",
        "label_position",
    },
}


def _check_text(text: Any, where: str) -> None:
    if (
        not isinstance(text, dict)
        or set(text) - _TEXT_KEYS
        or text.get("tag") not in {"plain_text", "lark_md"}
    ):
        raise CardInvalid(f"{where}: bad text object")
    if not isinstance(text.get("content"), str):
        raise CardInvalid(f"{where}: text content must be a string")


def _check_elements(elements: Any, names: set[str], *, in_form: bool) -> None:
    if not isinstance(elements, list):
        raise CardInvalid("elements must be a list")
    for element in elements:
        tag = element.get("tag") if isinstance(element, dict) else None
        allowed = _ELEMENT_KEYS.get(tag) if isinstance(tag, str) else None
        if allowed is None:
            raise CardInvalid(f"unknown tag {tag!r}")
        if unknown := set(element) - allowed:
            raise CardInvalid(f"{tag}: unknown properties {sorted(unknown)}")
        if "name" in element:
            if element["name"] in names:
                raise CardInvalid(f"duplicate name {element['name']!r}")
            names.add(element["name"])
        if tag == "div":
            _check_text(element.get("text"), "div")
        elif tag == "markdown" and not isinstance(element.get("content"), str):
            raise CardInvalid("markdown content must be a string")
        elif tag == "button":
            _check_text(element.get("text"), "button")
            for behavior in element.get("behaviors", []):
                if behavior.get("type") == "callback" and not isinstance(behavior.get("value"), dict):
                    raise CardInvalid("callback value must be an object")
            if "form_action_type" in element and not in_form:
                raise CardInvalid("form_action_type outside a form")
        elif tag == "form":
            if in_form:
                raise CardInvalid("nested form")
            _check_elements(element.get("elements"), names, in_form=True)
        elif tag == "input":
            if not in_form or not element.get("name"):
                raise CardInvalid("input needs a name inside a form")


def validate_card(content: str) -> dict[str, Any]:
    """Feishu-like validation of a card JSON 2.0 message ``content``."""
    if len(content.encode()) > MAX_CARD_BYTES:
        raise CardInvalid(f"card is larger than {MAX_CARD_BYTES} bytes")
    try:
        card = json.loads(content)
    except ValueError:
        raise CardInvalid("content is not JSON") from None
    if not isinstance(card, dict) or set(card) - _CARD_KEYS:
        raise CardInvalid("unknown top-level properties")
    if card.get("schema") != "2.0":
        raise CardInvalid("schema must be 2.0")
    if card.get("config", {}).get("update_multi") is not True:
        raise CardInvalid("update_multi must be true")
    header = card.get("header", {})
    if set(header) - {"title", "subtitle", "template"}:
        raise CardInvalid("unknown header properties")
    _check_text(header.get("title"), "header.title")
    _check_elements(card.get("body", {}).get("elements"), set(), in_form=False)
    return card


_AT_TAG = re.compile(r'<at user_id="([^"]*)">')


def _mentions(msg_type: Any, content: str) -> list[str]:
    """The user ids a ``text`` or ``post`` message @-mentions (CardInvalid if it is neither)."""
    try:
        data = json.loads(content)
    except ValueError:
        raise CardInvalid("content is not JSON") from None
    if msg_type == "text":
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise CardInvalid('a text message is {"text": ...}')
        return _AT_TAG.findall(data["text"])
    if msg_type != "post":
        raise CardInvalid(f"cannot reply with msg_type {msg_type!r}")
    if not isinstance(data, dict) or not data:
        raise CardInvalid("a post message has a language key")
    found: list[str] = []
    for post in data.values():
        rows = post.get("content") if isinstance(post, dict) else None
        if not isinstance(rows, list):
            raise CardInvalid("post content must be a list of paragraphs")
        for row in rows:
            for element in row if isinstance(row, list) else [None]:
                tag = element.get("tag") if isinstance(element, dict) else None
                if tag == "at" and isinstance(element.get("user_id"), str):
                    found.append(element["user_id"])
                elif tag not in ("text", "a", "at") or (
                    tag == "text" and not isinstance(element.get("text"), str)
                ):
                    raise CardInvalid(f"bad post element {element!r}")
    return found


class FakeFeishu:
    """State and behaviour of the fake API; reset between tests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.origin = ""
        self.ws_url: str | None = None
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.requests: list[Recorded] = []
            self.apps: dict[str, str] = {}
            self.tokens: dict[str, str] = {}
            self.chats: dict[str, set[str]] = {}
            self.messages: dict[str, dict[str, Any]] = {}
            self.uuids: dict[tuple[str, str], str] = {}
            self.users: dict[str, dict[str, Any]] = {}
            self.faults: list[Fault] = []
            self._ids = itertools.count(1)
            self.ws_url = None

    # Test set-up

    def add_app(self, app_id: str, secret: str, *, chats: tuple[str, ...] = ()) -> None:
        with self._lock:
            self.apps[app_id] = secret
            for chat in chats:
                self.chats.setdefault(chat, set()).add(app_id)

    def add_chat(self, chat_id: str) -> None:
        with self._lock:
            self.chats.setdefault(chat_id, set())

    def add_user(self, open_id: str, **fields: Any) -> None:
        with self._lock:
            self.users[open_id] = {"open_id": open_id, **fields}

    def fail(
        self,
        method: str,
        path_prefix: str,
        *,
        status: int,
        body: dict[str, Any] | str,
        headers: dict[str, str] | None = None,
        times: int = 1,
        delay: float = 0.0,
    ) -> None:
        with self._lock:
            self.faults.append(Fault(method, path_prefix, status, body, headers or {}, times, delay))

    def slow(self, method: str, path_prefix: str, seconds: float) -> None:
        """Delay the next matching request, then handle it normally."""
        self.fail(method, path_prefix, status=0, body="", delay=seconds)

    def revoke_tokens(self) -> None:
        with self._lock:
            self.tokens.clear()

    # Queries

    def calls(self, method: str, path_prefix: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.startswith(path_prefix)]

    # HTTP

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/{path:path}", self._dispatch, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])]
        )

    async def _dispatch(self, request: Request) -> Response:
        body = await request.body()
        record = Recorded(
            method=request.method,
            path=request.url.path,
            query=dict(request.query_params),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        with self._lock:
            self.requests.append(record)
            fault = next(
                (
                    f
                    for f in self.faults
                    if f.times > 0 and f.method == record.method and record.path.startswith(f.path_prefix)
                ),
                None,
            )
            if fault is not None:
                fault.times -= 1
        if fault is not None:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status:
                if isinstance(fault.body, str):
                    return PlainTextResponse(fault.body, fault.status, headers=fault.headers)
                return JSONResponse(fault.body, fault.status, headers=fault.headers)
        with self._lock:
            return self._handle(record)

    def _reply(self, code: int = 0, data: Any = None, *, status: int = 200, msg: str = "success") -> Response:
        content: dict[str, Any] = {"code": code, "msg": msg}
        if data is not None:
            content["data"] = data
        return JSONResponse(content, status, headers={"X-Tt-Logid": f"log-{next(self._ids)}"})

    def _handle(self, r: Recorded) -> Response:
        if r.method == "POST" and r.path == TOKEN_PATH:
            return self._token(r)
        if r.method == "POST" and r.path == WS_ENDPOINT_PATH:
            return self._ws_endpoint(r)
        app_id = self._authorised(r)
        if app_id is None:
            return self._reply(99991663, status=400, msg="Invalid access token for authorization.")
        if r.method == "POST" and r.path == MESSAGES_PATH:
            return self._create(r, app_id)
        if r.method == "POST" and r.path.startswith(MESSAGES_PATH + "/") and r.path.endswith("/reply"):
            return self._reply_to(r, app_id, r.path.split("/")[-2])
        if r.method == "PATCH" and r.path.startswith(MESSAGES_PATH + "/"):
            return self._patch(r, app_id, r.path.rsplit("/", 1)[1])
        if r.method == "GET" and r.path.startswith(USERS_PATH):
            return self._user(r, r.path[len(USERS_PATH) :])
        return self._reply(404, status=404, msg="not found")

    def _token(self, r: Recorded) -> Response:
        body = r.json
        app_id, secret = body.get("app_id"), body.get("app_secret")
        if app_id not in self.apps:
            return self._reply(10003, status=400, msg="invalid param")
        if self.apps[app_id] != secret:
            return self._reply(10014, status=400, msg="app secret invalid")
        token = f"t-{app_id}-{next(self._ids)}"
        self.tokens[token] = app_id
        return JSONResponse({"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200})

    def _authorised(self, r: Recorded) -> str | None:
        scheme, _, token = r.headers.get("authorization", "").partition(" ")
        return self.tokens.get(token) if scheme == "Bearer" else None

    def _create(self, r: Recorded, app_id: str) -> Response:
        if r.query.get("receive_id_type") != "chat_id":
            return self._reply(230001, status=400, msg="invalid receive_id_type")
        if not r.headers.get("content-type", "").startswith("application/json"):
            return self._reply(230001, status=400, msg="content type must be json")
        body = r.json
        chat_id = body.get("receive_id")
        if chat_id not in self.chats:
            return self._reply(230001, status=400, msg="Your request contains an invalid request parameter.")
        if app_id not in self.chats[chat_id]:
            return self._reply(230002, status=400, msg="The bot can not be outside the group.")
        if body.get("msg_type") != "interactive":
            return self._reply(230001, status=400, msg="unsupported msg_type")
        try:
            validate_card(body.get("content", ""))
        except CardInvalid as exc:
            return self._reply(230099, status=400, msg=f"Failed to create card content: {exc}")
        uuid = body.get("uuid")
        if uuid and (app_id, uuid) in self.uuids:
            message_id = self.uuids[(app_id, uuid)]
        else:
            message_id = f"om_{next(self._ids)}"
            self.messages[message_id] = {
                "app_id": app_id,
                "chat_id": chat_id,
                "content": body["content"],
                "history": [body["content"]],
            }
            if uuid:
                self.uuids[(app_id, uuid)] = message_id
        data = {
            "message_id": message_id,
            "chat_id": chat_id,
            "msg_type": "interactive",
            "create_time": str(int(time.time() * 1000)),
        }
        return self._reply(data=data)

    def replies_to(self, message_id: str) -> list[dict[str, Any]]:
        """The replies sent to ``message_id``, oldest first (each once, whatever retries sent)."""
        with self._lock:
            return [m for m in self.messages.values() if m.get("parent_id") == message_id]

    def _reply_to(self, r: Recorded, app_id: str, parent_id: str) -> Response:
        parent = self.messages.get(parent_id)
        if parent is None:
            return self._reply(230011, status=400, msg="The message was withdrawn or does not exist.")
        if app_id not in self.chats.get(parent["chat_id"], set()):
            return self._reply(230002, status=400, msg="The bot can not be outside the group.")
        body = r.json
        msg_type, content = body.get("msg_type"), body.get("content", "")
        try:
            mentions = _mentions(msg_type, content)
        except CardInvalid as exc:
            return self._reply(230001, status=400, msg=f"invalid content: {exc}")
        uuid = body.get("uuid")
        if uuid and (app_id, uuid) in self.uuids:
            message_id = self.uuids[(app_id, uuid)]
        else:
            message_id = f"om_{next(self._ids)}"
            self.messages[message_id] = {
                "app_id": app_id,
                "chat_id": parent["chat_id"],
                "parent_id": parent_id,
                "msg_type": msg_type,
                "content": content,
                "mentions": mentions,
                "history": [content],
            }
            if uuid:
                self.uuids[(app_id, uuid)] = message_id
        data = {
            "message_id": message_id,
            "parent_id": parent_id,
            "chat_id": parent["chat_id"],
            "msg_type": msg_type,
        }
        return self._reply(data=data)

    def _patch(self, r: Recorded, app_id: str, message_id: str) -> Response:
        message = self.messages.get(message_id)
        if message is None:
            return self._reply(230001, status=400, msg="message not found")
        if message["app_id"] != app_id:
            return self._reply(230012, status=400, msg="Bot is NOT the sender of the message.")
        content = r.json.get("content", "")
        try:
            validate_card(content)
        except CardInvalid as exc:
            return self._reply(230099, status=400, msg=f"Failed to update card content: {exc}")
        message["content"] = content
        message["history"].append(content)
        return self._reply(data={})

    def _user(self, r: Recorded, open_id: str) -> Response:
        if r.query.get("user_id_type") != "open_id":
            return self._reply(40001, status=400, msg="invalid user_id_type")
        user = self.users.get(open_id)
        if user is None:
            return self._reply(41050, status=400, msg="no user authority error")
        return self._reply(data={"user": user})

    def _ws_endpoint(self, r: Recorded) -> Response:
        body = r.json
        if self.apps.get(body.get("AppID")) != body.get("AppSecret") or self.ws_url is None:
            return JSONResponse({"code": 1000040351, "msg": "app credentials invalid"})
        url = f"{self.ws_url}?device_id=dev-1&service_id=7"
        config = {"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 120}
        return JSONResponse({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": config}})


@contextmanager
def serve(fake: FakeFeishu) -> Iterator[str]:
    """Run ``fake`` under uvicorn on 127.0.0.1 with a random port; yields its origin."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(fake.app(), lifespan="off", ws="none", log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake Feishu server did not start")
        time.sleep(0.01)
    fake.origin = f"http://127.0.0.1:{port}"
    try:
        yield fake.origin
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class FakeLongConnection:
    """A loopback WebSocket server speaking lark-oapi's pbbp2 protobuf frames."""

    def __init__(self) -> None:
        self.url = ""
        self.connected = asyncio.Event()
        self.connections = 0
        """Connections opened so far."""
        self.closed = 0
        """Connections that have ended so far (either side closing)."""
        self.pings = 0
        self._socket: Any = None
        self._acks: asyncio.Queue[Any] = asyncio.Queue()
        self._server: Any = None

    async def __aenter__(self) -> FakeLongConnection:
        from websockets.asyncio.server import serve as ws_serve

        self._server = await ws_serve(self._connection, "127.0.0.1", 0)
        port = next(iter(self._server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/ws"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _connection(self, socket: Any) -> None:
        from lark_oapi.ws.pb.pbbp2_pb2 import Frame

        self._socket = socket
        self.connections += 1
        self.connected.set()
        try:
            async for message in socket:
                frame = Frame()
                frame.ParseFromString(message)
                if frame.method == 1:
                    await self._acks.put(frame)
                else:
                    self.pings += 1
        finally:
            self.closed += 1

    async def drop(self) -> None:
        """Close the current connection from the server side, as a Feishu restart would."""
        self.connected.clear()
        await self._socket.close()

    async def push(self, payload: bytes, *, kind: str = "event", message_id: str = "msg-1") -> dict[str, Any]:
        """Send one data frame as Feishu would and return the decoded ACK payload."""
        from lark_oapi.ws.pb.pbbp2_pb2 import Frame

        frame = Frame()
        frame.SeqID = 1
        frame.LogID = 1
        frame.service = 7
        frame.method = 1
        for key, value in {
            "type": kind,
            "message_id": message_id,
            "trace_id": "trace-1",
            "sum": "1",
            "seq": "0",
        }.items():
            header = frame.headers.add()
            header.key = key
            header.value = value
        frame.payload = payload
        await self._socket.send(frame.SerializeToString())
        ack = await asyncio.wait_for(self._acks.get(), 10)
        assert {h.key: h.value for h in ack.headers}["message_id"] == message_id
        answer: dict[str, Any] = json.loads(ack.payload)
        return answer


def ack_data(ack: dict[str, Any]) -> Any:
    """Decode the ``data`` of a long-connection ACK payload (base64 of the handler's JSON)."""
    return json.loads(base64.b64decode(ack["data"]))
