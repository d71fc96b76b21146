from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from signoff.hooks.adapters.langchain import SignoffMiddleware
from signoff.hooks.client import AsyncGateClient, GateClient
from tests.hooks.signoff_fakes import KEY, URL, Scripted, pending, state, submitted

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05, "deadline": 0.5}
CONFIG = {"configurable": {"thread_id": "thread-7"}}


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's fake chat model, accepting tools (its replies are scripted anyway)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def make_agent(middleware: SignoffMiddleware, ran: list[str]) -> Any:
    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(f"delete {path}")
        return f"deleted {path}"

    @tool
    def list_files() -> str:
        """List files."""
        ran.append("list")
        return "a b c"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "delete_file", "args": {"path": "/data"}, "id": "call_1"},
                        {"name": "list_files", "args": {}, "id": "call_2"},
                    ],
                ),
                AIMessage(content="done"),
            ]
        )
    )
    return create_agent(
        model, [delete_file, list_files], middleware=[middleware], checkpointer=InMemorySaver()
    )


def sync_client(fake: Scripted) -> GateClient:
    return GateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST)


def tool_messages(output: dict[str, Any]) -> dict[str, ToolMessage]:
    return {m.name: m for m in output["messages"] if isinstance(m, ToolMessage)}


def test_approved_call_runs() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(sync_client(fake), tools=["delete_file"], user_id="dev-1"), ran)
    output = agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert sorted(ran) == ["delete /data", "list"]
    assert tool_messages(output)["delete_file"].content == "deleted /data"
    body, again = fake.bodies()
    assert again == body, "sent again as it was, once approved"
    assert body["tool_name"] == "delete_file"
    assert body["arguments"] == {"path": "/data"}
    assert body["idempotency_key"] == "langchain:thread-7:call_1"
    assert body["user_id"] == "dev-1"
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == "langchain:thread-7:call_1"
    assert (report["tool_name"], report["arguments"]) == ("delete_file", {"path": "/data"})
    assert report["result"] == "deleted /data"
    assert "error" not in report


def test_rejected_call_does_not_run_and_the_model_sees_why() -> None:
    rejected = state("req-1", "rejected", reason="prod data", decided_by={"channel": "slack", "name": "Bob"})
    fake = Scripted().on("submit", pending("req-1")).on("wait", rejected)
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(sync_client(fake), tools=["delete_file"]), ran)
    output = agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert ran == ["list"]
    message = tool_messages(output)["delete_file"]
    assert message.status == "error"
    assert message.tool_call_id == "call_1"
    assert message.content == "The tool call was denied: Rejected by Bob (slack): prod data."
    assert fake.sent("report") == [], "a call that did not run is not reported"


def test_every_tool_is_gated_by_default() -> None:
    fake = Scripted().on("submit", submitted("deny", reason="read-only"))
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(sync_client(fake)), ran)
    agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert ran == []
    assert sorted(b["tool_name"] for b in fake.bodies()) == ["delete_file", "list_files"]


def test_rewritten_arguments_are_used() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"path": "/tmp/scratch"}))
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(sync_client(fake), tools=["delete_file"]), ran)
    agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert sorted(ran) == ["delete /tmp/scratch", "list"]
    (report,) = fake.bodies("report")
    assert report["arguments"] == {"path": "/tmp/scratch"}, "the arguments it ran with"


def test_a_tool_that_raises_is_reported_with_the_error() -> None:
    fake = Scripted().on("submit", submitted("allow"))

    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        raise PermissionError("read-only file system")

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"name": "delete_file", "args": {"path": "/p"}, "id": "c"}]
                ),
                AIMessage(content="done"),
            ]
        )
    )
    agent = create_agent(model, [delete_file], middleware=[SignoffMiddleware(sync_client(fake))])
    with pytest.raises(PermissionError):
        agent.invoke({"messages": [("user", "x")]}, CONFIG)
    (report,) = fake.bodies("report")
    assert report["error"] == "PermissionError: read-only file system"
    assert report["idempotency_key"] == "langchain:thread-7:c"


@pytest.mark.parametrize(
    "reply",
    [httpx.ConnectError("refused"), httpx.Response(500), httpx.Response(200, text="??")],
    ids=["down", "5xx", "malformed"],
)
def test_gate_failures_deny(reply: Any) -> None:
    fake = Scripted().on("submit", reply)
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(sync_client(fake), tools=["delete_file"]), ran)
    output = agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert ran == ["list"]
    message = tool_messages(output)["delete_file"]
    assert message.status == "error"
    assert str(message.content).startswith("The tool call was not run: Signoff could not confirm it")


def test_no_thread_id_gets_a_fresh_key() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    ran: list[str] = []
    middleware = SignoffMiddleware(sync_client(fake), tools=["delete_file"])
    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"name": "delete_file", "args": {"path": "/p"}, "id": "c"}]
                ),
                AIMessage(content="done"),
            ]
        )
    )

    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "ok"

    create_agent(model, [delete_file], middleware=[middleware]).invoke({"messages": [("user", "x")]})
    assert ran == ["/p"]
    assert ":auto:" in fake.bodies()[0]["idempotency_key"], (
        "no thread id: a fresh key, never one that repeats"
    )
    assert fake.bodies("report")[0]["idempotency_key"] == fake.bodies()[0]["idempotency_key"]


def test_async_client_on_a_sync_agent_denies() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    ran: list[str] = []
    client = AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake))
    agent = make_agent(SignoffMiddleware(client, tools=["delete_file"]), ran)
    output = agent.invoke({"messages": [("user", "clean up")]}, CONFIG)
    assert ran == ["list"]
    assert "use GateClient" in str(tool_messages(output)["delete_file"].content)
    assert fake.requests == []


@pytest.mark.parametrize("kind", ["async-client", "sync-client"])
async def test_async_agent(kind: str) -> None:
    approved = state("req-1", "approved")
    rejected = state("req-2", "rejected", reason="no")

    def by_tool(request: httpx.Request) -> httpx.Response:
        import json

        name = json.loads(request.content)["tool_name"]
        return pending("req-1") if name == "delete_file" else pending("req-2")

    fake = (
        Scripted().on("submit", by_tool).on("wait", lambda r: approved if "req-1" in r.url.path else rejected)
    )
    client: GateClient | AsyncGateClient
    if kind == "async-client":
        client = AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST)
    else:
        client = sync_client(fake)
    ran: list[str] = []
    agent = make_agent(SignoffMiddleware(client), ran)
    output = await agent.ainvoke({"messages": [("user", "clean up")]}, CONFIG)
    assert ran == ["delete /data"]
    messages = tool_messages(output)
    assert messages["delete_file"].content == "deleted /data"
    assert messages["list_files"].status == "error"
    assert {b["idempotency_key"] for b in fake.bodies()} == {
        "langchain:thread-7:call_1",
        "langchain:thread-7:call_2",
    }
    (report,) = fake.bodies("report")
    assert (report["idempotency_key"], report["result"]) == ("langchain:thread-7:call_1", "deleted /data")
