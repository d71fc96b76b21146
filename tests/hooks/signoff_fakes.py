"""Stand-ins for the Signoff server, for testing the gate client and the adapters.

- :class:`Scripted` answers through :class:`httpx.MockTransport` from per-route scripts.
- :class:`LiveSignoff` is a real HTTP server on 127.0.0.1 that follows the v1 contract
  (idempotency keys, blocking ``/wait``, cancel) and can be stopped and restarted on the
  same port with its state kept, like a server process restarting over its database.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from signoff.hooks._gate import describe_request

URL = "http://signoff.test"
KEY = "sk-test-key"

Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def record(request_id: str = "req-1", status: str = "pending", **extra: Any) -> dict[str, Any]:
    """A ``<Request>`` as the server returns it."""
    data: dict[str, Any] = {
        "id": request_id,
        "agent_id": "agent-1",
        "tool_name": "pay_invoice",
        "arguments": {},
        "status": status,
        "created_at": "2026-01-01T00:00:00Z",
        "expires_at": "2026-01-01T00:30:00Z",
        "decided_at": None,
        "decided_by": None,
        "reason": None,
        "quorum": 1,
        "approvals": 0,
        "votes": [],
    }
    data.update(extra)
    return data


def submitted(decision: str, **extra: Any) -> httpx.Response:
    """A 200 answer to ``POST /v1/hooks/pre-tool-use``."""
    body: dict[str, Any] = {
        "decision": decision,
        "reason": None,
        "request_id": None,
        "request": None,
        "modified_arguments": None,
    }
    body.update(extra)
    return httpx.Response(200, json=body)


def pending(request_id: str = "req-1", **extra: Any) -> httpx.Response:
    return submitted("pending", request_id=request_id, request=record(request_id), **extra)


def state(request_id: str = "req-1", status: str = "pending", **extra: Any) -> httpx.Response:
    """A 200 ``<Request>`` answer (``/wait``, ``GET``, ``/cancel``)."""
    return httpx.Response(200, json=record(request_id, status, **extra))


def reported(body: dict[str, Any]) -> httpx.Response:
    """A 200 answer to ``POST /v1/hooks/post-tool-use`` that keeps the result."""
    return httpx.Response(
        200, json={"decision": "allow", "reason": None, "modified": False, "result": body.get("result")}
    )


def route_of(request: httpx.Request) -> str:
    path = request.url.path
    if path == "/v1/hooks/pre-tool-use":
        return "submit"
    if path == "/v1/hooks/post-tool-use":
        return "report"
    if path.endswith("/wait"):
        return "wait"
    if path.endswith("/cancel"):
        return "cancel"
    return "get"


class Scripted:
    """MockTransport handler answering each route from its script.

    Each route's replies are used in order; the last one repeats. An exception in a
    script is raised (a dropped connection); a callable is called with the request.
    Reports of executed calls (``report``) are taken, unless scripted otherwise. A call
    sent again under the key of a request the script answered approved is allowed, as the
    server allows it (with the approver's changes), unless more submits are scripted.
    """

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.scripts: dict[str, list[Reply]] = {}
        self._keys: dict[str, tuple[str, dict[str, Any] | None]] = {}
        """By the idempotency key a submit was answered pending under: the request's id and
        the arguments the server's hooks rewrote the call to (None: none)."""
        self._approved: dict[str, dict[str, Any]] = {}
        """Requests answered approved (by ``/wait``, ``GET`` or ``/cancel``), by id."""

    def on(self, route: str, *replies: Reply) -> Scripted:
        self.scripts.setdefault(route, []).extend(replies)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        route = route_of(request)
        script = self.scripts.get(route)
        if route == "submit" and not (script and len(script) > 1):
            replayed = self._replayed(request)
            if replayed is not None:
                return replayed
        if not script and route == "report":
            return reported(json.loads(request.content))
        if not script:
            raise AssertionError(f"unexpected request to {route}: {request.method} {request.url}")
        reply = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(reply, Exception):
            raise reply
        # A fresh copy: a Response object must not be handed to two clients.
        response = (
            reply(request)
            if callable(reply)
            else httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)
        )
        self._note(route, request, response)
        return response

    def _note(self, route: str, request: httpx.Request, response: httpx.Response) -> None:
        try:
            answer = json.loads(response.content)
        except ValueError:
            return
        if not isinstance(answer, dict):
            return
        if route == "submit" and answer.get("decision") == "pending" and answer.get("request_id"):
            key = json.loads(request.content).get("idempotency_key")
            if isinstance(key, str):
                self._keys[key] = (answer["request_id"], answer.get("modified_arguments"))
        elif route in ("wait", "get", "cancel") and answer.get("status") == "approved":
            self._approved[str(answer.get("id"))] = answer

    def _replayed(self, request: httpx.Request) -> httpx.Response | None:
        """The allow for a call sent again under the key of an approved request, if it is one."""
        from signoff.hooks._gate import approved_edits

        body = json.loads(request.content)
        rid, rewritten = self._keys.get(body.get("idempotency_key"), (None, None))
        approved = self._approved.get(rid) if rid is not None else None
        if approved is None:
            return None
        edits = approved_edits(approved)
        base = rewritten if rewritten is not None else body.get("arguments", {})
        return submitted(
            "allow",
            reason=describe_request(approved),
            request_id=rid,
            request=approved,
            modified_arguments={**base, **edits} if edits else rewritten,
        )

    def sent(self, route: str) -> list[httpx.Request]:
        return [r for r in self.requests if route_of(r) == route]

    def bodies(self, route: str = "submit") -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.sent(route)]


# --------------------------------------------------------------------------- live server

