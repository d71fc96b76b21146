"""``signoff-mcp-proxy`` as a client runs it, against real MCP SDK servers and a running Signoff.

The client is the ``mcp`` SDK's own, over stdio (the proxy as a subprocess, as Claude
Code and Cursor start it) or streamable HTTP (``--listen``); the upstream is a real SDK
server (``tests.hooks.mcp_upstream``) over stdio or streamable HTTP, forked from a process
that has imported it (``tests.hooks.mcp_forkserver``) except where the upstream process
itself is checked (its pid, a client killed, SIGTERM); Signoff is the
real server (the ``server`` fixture, SQLite), with a gate on ``mcp__up__pay_*``, or the
fake of ``signoff_fakes`` where the real server cannot produce an answer (rewritten
arguments, a malformed answer) or where the reports of executed calls are checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client import advertise
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.types import (
    METHOD_NOT_FOUND,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    EmptyResult,
    ListRootsResult,
    LoggingMessageNotificationParams,
    PromptListChangedNotification,
    PromptReference,
    Request,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    Root,
    RootsListChangedNotification,
    SubscribeRequest,
    SubscribeRequestParams,
    TaskMetadata,
    TextContent,
    ToolListChangedNotification,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.conftest import DEFAULT_CONFIG, Server, free_port
from tests.hooks.signoff_fakes import KEY, LiveSignoff
from tests.hooks.test_client_server import admin_client, pending_ids, vote
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = [sys.executable, "-m", "tests.hooks.mcp_upstream"]
FORKSERVER = os.path.join(tempfile.gettempdir(), f"signoff-mcp-upstream-{os.getpid()}.sock")
FORKED = [sys.executable, "-m", "tests.hooks.mcp_forkserver", FORKSERVER, "upstream"]
"""The same upstream, forked from one that has imported the SDK (tests/hooks/mcp_forkserver.py)."""
PROXY = [sys.executable, "-m", "signoff.hooks.mcp_proxy"]
FORKED_PROXY = [sys.executable, "-m", "tests.hooks.mcp_forkserver", FORKSERVER, "proxy"]
"""The same proxy, forked likewise: for the tests of what it answers, not of its process."""
BIG = {"invoice_id": "inv-1", "amount": 90_000}
LIST_CHANGES = {ToolListChangedNotification, PromptListChangedNotification, ResourceListChangedNotification}

GATE = {
    "type": "confirmation_gate",
    "name": "mcp payments",
    "tools": ["mcp__up__pay_*"],
    "when": "has(args.amount) && args.amount >= 50000",
    "channel": "chat",
    "approvers": ["alice", "bob"],
    "quorum": 1,
    "timeout": "30m",
    "editable": ["amount"],
}


@pytest.fixture(scope="module", autouse=True)
def forkserver() -> Iterator[None]:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(FORKSERVER)
    args = [sys.executable, "-m", "tests.hooks.mcp_forkserver", "--serve", FORKSERVER]
    with subprocess.Popen(args, cwd=REPO, stdin=subprocess.DEVNULL) as server:
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(FORKSERVER):
                assert server.poll() is None, f"the upstream's fork server exited ({server.returncode})"
                assert time.monotonic() < deadline, "the upstream's fork server did not start"
                time.sleep(0.02)
            yield
        finally:
            server.terminate()  # it exits as a process does, saving what coverage measured
            server.wait(30)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(FORKSERVER)


@pytest.fixture
def config() -> SignoffConfig:
    agents = {"finance-bot": {"hooks": [GATE]}}
    return parse_config({**DEFAULT_CONFIG, "agents": agents}, source="test.yaml")


@pytest.fixture
def calls(tmp_path: Path) -> Callable[[], list[dict[str, Any]]]:
    """The tool calls that reached the upstream server, in order."""
    log = tmp_path / "calls.jsonl"

    def read() -> list[dict[str, Any]]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return read


def proxy_env(url: str, key: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SIGNOFF_URL": url, "SIGNOFF_API_KEY": key, "PYTHONPATH": str(REPO), **extra}
    env.pop("SIGNOFF_SUBMIT_DEADLINE", None)
    return env


def logged(tmp_path: Path) -> list[str]:
    """The upstream's options that record its calls and its pid in the test's folder."""
    return ["--log", str(tmp_path / "calls.jsonl"), "--pid-file", str(tmp_path / "upstream.pid")]


def proxy_args(tmp_path: Path, *options: str, upstream: list[str] | None = None) -> list[str]:
    return ["--name", "up", *options, "--", *(upstream or [*FORKED, *logged(tmp_path)])]


@asynccontextmanager
async def proxied(
    tmp_path: Path,
    url: str,
    key: str,
    *options: str,
    mode: str = "legacy",
    env: dict[str, str] | None = None,
    **client: Any,
) -> AsyncIterator[Client]:
    """The SDK's client, over stdio, to the proxy in front of the test upstream."""
    params = StdioServerParameters(
        command=FORKED_PROXY[0],
        args=[*FORKED_PROXY[1:], *proxy_args(tmp_path, *options)],
        env=proxy_env(url, key, **(env or {})),
        cwd=str(REPO),
    )
    with (tmp_path / "proxy.err").open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode=mode, cache=None, **client) as c:
            yield c


