"""Approving with changes and the reports of executed calls, each runtime against the real server.

The "payments" gate lets its approver change ``amount``: Bob approves a payment of 90,000 as
60,000 through the operator API, and Signoff answers the waiting agent ``allow`` with the
request's ``changes``, which the client applies to the call (``modified_arguments``). Each
adapter then runs the tool — driven by its framework's own test model — with the approved
arguments (or, where the runtime cannot, refuses naming them), and reports the executed call
under the key it was asked under: the report's arguments are checked in the audit log (the
``audit_log`` hook records every reported call, and a call run otherwise than approved would
be an ``executed_mismatch``) and its key against the ask's, as the server received both.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from signoff.hooks.client import AsyncGateClient, GateClient
from signoff.hooks.decorator import gate
from tests.conftest import DEFAULT_CONFIG, Server
from tests.hooks.test_client_server import admin_client, pending_ids, vote

ASKED = {"invoice_id": "INV-7", "amount": 90_000}
EDITED = {"invoice_id": "INV-7", "amount": 60_000}
PRE, POST = "/v1/hooks/pre-tool-use", "/v1/hooks/post-tool-use"


class Recorder:
    """The app, with the body of every pre- and post-tool-use call kept by path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in (PRE, POST):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def tap() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.bodies[path].append(json.loads(b"".join(chunks)))
            return message

        await self.app(scope, tap, send)


@pytest.fixture
def config() -> SignoffConfig:
    agents = copy.deepcopy(DEFAULT_CONFIG["agents"])
    bot = agents["finance-bot"]
    bot["hooks"][0]["editable"] = ["amount"]  # the "payments" gate
    bot["hooks"].append({"type": "audit_log", "tools": ["*"]})
    return parse_config({**DEFAULT_CONFIG, "agents": agents}, source="test.yaml")


@pytest.fixture
async def server(runtime: Runtime) -> AsyncIterator[Server]:
    s = Server(runtime)
    s._server.config.app = Recorder(s._server.config.app)
    async with s:
        yield s


def recorded(server: Server) -> Recorder:
    """What the server received (its app is wrapped in a :class:`Recorder`)."""
    recorder = server._server.config.app
    assert isinstance(recorder, Recorder)
    return recorder


async def approve_when_asked(server: Server, admin_headers: dict[str, str], run: Awaitable[Any]) -> Any:
    """Run the agent; approve the one request it makes as Bob, changing the amount to 60,000;
    return what the run returned."""
    task = asyncio.ensure_future(run)
    async with admin_client(server.url, admin_headers) as admin:
        (rid,) = await pending_ids(server.runtime, admin)
        request = (await admin.get(f"/v1/admin/requests/{rid}")).json()
        assert request["arguments"] == ASKED, "the gate asked about the call as proposed"
        decided = await admin.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "bob", "arguments": {"amount": 60_000}},
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["approved_arguments"] == EDITED
    return await asyncio.wait_for(task, 30)


async def tool_calls(server: Server, admin_headers: dict[str, str]) -> list[dict[str, Any]]:
    """The executed calls the audit log recorded from reports."""
    async with admin_client(server.url, admin_headers) as admin:
        events = (await admin.get("/v1/admin/audit")).json()
    return [e["detail"] for e in events if e["action"] == "tool_call"]


async def assert_reported_as_run(server: Server, admin_headers: dict[str, str]) -> None:
    """One report, of the edited call, under the key of the call's ask."""
    bodies = recorded(server).bodies
    assert bodies[PRE], "the call was asked about"
    (report,) = bodies[POST]
    assert report["arguments"] == EDITED
    assert report["idempotency_key"] == bodies[PRE][0]["idempotency_key"]
    assert {b["idempotency_key"] for b in bodies[PRE]} == {report["idempotency_key"]}
    (logged,) = await tool_calls(server, admin_headers)
    assert (logged["tool"], logged["arguments"]) == ("pay_invoice", EDITED)
    async with admin_client(server.url, admin_headers) as admin:
        actions = [e["action"] for e in (await admin.get("/v1/admin/audit")).json()]
    assert "executed" in actions, "the report used up the approval"
    assert "executed_mismatch" not in actions, "the call ran as approved"


def fast(cls: type[Any], server: Server, key: str) -> Any:
    return cls(server.url, key, deadline=20, poll_timeout=5, backoff_initial=0.05, backoff_max=0.2)


# --------------------------------------------------------------------------- the decorator