Policy = Callable[[str, dict[str, Any]], str]
"""``(tool_name, arguments) -> "allow" | "deny" | "gate"``."""
Rewrite = Callable[[str, dict[str, Any]], dict[str, Any] | None]
"""``(tool_name, arguments) -> modified_arguments`` for an allowed call (``None``: unchanged)."""


class LiveSignoff:
    """A small threaded HTTP server speaking the agent side of the v1 contract."""

    def __init__(
        self, policy: Policy | None = None, *, key: str = KEY, rewrite: Rewrite | None = None
    ) -> None:
        self.policy: Policy = policy or (lambda tool, args: "gate")
        self.rewrite = rewrite
        self.key = key
        self.requests: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.submissions: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.waits = 0
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle

    def start(self) -> LiveSignoff:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and drop every open connection (state is kept)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._cond:
            for sock in list(self._open):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(5)

    # -- operator side

    def wait_for_request(self, timeout: float = 5.0) -> str:
        """Block until some request exists; return the newest id."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self.requests), timeout):
                raise AssertionError("no request was created")
            return list(self.requests)[-1]

    def wait_for_waits(self, count: int = 1, timeout: float = 5.0) -> None:
        """Block until ``count`` long-polls have reached the server (a client is parked in one)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.waits >= count, timeout):
                raise AssertionError(f"{self.waits} of {count} waits reached the server")

    def decide(self, request_id: str, status: str, *, name: str = "Alice", reason: str | None = None) -> None:
        with self._cond:
            req = self.requests[request_id]
            if req["status"] == "pending":
                req.update(
                    status=status,
                    reason=reason,
                    decided_at="2026-01-01T00:01:00Z",
                    decided_by={"channel": "slack", "user_id": "U1", "name": name},
                )
            self._cond.notify_all()

    # -- HTTP side

    def _submit(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.submissions.append(body)
        tool, args = body.get("tool_name"), body.get("arguments")
        if not isinstance(tool, str) or not isinstance(args, dict):
            return 422, {"detail": "tool_name and arguments are required"}
        key = body.get("idempotency_key")
        with self._cond:
            if isinstance(key, str) and key in self.by_key:
                req = self.requests[self.by_key[key]]
                return 200, self._rewritten(self._answer(req), tool, args)
            verdict = self.policy(tool, args)
            if verdict != "gate":
                answer = {"decision": verdict, "reason": f"policy says {verdict}", "request_id": None}
                return 200, self._rewritten(answer, tool, args)
            rid = f"req-{next(self._ids)}"
            req = record(rid, "pending", tool_name=tool, arguments=args)
            self.requests[rid] = req
            if isinstance(key, str):
                self.by_key[key] = rid
            self._cond.notify_all()
            return 200, self._answer(req)

    def _rewritten(self, answer: dict[str, Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
        if answer["decision"] == "allow" and self.rewrite is not None:
            answer["modified_arguments"] = self.rewrite(tool, args)
        return answer

    def _report(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._cond:
            self.reports.append(body)
            self._cond.notify_all()
        return 200, {"decision": "allow", "reason": None, "modified": False, "result": body.get("result")}

    def wait_for_reports(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until ``count`` post-tool-use reports arrived; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.reports) >= count, timeout):
                raise AssertionError(f"{len(self.reports)} reports arrived, not {count}")
            return list(self.reports)

    @staticmethod
    def _answer(req: dict[str, Any]) -> dict[str, Any]:
        status = req["status"]
        decision = {"pending": "pending", "approved": "allow"}.get(status, "deny")
        reason = describe_request(req) if status != "pending" else req["reason"]
        return {"decision": decision, "reason": reason, "request_id": req["id"], "request": dict(req)}

    def _wait(self, rid: str, timeout: float) -> tuple[int, dict[str, Any]]:
        with self._cond:
            self.waits += 1
            self._cond.notify_all()
            if rid not in self.requests:
                return 404, {"detail": "unknown request"}
            server = self._server
            self._cond.wait_for(
                lambda: self.requests[rid]["status"] != "pending" or self._server is not server, timeout
            )
            if self._server is not server:
                raise ConnectionAbortedError("server stopping")
            return 200, dict(self.requests[rid])

    def _cancel(self, rid: str) -> tuple[int, dict[str, Any]]:
        with self._cond:
            if rid not in self.requests:
                return 404, {"detail": "unknown request"}
            req = self.requests[rid]
            if req["status"] == "pending":
                req.update(status="cancelled")
                self._cond.notify_all()
            return 200, dict(req)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        live = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[int, dict[str, Any]]:
                # Read the whole body first, so that a keep-alive connection stays in step.
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Authorization") != f"Bearer {live.key}":
                    return 401, {"detail": "bad key"}
                url = urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                hooks = {"/v1/hooks/pre-tool-use": live._submit, "/v1/hooks/post-tool-use": live._report}
                if self.command == "POST" and url.path in hooks:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        return 422, {"detail": "bad json"}
                    return hooks[url.path](body)
                if len(parts) == 4 and parts[:2] == ["v1", "requests"] and parts[3] == "wait":
                    timeout = float(parse_qs(url.query).get("timeout", ["25"])[0])
                    return live._wait(parts[2], min(timeout, 60))
                if self.command == "POST" and len(parts) == 4 and parts[3] == "cancel":
                    return live._cancel(parts[2])
                return 404, {"detail": "not found"}

            def _handle(self) -> None:
                with live._cond:
                    live._open.add(self.connection)
                try:
                    status, body = self._route()
                    self._reply(status, body)
                except (ConnectionError, OSError):
                    self.close_connection = True
                finally:
                    with live._cond:
                        live._open.discard(self.connection)

            do_GET = _handle
            do_POST = _handle

        return Handler