@asynccontextmanager
async def direct(tmp_path: Path, mode: str = "legacy", **client: Any) -> AsyncIterator[Client]:
    """The same client straight to the test upstream."""
    params = StdioServerParameters(command=FORKED[0], args=FORKED[1:], cwd=str(REPO))
    async with Client(params, mode=mode, cache=None, **client) as c:
        yield c


def text(result: CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


def texts(result: CallToolResult) -> list[str]:
    blocks = [block for block in result.content if isinstance(block, TextContent)]
    assert len(blocks) == len(result.content)
    return [block.text for block in blocks]


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


# --------------------------------------------------------------------------- pass-through


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_everything_but_gating_passes_through_unchanged(
    server: Server, agent_key: str, tmp_path: Path, mode: str, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    async with direct(tmp_path, mode) as plain, proxied(tmp_path, server.url, agent_key, mode=mode) as gated:
        assert gated.protocol_version == plain.protocol_version
        assert gated.server_info == plain.server_info
        assert gated.instructions == plain.instructions
        assert dump(await gated.list_tools()) == dump(await plain.list_tools())
        for client in (plain, gated):
            assert (await client.list_tools()).tools[0].annotations is not None
        ungated = {"text": "hello", "times": 2}
        assert dump(await gated.call_tool("echo", ungated)) == dump(await plain.call_tool("echo", ungated))
        small = {"invoice_id": "inv-2", "amount": 10}
        assert dump(await gated.call_tool("pay_invoice", small)) == dump(
            await plain.call_tool("pay_invoice", small)
        )
        assert dump(await gated.list_resources()) == dump(await plain.list_resources())
        assert dump(await gated.list_resource_templates()) == dump(await plain.list_resource_templates())
        for uri in ("note://today", "note://monday"):
            assert dump(await gated.read_resource(uri)) == dump(await plain.read_resource(uri))
        assert dump(await gated.list_prompts()) == dump(await plain.list_prompts())
        prompt = {"code": "x = 1", "style": "long"}
        assert dump(await gated.get_prompt("review", prompt)) == dump(
            await plain.get_prompt("review", prompt)
        )
        ref = PromptReference(type="ref/prompt", name="review")
        argument = {"name": "style", "value": "s"}
        assert dump(await gated.complete(ref, argument)) == dump(await plain.complete(ref, argument))
        with pytest.raises(MCPError) as from_proxy:
            await gated.read_resource("nowhere://x")
        with pytest.raises(MCPError) as from_upstream:
            await plain.read_resource("nowhere://x")
        assert from_proxy.value.error == from_upstream.value.error
    assert [c["tool"] for c in calls()] == ["echo", "pay_invoice"]


async def test_notifications_pass_through_both_ways(
    server: Server, agent_key: str, tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    progress: list[tuple[float, float | None, str | None]] = []
    logged: list[LoggingMessageNotificationParams] = []
    received: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async def on_message(message: Any) -> None:
        received.append(message)

    async with proxied(
        tmp_path, server.url, agent_key, logging_callback=on_log, message_handler=on_message
    ) as client:
        result = await client.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
        assert text(result) == "done in 3 steps"
        assert progress == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]
        await client.call_tool("notify", {})
        await client.session.send_notification(RootsListChangedNotification())
        for _ in range(100):
            updated = [m.params.uri for m in received if isinstance(m, ResourceUpdatedNotification)]
            relayed = any(c["tool"] == "notifications/roots/list_changed" for c in calls())
            if LIST_CHANGES <= {type(m) for m in received} and len(updated) == 2 and relayed:
                break
            await asyncio.sleep(0.02)
    assert [(m.level, m.data) for m in logged] == [("info", f"step {i} of 3") for i in (1, 2, 3)]
    assert updated == ["note://today", "note://monday"]
    assert LIST_CHANGES <= {type(m) for m in received}
    assert calls()[-1] == {"tool": "notifications/roots/list_changed", "arguments": {}}


async def test_a_call_the_client_cancels_is_cancelled_upstream(
    server: Server, agent_key: str, tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    started = asyncio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with proxied(tmp_path, server.url, agent_key) as client:
        call = asyncio.create_task(client.call_tool("slow", {"steps": 3000}, progress_callback=on_progress))
        await asyncio.wait_for(started.wait(), 20)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(200):
            if any(c["tool"] == "slow cancelled" for c in calls()):
                break
            await asyncio.sleep(0.02)
        assert text(await client.call_tool("echo", {"text": "still here"})) != ""
    assert [c["tool"] for c in calls()] == ["slow", "slow cancelled", "echo"]


async def test_a_2026_client_gets_progress_and_opted_in_logs(
    server: Server, agent_key: str, tmp_path: Path
) -> None:
    progress: list[float] = []
    logged: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logged.append(str(params.data))

    async with proxied(
        tmp_path, server.url, agent_key, mode="auto", logging_callback=on_log, log_level="info"
    ) as client:
        assert client.protocol_version == "2026-07-28"
        await client.call_tool("slow", {"steps": 2}, progress_callback=on_progress)
    assert progress == [1.0, 2.0]
    assert logged == ["step 1 of 2", "step 2 of 2"]


# --------------------------------------------------------------------------- the upstream's questions


async def sample(ctx: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
    (message,) = params.messages
    assert isinstance(message.content, TextContent)
    return CreateMessageResult(
        role="assistant", content=TextContent(type="text", text=f"sampled {message.content.text}"), model="m1"
    )


async def elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    if params.mode == "url":
        return ElicitResult(action="accept")
    return ElicitResult(action="accept", content={"answer": "yes"})


async def list_roots(ctx: ClientRequestContext) -> ListRootsResult:
    return ListRootsResult(roots=[Root(uri="file:///work", name="work")])


ASKING: dict[str, Any] = {
    "sampling_callback": sample,
    "elicitation_callback": elicit,
    "list_roots_callback": list_roots,
}
QUESTIONS = [
    ("ask_model", {"prompt": "hi"}),
    ("ask_user", {"question": "ok?"}),
    ("visit", {"url": "https://example.com/pay"}),
    ("roots", {}),
]


async def answers(client: Client) -> list[list[str]]:
    return [texts(await client.call_tool(tool, arguments)) for tool, arguments in QUESTIONS]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_upstreams_questions_reach_the_client_and_its_answers_come_back(
    server: Server, agent_key: str, tmp_path: Path, mode: str
) -> None:
    async with proxied(tmp_path, server.url, agent_key, mode=mode, **ASKING) as client:
        through_proxy = await answers(client)
    assert through_proxy == [["m1: sampled hi"], ["accept: yes"], ["accept"], ["file:///work"]]
    if mode == "legacy":  # a 2026-07-28 client cannot be asked mid-call: the proxy asks it between rounds
        async with direct(tmp_path, mode, **ASKING) as plain:
            assert await answers(plain) == through_proxy


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_that_did_not_offer_a_capability_is_not_asked(
    server: Server, agent_key: str, tmp_path: Path, mode: str
) -> None:
    async with proxied(tmp_path, server.url, agent_key, mode=mode) as client:
        through_proxy = await answers(client)
    assert through_proxy == [
        ["refused (-32600): Sampling not supported"],
        ["refused (-32600): Elicitation not supported"],
        ["refused (-32600): Elicitation not supported"],
        ["refused (-32600): List roots not supported"],
    ]
    if mode == "legacy":
        async with direct(tmp_path, mode) as plain:
            assert await answers(plain) == through_proxy, "the answers the client itself gives"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_gated_call_that_asks_the_user_is_asked_of_signoff_once(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    mode: str,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    asked: list[str] = []

    async def memo(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"answer": "rent"})

    payment = {"invoice_id": "inv-7", "amount": 90_000}
    async with (
        proxied(
            tmp_path, server.url, agent_key, "--hold", "20", mode=mode, elicitation_callback=memo
        ) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_with_memo", payment))
        (rid,) = await pending_ids(runtime, admin)
        assert calls() == [], "nothing runs before the approval"
        assert asked == [], "nobody is asked before the approval"
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        result = await asyncio.wait_for(call, 15)
        assert text(result) == "paid inv-7: 90000 (rent)"
        assert asked == ["Memo for inv-7?"]
        assert len((await admin.get("/v1/admin/requests")).json()) == 1, "the answering round asked nobody"
        if mode == "auto":
            assert client.protocol_version == "2026-07-28"
            with pytest.raises(MCPError) as forged:
                await client.session.call_tool(
                    "pay_with_memo",
                    payment,
                    request_state="v1.forged",
                    input_responses={},
                    allow_input_required=True,
                )
            assert forged.value.error.message == "Invalid or expired requestState"
    assert [c["tool"] for c in calls()] == ["pay_with_memo", "pay_with_memo paid"]


async def test_an_upstream_asking_for_roots_as_it_starts_asks_the_client_that_connects(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    upstream = [*FORKED, "--roots-on-start", "--log", str(tmp_path / "calls.jsonl")]
    params = StdioServerParameters(
        command=FORKED_PROXY[0],
        args=[*FORKED_PROXY[1:], *proxy_args(tmp_path, upstream=upstream)],
        env=proxy_env(f"http://127.0.0.1:{free_port()}", KEY),
        cwd=str(REPO),
    )
    async with Client(params, mode="legacy", cache=None, list_roots_callback=list_roots):
        for _ in range(200):
            if calls():
                break
            await asyncio.sleep(0.05)
    assert calls() == [{"tool": "roots at start", "arguments": {"roots": ["file:///work"]}}]


async def test_over_http_each_question_reaches_the_client_whose_call_asked_it(
    server: Server, agent_key: str, tmp_path: Path
) -> None:
    asked: dict[str, list[str]] = {"a": [], "b": []}

    def answering(who: str) -> Any:
        async def answer(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
            asked[who].append(params.message)
            return ElicitResult(action="accept", content={"answer": who})

        return answer

    port = free_port()
    with http_upstream(tmp_path) as upstream_url:
        options = ["--name", "up", "--url", upstream_url, "--listen", f"127.0.0.1:{port}"]
        with process([*PROXY, *options], env=proxy_env(server.url, agent_key)) as proxy:
            wait_for_port(port, proxy)
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                Client(url, mode="legacy", cache=None, elicitation_callback=answering("a")) as a,
                Client(url, mode="legacy", cache=None, elicitation_callback=answering("b")) as b,
            ):
                results = await asyncio.gather(
                    a.call_tool("ask_user", {"question": "for a", "wait": 0.5}),
                    b.call_tool("ask_user", {"question": "for b", "wait": 0.5}),
                )
    assert [text(r) for r in results] == ["accept: a", "accept: b"]
    assert asked == {"a": ["for a"], "b": ["for b"]}


# --------------------------------------------------------------------------- changes and subscriptions


async def test_a_2026_client_hears_of_changes_through_its_subscription(
    server: Server, agent_key: str, tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    events: set[Any] = set()
    async with proxied(tmp_path, server.url, agent_key, mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        capabilities = client.server_capabilities
        assert capabilities.tools is not None
        assert capabilities.tools.list_changed
        assert capabilities.resources is not None
        assert capabilities.resources.subscribe
        async with client.listen(
            tools_list_changed=True,
            prompts_list_changed=True,
            resources_list_changed=True,
            resource_subscriptions=["note://today"],
        ) as changes:
            assert calls() == [{"tool": "resources/subscribe", "arguments": {"uri": "note://today"}}]
            await client.call_tool("notify", {})
            with anyio.fail_after(10):
                async for event in changes:
                    events.add(event)
                    if len(events) == 4:
                        break
        for _ in range(100):
            if calls()[-1]["tool"] == "resources/unsubscribe":
                break
            await asyncio.sleep(0.05)
    assert events == {
        ToolsListChanged(),
        PromptsListChanged(),
        ResourcesListChanged(),
        ResourceUpdated("note://today"),
    }
    assert calls()[-1] == {"tool": "resources/unsubscribe", "arguments": {"uri": "note://today"}}


async def test_clients_of_both_eras_share_one_subscription_upstream(
    server: Server, agent_key: str, tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    received: list[Any] = []

    async def on_message(message: Any) -> None:
        received.append(message)

    def subscriptions() -> list[tuple[str, str]]:
        return [(c["tool"], c["arguments"]["uri"]) for c in calls() if c["tool"].startswith("resources/")]

    port = free_port()
    options = ["--listen", f"127.0.0.1:{port}"]
    with process([*PROXY, *proxy_args(tmp_path, *options)], env=proxy_env(server.url, agent_key)) as proxy:
        wait_for_port(port, proxy)
        url = f"http://127.0.0.1:{port}/mcp"
        async with (
            Client(url, mode="legacy", cache=None, message_handler=on_message) as old,
            Client(url, mode="auto", cache=None) as new,
        ):
            await old.session.send_request(
                SubscribeRequest(params=SubscribeRequestParams(uri="note://today")), EmptyResult
            )
            async with new.listen(resource_subscriptions=["note://today"]) as changes:
                assert subscriptions() == [("resources/subscribe", "note://today")], (
                    "one subscription upstream"
                )
                await old.session.send_request(
                    UnsubscribeRequest(params=UnsubscribeRequestParams(uri="note://today")), EmptyResult
                )
                assert subscriptions() == [("resources/subscribe", "note://today")], (
                    "still held for the listener"
                )
                await old.call_tool("notify", {})
                with anyio.fail_after(10):
                    event = await anext(aiter(changes))
            for _ in range(100):
                if len(subscriptions()) == 2:
                    break
                await asyncio.sleep(0.05)
    assert event == ResourceUpdated("note://today")
    assert subscriptions() == [
        ("resources/subscribe", "note://today"),
        ("resources/unsubscribe", "note://today"),
    ]
    updated = [m.params.uri for m in received if isinstance(m, ResourceUpdatedNotification)]
    assert updated == ["note://today", "note://monday"], (
        "a handshake-era client hears what the upstream sends"
    )


# --------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_tools_call_made_as_a_task_is_gated_and_answered_as_a_plain_call(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    mode: str,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    tasks = [advertise("io.modelcontextprotocol/tasks")]
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "0.5", mode=mode, extensions=tasks) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        capabilities = client.server_capabilities
        assert capabilities.tasks is None, "the proxy offers no tasks"
        assert capabilities.extensions is None

        async def pay() -> CallToolResult:
            if mode == "legacy":  # a 2025-11-25 task-augmented request
                params = CallToolRequestParams(
                    name="pay_invoice", arguments=BIG, task=TaskMetadata(ttl=60_000)
                )
                return await client.session.send_request(CallToolRequest(params=params), CallToolResult)
            return await client.call_tool("pay_invoice", BIG)  # a client that takes tasks where offered

        waiting = await pay()
        (rid,) = await pending_ids(runtime, admin)
        assert waiting.is_error
        assert waiting.meta is not None
        assert (waiting.meta["signoff/decision"], waiting.meta["signoff/request_id"]) == ("pending", rid)
        assert calls() == [], "not run before the approval"
        with pytest.raises(MCPError) as refused:
            await client.session.send_request(
                Request(method="tasks/get", params={"taskId": "t-1"}), EmptyResult
            )
        assert refused.value.error.code == METHOD_NOT_FOUND
        assert "does not relay tasks" in refused.value.error.message
        await vote(runtime, rid, Verdict.APPROVE, "alice")
        assert text(await pay()) == "paid inv-1: 90000"
    assert calls() == [{"tool": "pay_invoice", "arguments": {**BIG, "memo": ""}}], "run once, not as a task"


# --------------------------------------------------------------------------- gating


async def test_a_gated_call_is_held_then_forwarded_once_approved(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG, progress_callback=on_progress))
        (rid,) = await pending_ids(runtime, admin)
        request = (await admin.get(f"/v1/admin/requests/{rid}")).json()
        assert request["tool_name"] == "mcp__up__pay_invoice"
        assert request["arguments"] == BIG
        assert calls() == [], "nothing runs before the approval"
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        result = await asyncio.wait_for(call, 15)
    assert not result.is_error
    assert text(result) == "paid inv-1: 90000"
    assert calls() == [{"tool": "pay_invoice", "arguments": {**BIG, "memo": ""}}]
    assert progress, "the client was told the call waits"
    assert progress[0][1] == 20
    assert f"request {rid}" in str(progress[0][2])


async def test_a_call_approved_with_changes_is_forwarded_as_approved(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    """The approver changes the amount on the real server: the upstream runs the changed call,
    and the report of it is the approved call (no ``executed_mismatch``)."""
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        decided = await admin.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "bob", "arguments": {"amount": 40_000}},
        )
        assert decided.status_code == 200, decided.text
        result = await asyncio.wait_for(call, 15)
        assert not result.is_error
        assert text(result) == "paid inv-1: 40000"
        assert calls() == [{"tool": "pay_invoice", "arguments": {**BIG, "amount": 40_000, "memo": ""}}]

        async def audited() -> list[str]:
            for _ in range(100):
                actions = [e["action"] for e in (await admin.get("/v1/admin/audit")).json()]
                if "executed" in actions:
                    return actions
                await asyncio.sleep(0.05)
            raise AssertionError("the call was not reported")

        actions = await audited()
    assert "executed_mismatch" not in actions


async def test_a_rejected_call_is_an_error_with_the_reason(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        await vote(runtime, rid, Verdict.REJECT, "alice", reason="not this quarter")
        result = await asyncio.wait_for(call, 15)
    assert result.is_error
    assert text(result) == (
        "Signoff denied mcp__up__pay_invoice: Rejected by Alice (web): not this quarter. "
        "The tool was not run."
    )
    assert result.meta == {"signoff/decision": "deny", "signoff/request_id": rid}
    assert calls() == []


async def test_an_expired_call_says_nobody_decided_not_that_it_was_denied(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    from datetime import timedelta

    from signoff.app.db import transaction
    from signoff.app.models import utcnow
    from signoff.app.requests.states import expire_overdue

    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "20") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        async with transaction(runtime.sessions) as session:
            await expire_overdue(session, now=utcnow() + timedelta(hours=1))
        result = await asyncio.wait_for(call, 15)
    assert result.is_error
    assert text(result) == (
        f"mcp__up__pay_invoice was not run: Not decided in time: approval request {rid} expired "
        "(nobody decided within 30m; asked Alice, Bob). Nobody refused this call; ask again if it is "
        "still needed."
    )
    assert result.meta == {"signoff/decision": "expired", "signoff/request_id": rid}
    assert calls() == []


async def test_a_call_held_past_hold_waits_and_its_retry_reattaches(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "0.5") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        first = await client.call_tool("pay_invoice", BIG)
        (rid,) = await pending_ids(runtime, admin)
        assert first.is_error
        assert first.meta == {"signoff/decision": "pending", "signoff/request_id": rid}
        assert f"waiting for approval (Signoff request {rid})" in text(first)
        assert "Call it again with the same arguments to keep waiting" in text(first)

        again = await client.call_tool("pay_invoice", {"amount": 90_000, "invoice_id": "inv-1"})
        assert again.meta == {"signoff/decision": "pending", "signoff/request_id": rid}
        assert len((await admin.get("/v1/admin/requests")).json()) == 1, "the retry did not ask again"

        await vote(runtime, rid, Verdict.APPROVE, "alice")
        approved = await client.call_tool("pay_invoice", BIG)
        assert text(approved) == "paid inv-1: 90000"
        assert len(calls()) == 1

        # The approval covered that call; the same call again is a new one.
        later = await client.call_tool("pay_invoice", BIG)
        assert later.meta is not None
        assert later.meta["signoff/decision"] == "pending"
        assert later.meta["signoff/request_id"] != rid
    assert len(calls()) == 1


async def test_a_new_proxy_process_asks_anew_what_an_earlier_one_asked(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    """Keys belong to the proxy process: a call identical to one refused in an earlier process
    (a new ``claude -p`` session, a restart) is a new request that somebody is asked about,
    never denied at once with the old reason; nor does it wait on a request an earlier
    process left pending."""
    async with admin_client(server.url, admin_headers) as admin:
        async with proxied(tmp_path, server.url, agent_key, "--hold", "20") as client:
            call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
            (rejected,) = await pending_ids(runtime, admin)
            await vote(runtime, rejected, Verdict.REJECT, "alice", reason="not this quarter")
            refused = await asyncio.wait_for(call, 15)
        assert refused.meta == {"signoff/decision": "deny", "signoff/request_id": rejected}

        async with proxied(tmp_path, server.url, agent_key, "--hold", "0.5") as client:
            again = await client.call_tool("pay_invoice", BIG)
        (waiting,) = await pending_ids(runtime, admin)
        assert again.meta == {"signoff/decision": "pending", "signoff/request_id": waiting}, text(again)
        assert waiting != rejected
        assert "not this quarter" not in text(again)

        async with proxied(tmp_path, server.url, agent_key, "--hold", "0.5") as client:
            later = await client.call_tool("pay_invoice", BIG)
        assert later.meta is not None
        assert later.meta["signoff/decision"] == "pending", text(later)
        assert later.meta["signoff/request_id"] not in {rejected, waiting}
        assert len((await admin.get("/v1/admin/requests")).json()) == 3
    assert calls() == []


async def test_a_retry_whose_approval_lapsed_while_parked_asks_anew(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    """An approval that lapsed (``approval_valid_for`` after its decision) before the retry
    came back allows nothing: the retry is asked anew, as a new request, not refused."""
    from datetime import timedelta

    import sqlalchemy as sa

    from signoff.app.db import transaction
    from signoff.app.models import ConfirmationRequest, utcnow

    table = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "0.5") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        first = await client.call_tool("pay_invoice", BIG)
        (rid,) = await pending_ids(runtime, admin)
        assert first.meta == {"signoff/decision": "pending", "signoff/request_id": rid}
        await vote(runtime, rid, Verdict.APPROVE, "alice")
        async with transaction(runtime.sessions) as session:
            await session.exec(
                sa.update(table).where(table.c.id == rid).values(decided_at=utcnow() - timedelta(minutes=11))
            )
        retry = await client.call_tool("pay_invoice", BIG)
        assert retry.meta is not None
        assert retry.meta["signoff/decision"] == "pending", text(retry)
        assert retry.meta["signoff/request_id"] != rid
    assert calls() == []


async def test_a_call_the_client_gives_up_on_is_reattached_by_its_retry(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "30", env={"SIGNOFF_DEBUG": "1"}) as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        call = asyncio.create_task(client.call_tool("pay_invoice", BIG))
        (rid,) = await pending_ids(runtime, admin)
        call.cancel()  # the client sends notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        # A retry sent while the proxy still unwinds the cancelled call would be a concurrent
        # identical call, with a key of its own; the retry comes once the call is parked.
        log = tmp_path / "proxy.err"
        await eventually(lambda: "its retry re-attaches (parked)" in log.read_text(), timeout=30)
        assert calls() == []
        await vote(runtime, rid, Verdict.APPROVE, "bob")
        retry = await client.call_tool("pay_invoice", BIG)
        assert len((await admin.get("/v1/admin/requests")).json()) == 1, "the retry asked nobody again"
    assert text(retry) == "paid inv-1: 90000"
    assert len(calls()) == 1


async def test_the_upstream_never_holds_the_agents_signoff_key(
    server: Server, agent_key: str, tmp_path: Path
) -> None:
    async with proxied(tmp_path, server.url, agent_key) as client:
        key = await client.call_tool("environ", {"name": "SIGNOFF_API_KEY"})
        url = await client.call_tool("environ", {"name": "SIGNOFF_URL"})
    assert text(key) == ""
    assert text(url) == server.url, "the rest of the environment is inherited"


async def test_a_2026_client_is_gated_the_same_way(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str], tmp_path: Path
) -> None:
    async with (
        proxied(tmp_path, server.url, agent_key, "--hold", "0.5", mode="auto") as client,
        admin_client(server.url, admin_headers) as admin,
    ):
        assert client.protocol_version == "2026-07-28"
        waiting = await client.call_tool("pay_invoice", BIG)
        (rid,) = await pending_ids(runtime, admin)
        assert waiting.is_error
        assert waiting.meta is not None
        assert waiting.meta["signoff/request_id"] == rid
        await vote(runtime, rid, Verdict.APPROVE, "alice")
        assert text(await client.call_tool("pay_invoice", BIG)) == "paid inv-1: 90000"


# --------------------------------------------------------------------------- the fake Signoff


@contextmanager
def fake_signoff(**kw: Any) -> Iterator[LiveSignoff]:
    live = LiveSignoff(**kw).start()
    try:
        yield live
    finally:
        live.stop()


def gate_payments(tool: str, arguments: dict[str, Any]) -> str:
    return "gate" if tool.startswith("mcp__up__pay_") else "allow"


async def test_approved_edits_are_what_runs_and_what_is_reported(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    def halve(tool: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        return {**arguments, "amount": arguments["amount"] // 2} if "amount" in arguments else None

    with fake_signoff(policy=lambda tool, args: "allow", rewrite=halve) as live:
        async with proxied(tmp_path, live.url, KEY) as client:
            result = await client.call_tool("pay_invoice", {"invoice_id": "inv-9", "amount": 100})
            echoed = await client.call_tool("echo", {"text": "as is"})
        reports = live.wait_for_reports(2)
    assert text(result) == "paid inv-9: 50"
    assert calls()[0] == {
        "tool": "pay_invoice",
        "arguments": {"invoice_id": "inv-9", "amount": 50, "memo": ""},
    }
    assert echoed.structured_content == {"text": "as is", "times": 1}
    (submitted, _) = live.submissions
    (paid,) = [r for r in reports if r["tool_name"] == "mcp__up__pay_invoice"]
    assert paid["arguments"] == {"invoice_id": "inv-9", "amount": 50}
    assert paid["idempotency_key"] == submitted["idempotency_key"]
    assert paid["session_id"] == submitted["session_id"]
    assert paid["result"]["content"] == [{"type": "text", "text": "paid inv-9: 50"}]


async def test_every_executed_call_is_reported_with_its_key(tmp_path: Path) -> None:
    with fake_signoff(policy=gate_payments) as live:
        async with proxied(tmp_path, live.url, KEY, "--hold", "5") as client:
            await client.call_tool("echo", {"text": "one"})
            call = asyncio.create_task(client.call_tool("pay_invoice", {"invoice_id": "i", "amount": 1}))
            rid = await asyncio.to_thread(live.wait_for_request)
            live.decide(rid, "approved")
            await call
            await client.call_tool("crash_not_a_tool", {})
        reports = live.wait_for_reports(3)
    keys = {s["tool_name"]: s["idempotency_key"] for s in live.submissions}
    assert [r["tool_name"] for r in reports] == [
        "mcp__up__echo",
        "mcp__up__pay_invoice",
        "mcp__up__crash_not_a_tool",
    ]
    assert all(r["idempotency_key"] == keys[r["tool_name"]] for r in reports)
    assert reports[2]["error"] == "the tool answered isError"
    assert {r["metadata"]["runtime"] for r in reports} == {"mcp"}


async def test_a_malformed_answer_from_signoff_is_not_forwarded(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    with fake_signoff(policy=lambda tool, args: "perhaps") as live:
        async with proxied(tmp_path, live.url, KEY) as client:
            result = await client.call_tool("echo", {"text": "hi"})
    assert result.is_error
    assert "malformed answer from Signoff" in text(result)
    assert "not forwarded" in text(result)
    assert calls() == []


class SlowToConfirm(LiveSignoff):
    """Answers a call's first submission at once, and every later one after longer than the
    proxy holds a call."""

    def _submit(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.submissions:
            time.sleep(1.5)
        return super()._submit(body)


async def test_a_pending_call_signoff_is_slow_to_confirm_again_still_waits(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    """Signoff said the call waits, then did not answer again within the hold: the call still
    waits (its request exists; the retry re-attaches), it is not called unavailable, and
    nothing runs."""
    live = SlowToConfirm().start()
    try:
        async with proxied(tmp_path, live.url, KEY, "--hold", "0.5") as client:
            result = await client.call_tool("pay_invoice", BIG)
    finally:
        live.stop()
    (rid,) = live.requests
    assert result.is_error
    assert result.meta == {"signoff/decision": "pending", "signoff/request_id": rid}, text(result)
    assert calls() == []


async def test_signoff_down_means_nothing_is_forwarded(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    async with proxied(tmp_path, nowhere, KEY, "--submit-deadline", "0.5") as client:
        assert [t.name for t in (await client.list_tools()).tools][:2] == ["echo", "pay_invoice"]
        result = await client.call_tool("echo", {"text": "hi"})
    assert result.is_error
    assert result.meta == {"signoff/decision": "unavailable"}
    assert "refused the connection" in text(result)
    assert "was not run" in text(result)
    assert calls() == []
    assert time.monotonic() - started < 20


# --------------------------------------------------------------------------- streamable HTTP


@contextmanager
def process(
    args: list[str], env: dict[str, str] | None = None, **kw: Any
) -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen(args, cwd=REPO, env=env, **kw) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode} before listening on {port}"
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@contextmanager
def http_upstream(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = ["--log", str(tmp_path / "calls.jsonl")]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with process([*UPSTREAM, "--http", str(port), *log], **quiet) as proc:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_http_upstream_and_http_clients(
    server: Server,
    agent_key: str,
    runtime: Runtime,
    admin_headers: dict[str, str],
    tmp_path: Path,
    mode: str,
    calls: Callable[[], list[dict[str, Any]]],
) -> None:
    port = free_port()
    env = proxy_env(server.url, agent_key, UPSTREAM_AUTH="Bearer up-secret", PROXY_TOKEN="proxy-secret")
    with http_upstream(tmp_path) as upstream_url:
        options = ["--name", "up", "--hold", "0.5", "--url", upstream_url]
        options += ["--header-env", "Authorization=UPSTREAM_AUTH"]
        options += ["--listen", f"127.0.0.1:{port}", "--listen-token-env", "PROXY_TOKEN"]
        with process([*PROXY, *options], env=env) as proxy:
            wait_for_port(port, proxy)
            url = f"http://127.0.0.1:{port}/mcp"
            refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert refused.status_code == 401
            headers = {"Authorization": "Bearer proxy-secret"}
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client,
                admin_client(server.url, admin_headers) as admin,
            ):
                assert [t.name for t in (await client.list_tools()).tools][:2] == ["echo", "pay_invoice"]
                seen = await client.call_tool("header", {"name": "Authorization"})
                assert text(seen) == "Bearer up-secret", "the upstream got its header from the environment"
                waiting = await client.call_tool("pay_invoice", BIG)
                (rid,) = await pending_ids(runtime, admin)
                assert waiting.meta is not None
                assert (waiting.meta["signoff/decision"], waiting.meta["signoff/request_id"]) == (
                    "pending",
                    rid,
                )
                await vote(runtime, rid, Verdict.APPROVE, "alice")
                assert text(await client.call_tool("pay_invoice", BIG)) == "paid inv-1: 90000"
            proxy.send_signal(signal.SIGTERM)
            assert proxy.wait(15) == 0
    assert [c["tool"] for c in calls()] == ["header", "pay_invoice"]


# --------------------------------------------------------------------------- process lifetime


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def eventually_gone(*pids: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


CLIENT = """
import os, sys, anyio
from mcp import Client, StdioServerParameters

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:], env=dict(os.environ))
    async with Client(params, mode="legacy") as client:
        await client.list_tools()
        print("ready", flush=True)
        await anyio.sleep(600)

anyio.run(main)
"""


def test_killing_the_client_leaves_no_upstream_behind(tmp_path: Path) -> None:
    with fake_signoff() as live:
        upstream = [*UPSTREAM, *logged(tmp_path)]  # the process itself is what is checked
        args = [sys.executable, "-c", CLIENT, *PROXY, *proxy_args(tmp_path, upstream=upstream)]
        env = proxy_env(live.url, KEY)
        with process(args, env=env, stdout=subprocess.PIPE) as client:
            assert client.stdout is not None
            assert client.stdout.readline() == b"ready\n"
            (proxy,) = children(client.pid)
            upstream = int((tmp_path / "upstream.pid").read_text())
            assert alive(proxy)
            assert alive(upstream)
            client.kill()
            client.wait(5)
            eventually_gone(proxy, upstream)


def test_sigterm_stops_the_proxy_and_its_upstream(tmp_path: Path) -> None:
    with fake_signoff() as live:
        args = [*PROXY, *proxy_args(tmp_path, upstream=[*UPSTREAM, *logged(tmp_path)])]
        with process(
            args, env=proxy_env(live.url, KEY), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as proxy:
            deadline = time.monotonic() + 30
            while not (tmp_path / "upstream.pid").exists() or not (tmp_path / "upstream.pid").read_text():
                assert time.monotonic() < deadline
                time.sleep(0.05)
            upstream = int((tmp_path / "upstream.pid").read_text())
            time.sleep(0.5)  # the handshake
            proxy.send_signal(signal.SIGTERM)
            assert proxy.wait(15) == 0
            eventually_gone(upstream)


async def test_an_upstream_that_dies_is_reported_and_the_proxy_exits(
    tmp_path: Path, calls: Callable[[], list[dict[str, Any]]]
) -> None:
    with fake_signoff(policy=lambda tool, args: "allow") as live:
        params = StdioServerParameters(
            command=FORKED_PROXY[0],
            args=[*FORKED_PROXY[1:], *proxy_args(tmp_path)],
            env=proxy_env(live.url, KEY),
            cwd=str(REPO),
        )
        errors = tmp_path / "proxy.err"
        with errors.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", cache=None) as client:
                with pytest.raises(MCPError) as gone:
                    await client.call_tool("crash", {})
    assert "has exited" in gone.value.error.message
    assert calls() == [{"tool": "crash", "arguments": {}}]
    assert "exited; stopping" in errors.read_text()


def test_without_signoff_configured_it_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    done = subprocess.run(
        [*PROXY, *proxy_args(tmp_path)], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "signoff-mcp-proxy: Signoff is not configured: set SIGNOFF_URL in the proxy's environment"
    )
    assert not (tmp_path / "upstream.pid").exists(), "no upstream is started for a proxy that cannot gate"


def test_a_signoff_of_the_projects_own_that_breaks_on_import_stops_it(tmp_path: Path) -> None:
    """The console script starts outside the ``signoff`` namespace: a project's own ``signoff``
    hiding it is one line and exit 2, never a traceback, and no upstream is started."""
    (tmp_path / "project" / "signoff").mkdir(parents=True)
    (tmp_path / "project" / "signoff" / "__init__.py").write_text("raise RuntimeError('not signoff-hooks')\n")
    proxy = Path(sys.executable).with_name("signoff-mcp-proxy")
    env = proxy_env("http://127.0.0.1:9", KEY, PYTHONPATH=str(tmp_path / "project"))
    done = subprocess.run(
        [str(proxy), *proxy_args(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"signoff-mcp-proxy: a package named 'signoff' at {tmp_path}/project/signoff shadows signoff-hooks; "
        f"rename it, or take {tmp_path}/project off the Python path (PYTHONPATH)\n",
    )
    assert not (tmp_path / "upstream.pid").exists()