@pytest.mark.parametrize("kind", ["async-client", "sync-client"])
async def test_decorator_runs_the_edited_call_and_reports_it(
    kind: str, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    client = fast(AsyncGateClient if kind == "async-client" else GateClient, server, agent_key)
    paid: list[dict[str, Any]] = []

    @gate(client, key=lambda invoice_id, amount: f"billing:{invoice_id}")
    async def pay_invoice(invoice_id: str, amount: int) -> str:
        paid.append({"invoice_id": invoice_id, "amount": amount})
        return f"paid {amount}"

    try:
        assert await approve_when_asked(server, admin_headers, pay_invoice(**ASKED)) == "paid 60000"
    finally:
        await client.aclose() if isinstance(client, AsyncGateClient) else client.close()
    assert paid == [EDITED], "the edited call ran, never the original"
    await assert_reported_as_run(server, admin_headers)
    assert recorded(server).bodies[PRE][0]["idempotency_key"].startswith("billing:INV-7:")


# --------------------------------------------------------------------------- Pydantic AI


async def test_pydantic_ai_runs_the_edited_call_and_reports_it(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from signoff.hooks.adapters.pydantic_ai import SignoffApprovals

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(str(returned[0]))])
        return ModelResponse(parts=[ToolCallPart("pay_invoice", dict(ASKED), tool_call_id="call-1")])

    paid: list[dict[str, Any]] = []
    async with fast(AsyncGateClient, server, agent_key) as client:
        agent = Agent(FunctionModel(model), capabilities=[SignoffApprovals(client, tools=["pay_invoice"])])

        @agent.tool_plain
        def pay_invoice(invoice_id: str, amount: int) -> str:
            paid.append({"invoice_id": invoice_id, "amount": amount})
            return f"paid {amount}"

        result = await approve_when_asked(server, admin_headers, agent.run("pay", conversation_id="conv-1"))
    assert paid == [EDITED], "ToolApproved(override_args=…): the edited call ran"
    assert result.output == "paid 60000"
    await assert_reported_as_run(server, admin_headers)
    assert recorded(server).bodies[POST][0]["idempotency_key"] == "pydantic-ai:conv-1:call-1"


# --------------------------------------------------------------------------- LangChain


async def test_langchain_runs_the_edited_call_and_reports_it(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    from signoff.hooks.adapters.langchain import SignoffMiddleware
    from tests.hooks.test_adapters_langchain import ToolCallingFakeModel

    paid: list[dict[str, Any]] = []

    @tool
    def pay_invoice(invoice_id: str, amount: int) -> str:
        """Pay an invoice."""
        paid.append({"invoice_id": invoice_id, "amount": amount})
        return f"paid {amount}"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(
                    content="", tool_calls=[{"name": "pay_invoice", "args": dict(ASKED), "id": "call_1"}]
                ),
                AIMessage(content="done"),
            ]
        )
    )
    client = fast(GateClient, server, agent_key)
    agent = create_agent(model, [pay_invoice], middleware=[SignoffMiddleware(client, tools=["pay_invoice"])])
    config = {"configurable": {"thread_id": "thread-1"}}
    run = asyncio.to_thread(agent.invoke, {"messages": [("user", "pay")]}, config)
    with client:
        output = await approve_when_asked(server, admin_headers, run)
    assert paid == [EDITED], "LangChain's edit: the edited call ran"
    (message,) = [m for m in output["messages"] if isinstance(m, ToolMessage)]
    assert message.content == "paid 60000"
    await assert_reported_as_run(server, admin_headers)
    assert recorded(server).bodies[POST][0]["idempotency_key"] == "langchain:thread-1:call_1"


# --------------------------------------------------------------------------- OpenAI Agents SDK


