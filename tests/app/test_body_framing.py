"""The body limit on the wire: every way HTTP/1 can frame a body, sent as raw bytes to a real
uvicorn (its parser decides what a body is), and none delivers more than the limit to a route
or to an agent's hot path."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import Request

from signoff.app.runtime import Runtime
from tests.conftest import Server

BIG = 100_000  # over the default limit of 64 KiB
LIMIT = 65_536
BODY = b"x" * BIG


def _chunked(data: bytes, size: int = 8192) -> bytes:
    parts = [
        f"{len(data[i : i + size]):x}\r\n".encode() + data[i : i + size] + b"\r\n"
        for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


FRAMINGS = {
    "length": b"Content-Length: %d\r\n\r\n" % BIG + BODY,
    "length, trailing space": b"Content-Length: %d \r\n\r\n" % BIG + BODY,
    "length, trailing tab": b"Content-Length: %d\t\r\n\r\n" % BIG + BODY,
    "length, leading zero": b"Content-Length: 0%d\r\n\r\n" % BIG + BODY,
    "length, plus sign": b"Content-Length: +%d\r\n\r\n" % BIG + BODY,
    "length twice, same": b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (BIG, BIG) + BODY,
    "length as a list": b"Content-Length: %d, %d\r\n\r\n" % (BIG, BIG) + BODY,
    "length twice, small first": b"Content-Length: 5\r\nContent-Length: %d\r\n\r\n" % BIG + BODY,
    "length empty, then big": b"Content-Length: \r\nContent-Length: %d\r\n\r\n" % BIG + BODY,
    "length, vertical tab": b"Content-Length: %d\x0b\r\n\r\n" % BIG + BODY,
    "length, no-break space": b"Content-Length: %d\xa0\r\n\r\n" % BIG + BODY,
    "length, folded": b"Content-Length:\r\n %d\r\n\r\n" % BIG + BODY,
    "length, space before colon": b"Content-Length : %d\r\n\r\n" % BIG + BODY,
    "chunked": b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(BODY),
    "Chunked": b"Transfer-Encoding: Chunked\r\n\r\n" + _chunked(BODY),
    "gzip, chunked": b"Transfer-Encoding: gzip, chunked\r\n\r\n" + _chunked(BODY),
    "chunked, gzip": b"Transfer-Encoding: chunked, gzip\r\n\r\n" + _chunked(BODY),
    "two encodings headers": b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(BODY),
    "length and chunked": b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY),
    "chunked and length": b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + _chunked(BODY),
    "identity": b"Transfer-Encoding: identity\r\n\r\n" + BODY,
    "expect 100-continue": b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % BIG + BODY,
    "expect 100-continue, chunked": b"Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(BODY),
    "no length": b"\r\n" + BODY,
    "pipelined, chunked": b"Content-Length: 5\r\n\r\nhello"
    + b"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    + _chunked(BODY),
    "pipelined, length": b"Content-Length: 5\r\n\r\nhello"
    + b"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG
    + BODY,
}


async def _exchange(port: int, path: str, framing: bytes, version: bytes, headers: bytes = b"") -> bytes:
    """Send one request's bytes, and read what comes back until the server goes quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST " + path.encode() + b" " + version + b"\r\nHost: x\r\n" + headers
    writer.write(head + framing.replace(b"{path}", path.encode()))
    if version == b"HTTP/1.0":
        writer.write_eof()
    answer = b""
    try:
        await writer.drain()
        while data := await asyncio.wait_for(reader.read(65536), 2):
            answer += data
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return answer


def _statuses(answer: bytes) -> list[int]:
    """The final statuses answered (an interim ``100 Continue`` is not one)."""
    statuses = [int(line.split(b" ")[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]
    return [s for s in statuses if s != 100]


@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/1.0"])
async def test_no_framing_delivers_a_body_over_the_limit_to_a_route(runtime: Runtime, version: bytes) -> None:
    async with Server(runtime) as server:
        received: dict[str, list[int]] = {}

        @server.app.post("/probe/{case}")
        async def probe(case: str, request: Request) -> dict[str, int]:
            received.setdefault(case, []).append(len(await request.body()))
            return {}

        names = list(FRAMINGS)
        answers = await asyncio.gather(
            *(_exchange(server.port, f"/probe/{n}", FRAMINGS[name], version) for n, name in enumerate(names))
        )
    over = {names[int(n)]: sizes for n, sizes in received.items() if max(sizes, default=0) > LIMIT}
    assert not over, f"bodies over the limit reached the route: {over}"
    refused = [name for name, answer in zip(names, answers, strict=True) if 413 in _statuses(answer)]
    assert {"length", "chunked", "expect 100-continue"} <= set(refused)


@pytest.mark.parametrize("version", [b"HTTP/1.1", b"HTTP/1.0"])
async def test_no_framing_gets_a_gated_call_over_the_limit_answered(
    runtime: Runtime, agent_key: str, version: bytes
) -> None:
    """The agents' hot path is answered ahead of FastAPI's routing: it meets the same limit.
    A body of JSON over the limit is never read into a decision: 413, 400, or no answer."""
    call = b'{"tool_name": "pay_x", "arguments": {"blob": "' + b"x" * (BIG - 60) + b'"}}'
    headers = b"Authorization: Bearer " + agent_key.encode() + b"\r\nContent-Type: application/json\r\n"
    framings = {name: framing.replace(BODY, call) for name, framing in FRAMINGS.items()}
    framings = {
        name: framing.replace(_chunked(BODY), _chunked(call)) if b"chunked" in framing.lower() else framing
        for name, framing in framings.items()
    }
    async with Server(runtime) as server:
        answers = await asyncio.gather(
            *(
                _exchange(server.port, "/v1/hooks/pre-tool-use", f, version, headers)
                for f in framings.values()
            )
        )
    answered = {name: _statuses(answer) for name, answer in zip(framings, answers, strict=True)}
    for name, statuses in answered.items():
        assert not [s for s in statuses if s not in (400, 413, 422)], f"{name}: {statuses}"
    assert answered["length"] == [413]
    assert answered["chunked"] == [413]
