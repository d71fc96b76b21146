"""A loopback fake of the Anthropic Messages API, scripted per test.

It answers ``POST /v1/messages`` the way the real API does: a server-sent event stream
(``message_start``, ``content_block_start`` / ``content_block_delta`` / ``content_block_stop``
per block, ``message_delta``, ``message_stop``) when the request says ``"stream": true``,
one JSON message otherwise. ``POST /v1/messages/count_tokens`` and ``GET /v1/models`` get the
real API's shapes, ``/api/hello`` (a connectivity check) a 200; any other path gets the API's
404 error body.

The script: a request that offers the scripted tool and carries no result for it yet gets a
``tool_use`` block for that tool; the request that carries its ``tool_result`` gets the final
text. Requests that do not offer the tool (side requests a client makes, such as a session
title) get a short text answer. Every request is recorded, so a test can read what the model
was sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import free_port

DEFAULT_MODEL = "claude-sonnet-4-5"


@dataclass(frozen=True)
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Script:
    """What the model does: call ``tool_name`` with ``tool_input`` once, then say ``final_text``."""

    tool_name: str
    tool_input: dict[str, Any]
    final_text: str = "All done."
    side_text: str = "Signoff test"
    tool_use_id: str = "toolu_01SignoffE2e000000000001"


@dataclass
class FakeAnthropic:
    """The fake under uvicorn on a loopback port, in the test's event loop."""

    script: Script
    requests: list[Recorded] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- what the model was sent ---------------------------------------------------------------

    @property
    def model_requests(self) -> list[dict[str, Any]]:
        """Bodies of the ``/v1/messages`` requests that offered the scripted tool (the agent loop)."""
        return [
            r.body
            for r in self.requests
            if r.path == "/v1/messages" and isinstance(r.body, dict) and self._offers_tool(r.body)
        ]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every ``tool_result`` block for the scripted call, in the order the model was sent them."""
        found: list[dict[str, Any]] = []
        for body in self.model_requests:
            for block in _blocks_of_last_user_message(body):
                if block.get("type") == "tool_result" and block.get("tool_use_id") == self.script.tool_use_id:
                    found.append(block)
        return found

    def tool_result_text(self) -> str:
        """The text of the last ``tool_result`` for the scripted call (``""`` when there was none)."""
        results = self.tool_results()
        if not results:
            return ""
        content = results[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        return ""

    def texts_sent(self) -> list[str]:
        """The text blocks of the messages the model was last sent (context a hook added among them)."""
        if not self.model_requests:
            return []
        texts: list[str] = []
        for message in self.model_requests[-1].get("messages", []):
            content = message.get("content") if isinstance(message, dict) else None
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            texts += [str(b.get("text")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        return texts

    # --- the API ---------------------------------------------------------------------------------

    def _offers_tool(self, body: dict[str, Any]) -> bool:
        tools = body.get("tools")
        return isinstance(tools, list) and any(
            isinstance(t, dict) and t.get("name") == self.script.tool_name for t in tools
        )

    def _answer(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        """The content blocks and stop reason for one ``/v1/messages`` request."""
        if not self._offers_tool(body):
            return [{"type": "text", "text": self.script.side_text}], "end_turn"
        answered = any(
            block.get("type") == "tool_result" and block.get("tool_use_id") == self.script.tool_use_id
            for block in _blocks_of_last_user_message(body)
        )
        if answered:
            return [{"type": "text", "text": self.script.final_text}], "end_turn"
        tool_use = {
            "type": "tool_use",
            "id": self.script.tool_use_id,
            "name": self.script.tool_name,
            "input": self.script.tool_input,
        }
        return [tool_use], "tool_use"

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(Recorded(request.method, request.url.path, dict(request.headers), body))
        return body

    async def _messages(self, request: Request) -> Response:
        body = await self._record(request)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "invalid_request_error", "messages: Field required")
        blocks, stop_reason = self._answer(body)
        message_id = f"msg_01SignoffE2e{next(self._ids):012d}"
        model = str(body.get("model") or DEFAULT_MODEL)
        usage = {
            "input_tokens": _estimate_tokens(body),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": _estimate_tokens(blocks),
        }
        headers = {"request-id": f"req_{message_id}"}
        if not body.get("stream"):
            message = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": blocks,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": usage,
            }
            return JSONResponse(message, headers=headers)
        events = _stream_events(message_id, model, blocks, stop_reason, usage)
        return StreamingResponse(
            _sse(events), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"}
        )

    async def _count_tokens(self, request: Request) -> Response:
        body = await self._record(request)
        return JSONResponse({"input_tokens": _estimate_tokens(body)})

    async def _models(self, request: Request) -> Response:
        await self._record(request)
        model = {
            "type": "model",
            "id": DEFAULT_MODEL,
            "display_name": "Claude Sonnet 4.5",
            "created_at": "2025-09-29T00:00:00Z",
        }
        return JSONResponse(
            {"data": [model], "has_more": False, "first_id": model["id"], "last_id": model["id"]}
        )

    async def _hello(self, request: Request) -> Response:
        """The connectivity check a client may send before its first request."""
        await self._record(request)
        return Response(status_code=200)

    async def _not_found(self, request: Request) -> Response:
        await self._record(request)
        return _error(404, "not_found_error", f"Not found: {request.method} {request.url.path}")

    def app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
        return Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/api/hello", self._hello, methods=["GET", "HEAD"]),
                Route("/{path:path}", self._not_found, methods=methods),
            ]
        )

    async def __aenter__(self) -> FakeAnthropic:
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app(),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="off",
                timeout_graceful_shutdown=1,
            )
        )
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
            if self._task.done():
                self._task.result()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task


def _blocks_of_last_user_message(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return [b for b in content if isinstance(b, dict)]
            return []
    return []


def _estimate_tokens(value: Any) -> int:
    """About four characters a token, like the API's own rough sizes; never zero."""
    return max(1, len(json.dumps(value)) // 4)


def _stream_events(
    message_id: str, model: str, blocks: list[dict[str, Any]], stop_reason: str, usage: dict[str, int]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The events the real API streams for a message made of ``blocks``."""
    start_usage = {**usage, "output_tokens": 1}
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    yield "message_start", {"type": "message_start", "message": message}
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _chunks(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in ["", *_chunks(json.dumps(block["input"]))]
            ]
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        if index == 0:
            yield "ping", {"type": "ping"}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _chunks(text: str, size: int = 16) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


async def _sse(events: Iterator[tuple[str, dict[str, Any]]]) -> AsyncIterator[bytes]:
    for name, data in events:
        yield f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        await asyncio.sleep(0)


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)
