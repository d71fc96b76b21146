"""A fake ntfy server on loopback: JSON publishing to the root URL, as the real one answers it.

It follows binwiederhier/ntfy's server (``server.go``, ``actions.go``, ``errors.go``): a
publish is a JSON object PUT/POSTed to ``/`` whose ``topic`` matches ``^[-_A-Za-z0-9]{1,64}$``;
at most three actions, each ``view``, ``broadcast`` or ``http`` with a label, a URL for view
and http, no body with GET or HEAD; access control by ``Authorization: Bearer <token>``
(an unknown token is 401 ``40101``, a topic the caller may not write is 403 ``40301``);
rate limiting as 429 ``42901`` (ntfy sends no ``Retry-After``); errors as
``{"code", "http", "error", "link"}``. A published message is answered with the message as
subscribers receive it (``id``, ``time``, ``event``, ``topic``, … and each action with an
``id``), and recorded, so a test can do what the phone app does with it.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOPIC = re.compile(r"^[-_A-Za-z0-9]{1,64}$")
MESSAGE_SIZE_LIMIT = 4096


def _error(code: int, status: int, message: str, link: str = "") -> web.Response:
    body = {"code": code, "http": status, "error": message, **({"link": link} if link else {})}
    return web.Response(status=status, text=json.dumps(body) + "\n", content_type="application/json")


@dataclass
class Published:
    """One message as the server stored it (and a subscribed phone receives it)."""

    message: dict[str, Any]
    headers: dict[str, str]

    @property
    def topic(self) -> str:
        return str(self.message["topic"])

    def action(self, label: str) -> dict[str, Any]:
        [found] = [a for a in self.message.get("actions", []) if a["label"] == label]
        return dict(found)

    @property
    def labels(self) -> list[str]:
        return [a["label"] for a in self.message.get("actions", [])]


@dataclass
class FakeNtfy:
    tokens: dict[str, set[str]] = field(default_factory=dict)
    """Access tokens → the topics each may write; empty: no access control (anyone writes)."""
    published: list[Published] = field(default_factory=list)
    attempts: int = 0
    _faults: list[tuple[int, int, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("POST", "/", self._publish)
        app.router.add_route("PUT", "/", self._publish)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def rate_limit(self, times: int = 1) -> None:
        """Refuse the next ``times`` publishes as ntfy's request limiter does."""
        self._faults += [(42901, 429, "limit reached: too many requests")] * times

    def fail(self, times: int = 1) -> None:
        """Fail the next ``times`` publishes with ntfy's internal server error."""
        self._faults += [(50001, 500, "internal server error")] * times

    def to(self, topic: str) -> list[Published]:
        return [p for p in self.published if p.topic == topic]

    def _authorized(self, headers: Mapping[str, str], topic: str) -> web.Response | None:
        if not self.tokens:
            return None
        auth = headers.get("Authorization", "")
        if not auth:
            # Anonymous writes denied ("auth-default-access: deny-all").
            return _error(40301, 403, "forbidden", "https://ntfy.sh/docs/publish/#authentication")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return _error(40101, 401, "unauthorized", "https://ntfy.sh/docs/publish/#authentication")
        if topic not in self.tokens[token]:
            return _error(40301, 403, "forbidden", "https://ntfy.sh/docs/publish/#authentication")
        return None

    async def _publish(self, request: web.Request) -> web.Response:
        self.attempts += 1
        raw = await request.read()
        if len(raw) > MESSAGE_SIZE_LIMIT * 2:
            return _error(41303, 413, "JSON body too large")
        try:
            data = json.loads(raw)
        except ValueError:
            return _error(40024, 400, "invalid request: request body must be valid JSON")
        if not isinstance(data, dict):
            return _error(40024, 400, "invalid request: request body must be valid JSON")
        topic = data.get("topic")
        if not isinstance(topic, str) or not TOPIC.match(topic):
            return _error(40009, 400, "invalid topic: path invalid")
        if self._faults:  # the limiter runs before authorization, on every request
            code, status, message = self._faults.pop(0)
            return _error(code, status, message, "https://ntfy.sh/docs/publish/#limitations")
        refused = self._authorized(request.headers, topic)
        if refused is not None:
            return refused
        actions = data.get("actions") or []
        problem = _actions_problem(actions)
        if problem is not None:
            return _error(40018, 400, f"invalid request: actions invalid, {problem}")
        message = data.get("message") or "triggered"
        if len(str(message).encode("utf-8")) > MESSAGE_SIZE_LIMIT:
            # Attachments are off here: a longer message cannot be published.
            return _error(40014, 400, "invalid request: attachments not allowed")
        stored: dict[str, Any] = {
            "id": secrets.token_urlsafe(9)[:12],
            "time": int(time.time()),
            "expires": int(time.time()) + 43200,
            "event": "message",
            "topic": topic,
            "message": message,
        }
        for key in ("title", "priority", "tags", "click", "icon"):
            if data.get(key):
                stored[key] = data[key]
        if actions:
            stored["actions"] = [
                {"id": secrets.token_urlsafe(8)[:10], **a, "method": str(a.get("method") or "POST").upper()}
                if a["action"] == "http"
                else {"id": secrets.token_urlsafe(8)[:10], **a}
                for a in actions
            ]
        self.published.append(Published(stored, dict(request.headers)))
        return web.json_response(stored)


def _actions_problem(actions: Any) -> str | None:
    if not isinstance(actions, list):
        return "actions must be a JSON array"
    if len(actions) > 3:
        return "only 3 actions allowed"
    for action in actions:
        if not isinstance(action, dict):
            return "an action is an object"
        kind = str(action.get("action", "")).lower()
        if kind not in ("view", "broadcast", "http"):
            return f"parameter 'action' cannot be '{kind}', valid values are 'view', 'broadcast' and 'http'"
        if not action.get("label"):
            return "parameter 'label' is required"
        if kind in ("view", "http") and not action.get("url"):
            return f"parameter 'url' is required for action '{kind}'"
        method = str(action.get("method") or "").upper()
        if kind == "http" and method in ("GET", "HEAD") and action.get("body"):
            return f"parameter 'body' cannot be set if method is {method}"
        headers = action.get("headers")
        if headers is not None and not (
            isinstance(headers, dict) and all(isinstance(v, str) for v in headers.values())
        ):
            return "headers are a map of strings"
    return None
