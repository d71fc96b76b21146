"""A fake Slack Web API (and Socket Mode endpoint) served over real HTTP on loopback.

It answers like Slack: ``{"ok": true, ...}`` or ``{"ok": false, "error": code}``,
checks the bearer token, refuses unknown channels and messages, validates Block
Kit and views with slack-sdk's own models (``invalid_blocks`` /
``invalid_arguments``), takes thread replies (``thread_ts``) only under a message it
holds that is not itself a reply (``thread_not_found``, ``cannot_reply_to_message``;
``no_text`` without text or blocks), and can be told to fail the next call of a method with a
429 + ``Retry-After``, a 5xx HTML page or an error code. Every call is recorded.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

CHANNEL = "C0SIGNOFF"
BOT_TOKEN = "xoxb-test-bot-token"
APP_TOKEN = "xapp-test-app-token"
USERS: dict[str, dict[str, Any]] = {
    "U0ANA": {
        "id": "U0ANA",
        "team_id": "T0TEAM",
        "name": "ana",
        "real_name": "Ana Approver",
        "profile": {"display_name": "ana", "real_name": "Ana Approver", "email": "ana@example.com"},
    },
    "W111": {
        "id": "W111",
        "team_id": "T111",
        "name": "primary-owner",
        "real_name": "",
        "profile": {"display_name": "", "real_name": "Primary Owner", "email": None},
    },
}


@dataclass(frozen=True)
class Call:
    """One Web API call as the fake received it."""

    method: str
    args: dict[str, Any]
    token: str | None


@dataclass(frozen=True)
class Scripted:
    """A canned answer for the next call of one method."""

    status: int = 200
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    html: bool = False
    delay: float = 0.0


class FakeSlack:
    """Run with ``await fake.start()``; point ``base_url`` at :attr:`base_url`; ``await fake.close()``."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.scripted_sent: list[str] = []
        """The methods whose scripted answer has been sent (after its ``delay``)."""
        self.users: dict[str, dict[str, Any]] = copy.deepcopy(USERS)
        """What ``users.info`` knows; add to it for a test's own clickers."""
        self.conversations: set[str] = {CHANNEL}
        """The channels the bot is in; add to them for a test's own."""
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.socket_connected = asyncio.Event()
        self._scripted: defaultdict[str, deque[Scripted]] = defaultdict(deque)
        self._sockets: list[web.WebSocketResponse] = []
        self._counter = 0
        self._triggers: set[str] = set()
        """Trigger ids already exchanged for a view (Slack takes each once)."""
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/socket", self._socket)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        for ws in self._sockets:
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def fail_next(self, method: str, answer: Scripted) -> None:
        """Answer the next call of ``method`` with ``answer`` instead of doing it."""
        self._scripted[method].append(answer)

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def send_envelope(self, envelope: dict[str, Any]) -> None:
        """Push a Socket Mode envelope to the connected client."""
        await self._sockets[-1].send_json(envelope)

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            args.update(await request.json())
        elif request.can_read_body:
            args.update(await request.post())
        token = _bearer(request) or args.pop("token", None)
        self.calls.append(Call(method, args, token))

        if self._scripted[method]:
            answer = self._scripted[method].popleft()
            await asyncio.sleep(answer.delay)
            self.scripted_sent.append(method)
            if answer.html:
                return web.Response(
                    status=answer.status, text="<html>upstream error</html>", content_type="text/html"
                )
            if answer.error is not None:
                body = {"ok": False, "error": answer.error}
                return web.json_response(body, status=answer.status, headers=answer.headers)

        expected = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token is None:
            return _error("not_authed")
        if token != expected:
            return _error("invalid_auth")
        handler = {
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "users.info": self._users_info,
            "views.open": self._views_open,
            "apps.connections.open": self._connections_open,
        }.get(method)
        if handler is None:
            return _error("unknown_method")
        return handler(args)

    def replies(self, channel: str, ts: str) -> list[dict[str, Any]]:
        """The replies in the thread under message ``ts``, oldest first."""
        return [
            m for (ch, _), m in sorted(self.messages.items()) if ch == channel and m.get("thread_ts") == ts
        ]

    def _post_message(self, args: dict[str, Any]) -> web.Response:
        channel = args.get("channel")
        if channel not in self.conversations:
            return _error("channel_not_found")
        if not args.get("text") and not args.get("blocks"):
            return _error("no_text")
        if not _valid_blocks(args.get("blocks")):
            return _error("invalid_blocks")
        thread_ts = args.get("thread_ts")
        if thread_ts is not None:
            parent = self.messages.get((str(channel), str(thread_ts)))
            if parent is None:
                return _error("thread_not_found")
            if parent.get("thread_ts"):
                return _error("cannot_reply_to_message")
        self._counter += 1
        ts = f"1700000000.{self._counter:06d}"
        self.messages[(channel, ts)] = {"text": args.get("text"), "blocks": args.get("blocks")}
        message: dict[str, Any] = {"ts": ts, "text": args.get("text")}
        if thread_ts is not None:
            self.messages[(channel, ts)]["thread_ts"] = str(thread_ts)
            message["thread_ts"] = str(thread_ts)
        return _ok({"channel": channel, "ts": ts, "message": message})

    def _update(self, args: dict[str, Any]) -> web.Response:
        key = (str(args.get("channel")), str(args.get("ts")))
        if key[0] not in self.conversations:
            return _error("channel_not_found")
        if key not in self.messages:
            return _error("message_not_found")
        if not _valid_blocks(args.get("blocks")):
            return _error("invalid_blocks")
        self.messages[key] = {"text": args.get("text"), "blocks": args.get("blocks")}
        return _ok({"channel": key[0], "ts": key[1], "text": args.get("text")})

    def _post_ephemeral(self, args: dict[str, Any]) -> web.Response:
        if args.get("channel") not in self.conversations:
            return _error("channel_not_found")
        if not args.get("user"):
            return _error("user_not_found")
        return _ok({"message_ts": "1700000001.000001"})

    def _users_info(self, args: dict[str, Any]) -> web.Response:
        user = self.users.get(str(args.get("user")))
        if user is None:
            return _error("user_not_found")
        return _ok({"user": user})

    def _views_open(self, args: dict[str, Any]) -> web.Response:
        trigger = args.get("trigger_id")
        if not trigger:
            return _error("invalid_trigger_id")
        if trigger in self._triggers:
            return _error("exchanged_trigger_id")
        view = args.get("view")
        if isinstance(view, str):  # slack-sdk sends the view as a JSON string in a form
            try:
                view = json.loads(view)
            except ValueError:
                return _error("invalid_arguments")
        try:
            View(**view).validate_json()
        except (SlackObjectFormationError, KeyError, TypeError):
            return _error("invalid_arguments")
        if not _valid_view(view):
            return _error("invalid_arguments")
        self._triggers.add(trigger)
        self._counter += 1
        return _ok({"view": {"id": f"V0MODAL{self._counter}", **view}})

    def _connections_open(self, args: dict[str, Any]) -> web.Response:
        return _ok({"url": f"ws://127.0.0.1:{self.port}/socket"})

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_json({"type": "hello", "num_connections": 1})
        self.socket_connected.set()
        async for message in ws:
            if message.type == WSMsgType.TEXT:
                await self.acks.put(json.loads(message.data))
        return ws