async def test_openai_agents_refuses_the_edited_call_naming_the_approved_values(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, function_tool
    from agents.items import ToolCallOutputItem
    from agents.testing import ScriptedModel, assistant_message, function_call

    from signoff.hooks.adapters.openai_agents import SignoffApprovals

    paid: list[dict[str, Any]] = []
    async with fast(AsyncGateClient, server, agent_key) as client:
        signoff = SignoffApprovals(client, session_id="conv-1")

        @function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
        def pay_invoice(invoice_id: str, amount: int) -> str:
            """Pay an invoice."""
            paid.append({"invoice_id": invoice_id, "amount": amount})
            return f"paid {amount}"

        model = ScriptedModel(
            [[function_call("pay_invoice", dict(ASKED), call_id="call_1")], [assistant_message("done")]]
        )
        agent = Agent(name="bookkeeper", model=model, tools=[pay_invoice])
        run = signoff.run(agent, "pay", run_config=RunConfig(tracing_disabled=True))
        result = await approve_when_asked(server, admin_headers, run)
    assert paid == [], "the SDK cannot run the edited call, and the original never runs"
    (output,) = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert "only with changed arguments (amount: 90000 → 60000)" in output
    assert recorded(server).bodies[POST] == [], "nothing ran, nothing reported"
    assert await tool_calls(server, admin_headers) == []


async def test_openai_agents_reports_an_approved_call(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from signoff.hooks.adapters.openai_agents import SignoffApprovals

    asked = {"invoice_id": "INV-8", "amount": 70_000}  # not edited
    async with fast(AsyncGateClient, server, agent_key) as client:
        signoff = SignoffApprovals(client, session_id="conv-2")

        @function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
        def pay_invoice(invoice_id: str, amount: int) -> str:
            """Pay an invoice."""
            return f"paid {amount}"

        model = ScriptedModel(
            [[function_call("pay_invoice", dict(asked), call_id="call_1")], [assistant_message("done")]]
        )
        agent = Agent(name="bookkeeper", model=model, tools=[pay_invoice])
        task = asyncio.ensure_future(signoff.run(agent, "pay", run_config=RunConfig(tracing_disabled=True)))
        async with admin_client(server.url, admin_headers) as admin:
            (rid,) = await pending_ids(server.runtime, admin)
        await vote(server.runtime, rid, Verdict.APPROVE, "bob")
        result = await asyncio.wait_for(task, 30)
    assert result.final_output == "done"
    (report,) = recorded(server).bodies[POST]
    assert (report["arguments"], report["result"]) == (asked, "paid 70000")
    assert report["idempotency_key"] == "openai-agents:conv-2:call_1"
    assert {b["idempotency_key"] for b in recorded(server).bodies[PRE]} == {report["idempotency_key"]}
    (logged,) = await tool_calls(server, admin_headers)
    assert logged["arguments"] == asked


async def test_a_report_reaches_the_real_server_for_an_ungated_call(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """No gate matches a small payment: it runs at once, and is reported all the same."""
    async with fast(AsyncGateClient, server, agent_key) as client:

        @gate(client)
        async def pay_invoice(invoice_id: str, amount: int) -> str:
            return "paid"

        assert await pay_invoice("INV-9", 120) == "paid"
    (report,) = recorded(server).bodies[POST]
    assert report["idempotency_key"] == recorded(server).bodies[PRE][0]["idempotency_key"]
    (logged,) = await tool_calls(server, admin_headers)
    assert logged["arguments"] == {"invoice_id": "INV-9", "amount": 120}
    assert logged["result"] == "paid"


# --------------------------------------------------------------------------- Claude Code


async def test_claude_code_hook_passes_the_edit_as_updated_input_and_reports_the_call(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """The real ``signoff-hook`` process, for PreToolUse and then PostToolUse of the same call."""
    from tests.hooks.test_claude_code_process import finish, hook_env, start_hook

    pre = {
        "session_id": "sess-1",
        "hook_event_name": "PreToolUse",
        "tool_name": "pay_invoice",
        "tool_input": dict(ASKED),
        "tool_use_id": "toolu_1",
        "cwd": "/home/u/project",
    }
    env = hook_env(server.url, agent_key)
    asked = await start_hook(env, pre, "--timeout", "60")
    code, out, err = await approve_when_asked(server, admin_headers, finish(asked))
    assert code == 0, err
    output = json.loads(out)["hookSpecificOutput"]
    assert output["permissionDecision"] == "allow"
    assert output["updatedInput"] == EDITED, "Claude Code runs the edited input"

    # What Claude Code sends once the tool ran: the same ids, the input it ran with.
    post = {**pre, "hook_event_name": "PostToolUse", "tool_input": EDITED, "tool_response": "paid 60000"}
    code, out, err = await finish(await start_hook(env, post, "--timeout", "10"))
    assert (code, out, err) == (0, "", "")
    await assert_reported_as_run(server, admin_headers)
    assert recorded(server).bodies[POST][0]["idempotency_key"] == "claude-code:sess-1:toolu_1"
    assert recorded(server).bodies[POST][0]["result"] == "paid 60000"
