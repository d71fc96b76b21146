"""A gated ``tools/call`` written in JSON-RPC shapes an SDK client never sends, to the real proxy.

The agent writes the proxy's stdin itself: a ``tools/call`` without an id (a notification),
inside a batch, with a key twice (the amount, the tool's name, the params), with numbers
JSON cannot carry to Signoff (NaN, Infinity, one past a float) or that read alike
(``9e4``, ``-0.0``, an integer beyond 64 bits). Whatever the shape, the upstream runs a
call only with the arguments Signoff was asked about and allowed; every other call is
answered with the proxy's refusal, and nothing of it reaches the upstream. A 2026-07-28
client's call carrying ``request_state`` (the Python name of ``requestState``, which the
SDK's models would also take) is a new call, asked of Signoff, not a later round of one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.types import TextContent

from tests.hooks.signoff_fakes import KEY, LiveSignoff
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (the upstream's fork server, a fixture)
    BIG,
    FORKED_PROXY,
    REPO,
    fake_signoff,
    forkserver,
    proxied,
    proxy_args,
    proxy_env,
)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def payments_over_50000(tool: str, arguments: dict[str, Any]) -> str:
    """The tests' gate (``mcp__up__pay_*`` from 50,000 on), as the stand-in Signoff applies it."""
    amount = arguments.get("amount")
    big = isinstance(amount, int | float) and not isinstance(amount, bool) and amount >= 50_000
    return "gate" if tool.startswith("mcp__up__pay_") and big else "allow"


def call_line(id_: int, arguments: str) -> str:
    params = f'{{"name":"pay_invoice","arguments":{arguments}}}'
    return f'{{"jsonrpc":"2.0","id":{id_},"method":"tools/call","params":{params}}}'


