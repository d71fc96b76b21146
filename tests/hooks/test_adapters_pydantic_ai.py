from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.test import TestModel

from signoff.hooks.adapters.pydantic_ai import SignoffApprovals
from signoff.hooks.client import AsyncGateClient, GateClient
from tests.hooks.signoff_fakes import KEY, URL, Scripted, pending, state, submitted

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}


def make_agent(
    fake: Scripted, *, sync_client: bool = False, tools: list[str] | None = None, first: Any = None
) -> tuple[Agent[None, str], list[str]]:
    ran: list[str] = []
    client: AsyncGateClient | GateClient
    if sync_client:
        client = GateClient(URL, KEY, transport=httpx.MockTransport(fake), deadline=0.5, **FAST)
    else:
        client = AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), deadline=0.5, **FAST)
    capabilities: list[Any] = [first] if first is not None else []
    capabilities.append(SignoffApprovals(client, tools=tools, user_id="dev-1"))
    agent = Agent(TestModel(call_tools=["delete_file"]), capabilities=capabilities)

    @agent.tool_plain
    def delete_file(path: str) -> str:
        ran.append(path)
        return f"deleted {path}"

    @agent.tool_plain
    def list_files() -> str:
        ran.append("list")
        return "a b c"

    return agent, ran


def tool_returns(result: Any) -> list[Any]:
    return [
        part.content
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]


@pytest.mark.parametrize("sync_client", [False, True], ids=["async-client", "sync-client"])
async def test_approved_call_runs_once(sync_client: bool) -> None:
    approved = state("req-1", "approved", decided_by={"channel": "slack", "name": "Alice"})
    fake = Scripted().on("submit", pending("req-1")).on("wait", approved)
    agent, ran = make_agent(fake, sync_client=sync_client)
    result = await agent.run("clean up", conversation_id="conv-1")
    assert ran == ["a"]
    assert tool_returns(result) == ["deleted a"]
    body, again = fake.bodies()
    assert again == body, "sent again as it was, once approved"
    assert body["tool_name"] == "delete_file"
    assert body["arguments"] == {"path": "a"}
    assert body["idempotency_key"] == "pydantic-ai:conv-1:pyd_ai_tool_call_id__delete_file"
    assert body["user_id"] == "dev-1"
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == body["idempotency_key"]
    assert (report["tool_name"], report["arguments"], report["result"]) == (
        "delete_file",
        {"path": "a"},
        "deleted a",
    )


async def test_rejected_call_never_runs_and_the_model_sees_why() -> None:
    rejected = state("req-1", "rejected", reason="keep it", decided_by={"channel": "slack", "name": "Bob"})
    fake = Scripted().on("submit", pending("req-1")).on("wait", rejected)
    agent, ran = make_agent(fake)
    result = await agent.run("clean up")
    assert ran == []
    assert tool_returns(result) == ["The tool call was denied: Rejected by Bob (slack): keep it."]
    assert fake.sent("report") == [], "a call that did not run is not reported"


async def test_rewritten_arguments_are_used() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"path": "/tmp/only"}))
    agent, ran = make_agent(fake)
    await agent.run("clean up")
    assert ran == ["/tmp/only"]
    (report,) = fake.bodies("report")
    assert report["arguments"] == {"path": "/tmp/only"}, "the arguments it ran with"


async def test_a_tool_that_raises_is_reported_with_the_error() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    client = AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST)
    agent = Agent(TestModel(call_tools=["delete_file"]), capabilities=[SignoffApprovals(client)])

    @agent.tool_plain
    def delete_file(path: str) -> str:
        raise PermissionError("read-only file system")

    with pytest.raises(PermissionError):
        await agent.run("clean up", conversation_id="conv-2")
    (report,) = fake.bodies("report")
    assert report["error"] == "PermissionError: read-only file system"
    assert report["idempotency_key"] == "pydantic-ai:conv-2:pyd_ai_tool_call_id__delete_file"


@pytest.mark.parametrize(
    "reply",
    [httpx.ConnectError("refused"), httpx.Response(401), httpx.Response(200, text="garbage")],
    ids=["down", "401", "malformed"],
)
async def test_gate_failures_deny(reply: Any) -> None:
    fake = Scripted().on("submit", reply)
    agent, ran = make_agent(fake)
    result = await agent.run("clean up")
    assert ran == []
    (message,) = tool_returns(result)
    assert message.startswith("The tool call was not run: Signoff could not confirm it")


async def test_timeout_while_pending_denies() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1"))
    agent, ran = make_agent(fake)
    result = await agent.run("clean up")
    assert ran == []
    assert "still pending" in tool_returns(result)[0]


async def test_only_listed_tools_are_gated() -> None:
    fake = Scripted()
    agent, ran = make_agent(fake, tools=["list_files"])
    await agent.run("clean up")
    assert ran == ["a"]
    assert fake.requests == []


async def test_an_approval_from_elsewhere_is_still_checked_with_signoff() -> None:
    """Another handler approving first does not bypass the gate."""

    def approve_everything(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults:
        return requests.build_results(approve_all=True)

    fake = Scripted().on("submit", submitted("deny", reason="read-only mode"))
    agent, ran = make_agent(fake, first=HandleDeferredToolCalls(handler=approve_everything))
    result = await agent.run("clean up")
    assert ran == []
    assert tool_returns(result) == ["The tool call was denied: read-only mode."]
    assert len(fake.requests) == 1