def _valid_view(view: Any) -> bool:
    """Modal limits slack-sdk does not check itself: ``private_metadata`` ≤ 3000 characters,
    an input's ``initial_value`` within its ``max_length`` (and ≤ 3000), at most 100 blocks."""
    if not isinstance(view, dict) or len(str(view.get("private_metadata", ""))) > 3000:
        return False
    blocks = view.get("blocks") or []
    if len(blocks) > 100:
        return False
    for block in blocks:
        element = block.get("element") if isinstance(block, dict) else None
        if isinstance(element, dict) and element.get("type") == "plain_text_input":
            initial = element.get("initial_value")
            limit = min(int(element.get("max_length", 3000)), 3000)
            if initial is not None and (not isinstance(initial, str) or len(initial) > limit):
                return False
    return True


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    return header.removeprefix("Bearer ") if header.startswith("Bearer ") else None


def _valid_blocks(blocks: Any) -> bool:
    if isinstance(blocks, str):
        blocks = json.loads(blocks)
    if blocks is None:
        return True
    if not isinstance(blocks, list) or len(blocks) > 50:
        return False
    try:
        for block in blocks:
            parsed = Block.parse(block)
            if parsed is None:
                return False
            parsed.validate_json()
    except SlackObjectFormationError:
        return False
    return True


def _ok(body: dict[str, Any]) -> web.Response:
    return web.json_response({"ok": True, **body})


def _error(code: str) -> web.Response:
    # Slack answers most errors with HTTP 200 and ok: false.
    return web.json_response({"ok": False, "error": code})