class Wire:
    """The proxy's stdin and stdout, one JSON-RPC message a line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.answers: dict[Any, dict[str, Any]] = {}

    async def send(self, line: str | dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        text = line if isinstance(line, str) else json.dumps(line)
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()

    async def answer(self, id_: Any) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while id_ not in self.answers:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 15)
            assert line, "the proxy closed its stdout"
            message = json.loads(line)
            if "id" in message and "method" not in message:
                self.answers[message["id"]] = message
        return self.answers[id_]


@asynccontextmanager
async def wire(tmp_path: Path, live: LiveSignoff) -> AsyncIterator[Wire]:
    args = [*FORKED_PROXY, *proxy_args(tmp_path, "--hold", "0.2")]
    with (tmp_path / "proxy.err").open("a") as errlog:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errlog,
            env=proxy_env(live.url, KEY),
            cwd=str(REPO),
        )
        try:
            w = Wire(proc)
            await w.send(INITIALIZE)
            assert "result" in await w.answer(0)
            await w.send(INITIALIZED)
            yield w
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def refusal_text(answer: dict[str, Any]) -> str:
    result = answer["result"]
    assert result["isError"] is True, answer
    (block,) = result["content"]
    return str(block["text"])


def asked(live: LiveSignoff) -> list[tuple[str, dict[str, Any]]]:
    """What Signoff was asked about, each call once (a held call is submitted again to wait on it)."""
    seen: list[tuple[str, dict[str, Any]]] = []
    for s in live.submissions:
        if (s["tool_name"], s["arguments"]) not in seen:
            seen.append((s["tool_name"], s["arguments"]))
    return seen


def ran(tmp_path: Path) -> list[dict[str, Any]]:
    """The tool calls that reached the upstream, in order."""
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


async def test_a_tools_call_without_an_id_or_in_a_batch_reaches_nobody(tmp_path: Path) -> None:
    with fake_signoff(policy=lambda tool, args: "allow") as live:
        async with wire(tmp_path, live) as w:
            await w.send(
                '{"jsonrpc":"2.0","method":"tools/call","params":{"name":"pay_invoice",'
                '"arguments":{"invoice_id":"as-notification","amount":90000}}}'
            )
            batched = call_line(1, '{"invoice_id":"in-a-batch","amount":90000}')
            await w.send(f"[{batched}]")
            await w.send(call_line(2, '{"invoice_id":"after","amount":10}'))
            assert (await w.answer(2))["result"]["content"]
            assert 1 not in w.answers
    assert asked(live) == [("mcp__up__pay_invoice", {"invoice_id": "after", "amount": 10})]
    assert [c["arguments"]["invoice_id"] for c in ran(tmp_path)] == ["after"]


REPEATED = [
    # the amount twice: JSON parsers that keep the first would read 10
    (call_line(1, '{"invoice_id":"a","amount":10,"amount":90000}'), {"invoice_id": "a", "amount": 90000}),
    # the tool's name twice
    (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"pay_invoice",'
        '"arguments":{"invoice_id":"b","amount":90000}}}',
        {"invoice_id": "b", "amount": 90000},
    ),
    # the params twice, the arguments twice
    (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"pay_invoice","arguments":'
        '{"invoice_id":"c","amount":10}},"params":{"name":"pay_invoice","arguments":{"invoice_id":"c",'
        '"amount":10},"arguments":{"invoice_id":"c","amount":90000}}}',
        {"invoice_id": "c", "amount": 90000},
    ),
    # numbers that read alike
    (call_line(1, '{"invoice_id":"d","amount":9e4}'), {"invoice_id": "d", "amount": 90000.0}),
    (
        call_line(1, '{"invoice_id":"e","amount":90000.0000000000000001}'),
        {"invoice_id": "e", "amount": 90000.0},
    ),
]


@pytest.mark.parametrize(("line", "seen"), REPEATED)
async def test_a_repeated_key_or_a_respelt_number_is_asked_about_as_the_upstream_reads_it(
    tmp_path: Path, line: str, seen: dict[str, Any]
) -> None:
    with fake_signoff(policy=payments_over_50000) as live:
        async with wire(tmp_path, live) as w:
            await w.send(line)
            text = refusal_text(await w.answer(1))
    assert asked(live) == [("mcp__up__pay_invoice", seen)]
    assert "is waiting for approval" in text
    assert "the tool has not run" in text
    assert ran(tmp_path) == []


@pytest.mark.parametrize("amount", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
async def test_a_number_signoff_cannot_be_sent_is_refused_not_forwarded_as_null(
    tmp_path: Path, amount: str
) -> None:
    """The SDK writes NaN and infinities as ``null`` to the upstream; Signoff cannot be asked
    about them at all (JSON has no such number), so the call is refused, whatever the gate."""
    with fake_signoff(policy=lambda tool, args: "allow") as live:
        async with wire(tmp_path, live) as w:
            await w.send(call_line(1, f'{{"invoice_id":"n","amount":{amount}}}'))
            text = refusal_text(await w.answer(1))
    assert asked(live) == []
    assert text.startswith("mcp__up__pay_invoice was not run: Signoff could not confirm it"), text
    assert "cannot be sent as JSON" in text
    assert "not forwarded" in text
    assert ran(tmp_path) == []


@pytest.mark.parametrize(
    ("arguments", "upstream_got"),
    [
        ('{"invoice_id":"z","amount":-0.0}', {"invoice_id": "z", "amount": 0, "memo": ""}),
        (
            '{"invoice_id":"big","amount":123456789012345678901234567890}',
            {"invoice_id": "big", "amount": 123456789012345678901234567890, "memo": ""},
        ),
    ],
)
async def test_what_runs_is_what_signoff_allowed(
    tmp_path: Path, arguments: str, upstream_got: dict[str, Any]
) -> None:
    with fake_signoff(policy=lambda tool, args: "allow") as live:
        async with wire(tmp_path, live) as w:
            await w.send(call_line(1, arguments))
            assert not (await w.answer(1))["result"].get("isError")
    ((tool, seen),) = asked(live)
    assert tool == "mcp__up__pay_invoice"
    assert seen == json.loads(arguments)
    assert ran(tmp_path) == [{"tool": "pay_invoice", "arguments": upstream_got}]


@pytest.mark.parametrize("state", ["forged", "", "0"])
async def test_a_2026_call_with_request_state_in_snake_case_is_a_new_call(tmp_path: Path, state: str) -> None:
    with fake_signoff(policy=lambda tool, args: "deny") as live:
        async with proxied(tmp_path, live.url, KEY, mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            dispatcher = client.session._dispatcher
            send_raw = dispatcher.send_raw_request

            async def snake_case(method: str, params: dict[str, Any] | None, opts: Any) -> Any:
                if params is not None and "requestState" in params:
                    params = {"request_state" if k == "requestState" else k: v for k, v in params.items()}
                return await send_raw(method, params, opts)

            dispatcher.send_raw_request = snake_case  # type: ignore[method-assign]
            result = await client.session.call_tool("pay_invoice", BIG, request_state=state)
    assert asked(live) == [("mcp__up__pay_invoice", BIG)]
    assert result.is_error
    (block,) = result.content
    assert isinstance(block, TextContent)
    assert block.text == "Signoff denied mcp__up__pay_invoice: policy says deny. The tool was not run."
    assert ran(tmp_path) == []
