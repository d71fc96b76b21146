"""What an adapter asks Signoff about is what the tool runs with, after the framework's validation.

The frameworks validate a model's tool arguments into the tool's schema after the adapter has
asked Signoff: fields left out take their defaults, and lax coercion turns ``"true"`` into
``True`` and ``"90000"`` into ``90000``. A gate that reads the model's text instead of the
validated call misses calls the tool then makes: CEL's ``==`` between a string and a bool is
simply false (no error that would deny), and ``has(args.amount) && …`` is a clean non-match for
a field left out. So a model could force a recursive delete gated on ``args.force == true`` by
sending ``"force": "true"``, or make a 90,000 payment by leaving out an ``amount`` whose default
is 90,000 — each run with no one asked. Each attack drives the framework's own test model
against the real server: the call must reach the approvers as the tool would run it, and a
rejection must keep the tool from running.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator

from signoff.app.config import SignoffConfig, parse_config
from signoff.hooks.client import AsyncGateClient, GateClient
from tests.conftest import DEFAULT_CONFIG, Server
from tests.hooks.test_client_server import admin_client

FORCED = {"path": "/srv", "force": "true"}
"""A forced delete, as a model may spell it: the tool's ``force: bool`` takes ``"true"`` as True."""
AS_RUN = {"path": "/srv", "force": True}
NO_AMOUNT = {"invoice_id": "INV-7"}
"""A payment leaving out ``amount``, whose default is 90,000."""
PAID_AS_RUN = {"invoice_id": "INV-7", "amount": 90_000}


@pytest.fixture
def config() -> SignoffConfig:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["hooks"][0]["editable"] = ["amount"]  # payments
    body["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "forced deletes",
            "tools": ["delete_*"],
            "when": "args.force == true",
            "channel": "chat",
            "approvers": ["alice"],
            "timeout": "30m",
        }
    )
    return parse_config(body, source="test.yaml")


def fast(cls: type[Any], server: Server, key: str) -> Any:
    return cls(server.url, key, deadline=20, poll_timeout=5, backoff_initial=0.05, backoff_max=0.2)


async def reject_when_asked(
    server: Server, admin_headers: dict[str, str], run: Awaitable[Any]
) -> tuple[Any, list[dict[str, Any]]]:
    """Run the agent, rejecting every request it makes; what the run returned, and the requests
    as the approvers saw them."""
    task = asyncio.ensure_future(run)
    async with admin_client(server.url, admin_headers) as admin:
        while not task.done():
            pending = (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
            for request in pending:
                r = await admin.post(
                    f"/v1/admin/requests/{request['id']}/decision",
                    json={"verdict": "reject", "operator": "alice", "reason": "no"},
                )
                assert r.status_code == 200, r.text
            if pending:
                break
            await asyncio.sleep(0.05)
        result = await asyncio.wait_for(task, 30)
        requests = (await admin.get("/v1/admin/requests")).json()
    return result, requests


def asked(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["arguments"] for r in requests]


# --------------------------------------------------------------------------- Pydantic AI


async def _pydantic_ai(server: Server, key: str, admin_headers: dict[str, str], tool: str, args: Any) -> Any:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from signoff.hooks.adapters.pydantic_ai import SignoffApprovals

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id="call-1")])

    ran: list[dict[str, Any]] = []
    async with fast(AsyncGateClient, server, key) as client:
        agent = Agent(FunctionModel(model), capabilities=[SignoffApprovals(client)])

        @agent.tool_plain
        def delete_tree(path: str, force: bool = False) -> str:
            ran.append({"path": path, "force": force})
            return "deleted"

        @agent.tool_plain
        def pay_invoice(invoice_id: str, amount: int = 90_000) -> str:
            ran.append({"invoice_id": invoice_id, "amount": amount})
            return "paid"

        _, requests = await reject_when_asked(
            server, admin_headers, agent.run("go", conversation_id="conv-1")
        )
    return ran, requests


@pytest.mark.parametrize("args", [FORCED, '{"path": "/srv", "force": "true"}'], ids=["dict", "json"])
async def test_pydantic_ai_asks_about_the_coerced_value(
    args: Any, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    ran, requests = await _pydantic_ai(server, agent_key, admin_headers, "delete_tree", args)
    assert asked(requests) == [AS_RUN], "the approvers were asked about the forced delete"
    assert ran == [], "rejected: the forced delete never ran"


async def test_pydantic_ai_asks_about_the_default_filled_in(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    ran, requests = await _pydantic_ai(server, agent_key, admin_headers, "pay_invoice", NO_AMOUNT)
    assert asked(requests) == [PAID_AS_RUN], "the approvers were asked about a payment of 90,000"
    assert ran == [], "rejected: the payment never ran"


# --------------------------------------------------------------------------- LangChain


async def _langchain(server: Server, key: str, admin_headers: dict[str, str], tool: str, args: Any) -> Any:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as as_tool

    from signoff.hooks.adapters.langchain import SignoffMiddleware
    from tests.hooks.test_adapters_langchain import ToolCallingFakeModel

    ran: list[dict[str, Any]] = []

    @as_tool
    def delete_tree(path: str, force: bool = False) -> str:
        """Delete a directory tree."""
        ran.append({"path": path, "force": force})
        return "deleted"

    @as_tool
    def pay_invoice(invoice_id: str, amount: int = 90_000) -> str:
        """Pay an invoice."""
        ran.append({"invoice_id": invoice_id, "amount": amount})
        return "paid"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(content="", tool_calls=[{"name": tool, "args": dict(args), "id": "call_1"}]),
                AIMessage(content="done"),
            ]
        )
    )
    client = fast(GateClient, server, key)
    agent = create_agent(model, [delete_tree, pay_invoice], middleware=[SignoffMiddleware(client)])
    run = asyncio.to_thread(
        agent.invoke, {"messages": [("user", "go")]}, {"configurable": {"thread_id": "t-1"}}
    )
    with client:
        _, requests = await reject_when_asked(server, admin_headers, run)
    return ran, requests


async def test_langchain_asks_about_the_coerced_value(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    ran, requests = await _langchain(server, agent_key, admin_headers, "delete_tree", FORCED)
    assert asked(requests) == [AS_RUN], "the approvers were asked about the forced delete"
    assert ran == [], "rejected: the forced delete never ran"


async def test_langchain_asks_about_the_default_filled_in(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    ran, requests = await _langchain(server, agent_key, admin_headers, "pay_invoice", NO_AMOUNT)
    assert asked(requests) == [PAID_AS_RUN], "the approvers were asked about a payment of 90,000"
    assert ran == [], "rejected: the payment never ran"


@pytest.mark.parametrize("edit", [None, {"amount": 40_000}])
async def test_langchain_runs_the_tool_with_what_was_asked_about_validated_once(
    server: Server, agent_key: str, admin_headers: dict[str, str], edit: dict[str, Any] | None
) -> None:
    """A validator that does not give back what it is given (here: doubling): the tool is handed
    the model's 30,000, which it runs as 60,000, the value Signoff was asked about; handed the
    validated 60,000 it ran 120,000, above a gate nobody was asked for. Changes an approver made
    (40,000) run only if, validated, they come out as approved: here they would run as 80,000."""
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool as as_tool

    from signoff.hooks.adapters.langchain import SignoffMiddleware
    from tests.hooks.test_adapters_langchain import ToolCallingFakeModel

    paid: list[int] = []

    @as_tool
    def pay_invoice(invoice_id: str, amount: Annotated[int, AfterValidator(lambda v: v * 2)]) -> str:
        """Pay an invoice."""
        paid.append(amount)
        return "paid"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                AIMessage(
                    content="",
                    tool_calls=[
                        {"name": "pay_invoice", "args": {"invoice_id": "INV-7", "amount": 30_000}, "id": "c1"}
                    ],
                ),
                AIMessage(content="done"),
            ]
        )
    )
    client = fast(GateClient, server, agent_key)
    agent = create_agent(model, [pay_invoice], middleware=[SignoffMiddleware(client)])
    run = asyncio.ensure_future(
        asyncio.to_thread(
            agent.invoke, {"messages": [("user", "go")]}, {"configurable": {"thread_id": "t-1"}}
        )
    )
    with client:
        async with admin_client(server.url, admin_headers) as admin:
            while not (
                pending := (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
            ):
                assert not run.done(), "the payment was not asked about"
                await asyncio.sleep(0.05)
            (request,) = pending
            assert request["arguments"] == {"invoice_id": "INV-7", "amount": 60_000}
            decision: dict[str, Any] = {"verdict": "approve", "operator": "alice"}
            if edit is not None:
                decision["arguments"] = edit
            r = await admin.post(f"/v1/admin/requests/{request['id']}/decision", json=decision)
            assert r.status_code == 200, r.text
            await asyncio.wait_for(run, 30)
    assert paid == ([60_000] if edit is None else []), "the tool ran with a value nobody approved"


@pytest.mark.parametrize("edit", [None, {"amount": 40_000}])
async def test_pydantic_ai_runs_only_what_validates_into_the_approved_arguments(
    server: Server, agent_key: str, admin_headers: dict[str, str], edit: dict[str, Any] | None
) -> None:
    """A validator that does not give back what it is given (here: doubling): the model's 30,000
    is validated once, as when asked, and runs as the 60,000 approved; changes an approver made
    (40,000) are validated before the tool runs and would run as 80,000, which nobody approved:
    the call is skipped."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from signoff.hooks.adapters.pydantic_ai import SignoffApprovals

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(str(returned[0]))])
        return ModelResponse(parts=[ToolCallPart("pay_invoice", {"invoice_id": "INV-7", "amount": 30_000})])

    paid: list[int] = []
    task: Any = None
    async with fast(AsyncGateClient, server, agent_key) as client:
        agent = Agent(FunctionModel(model), capabilities=[SignoffApprovals(client)])

        @agent.tool_plain
        def pay_invoice(invoice_id: str, amount: Annotated[int, AfterValidator(lambda v: v * 2)]) -> str:
            paid.append(amount)
            return f"paid {amount}"

        task = asyncio.ensure_future(agent.run("pay", conversation_id="conv-1"))
        async with admin_client(server.url, admin_headers) as admin:
            while not (
                pending := (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
            ):
                assert not task.done(), "the payment of 60,000 was not asked about"
                await asyncio.sleep(0.05)
            (request,) = pending
            assert request["arguments"] == {"invoice_id": "INV-7", "amount": 60_000}
            decision: dict[str, Any] = {"verdict": "approve", "operator": "bob"}
            if edit is not None:
                decision["arguments"] = edit
            r = await admin.post(f"/v1/admin/requests/{request['id']}/decision", json=decision)
            assert r.status_code == 200, r.text
        result = await asyncio.wait_for(task, 30)
    if edit is None:
        assert paid == [60_000], "the approved 60,000 is what runs, validated once"
    else:
        assert paid == [], "validated, the approved 40,000 would pay 80,000, which nobody approved"
        assert "not the ones Signoff approved (amount: 40000 → 80000)" in result.output


# --------------------------------------------------------------------------- OpenAI Agents SDK


@pytest.mark.parametrize(("tool", "args"), [("delete_tree", FORCED), ("pay_invoice", NO_AMOUNT)])
async def test_openai_agents_asks_about_what_the_tool_runs_with(
    tool: str, args: dict[str, Any], server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from signoff.hooks.adapters.openai_agents import SignoffApprovals

    ran: list[dict[str, Any]] = []
    async with fast(AsyncGateClient, server, agent_key) as client:
        signoff = SignoffApprovals(client, session_id="conv-1")

        @function_tool(needs_approval=signoff.needs_approval("delete_tree"))
        def delete_tree(path: str, force: bool = False) -> str:
            """Delete a directory tree."""
            ran.append({"path": path, "force": force})
            return "deleted"

        @function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
        def pay_invoice(invoice_id: str, amount: int = 90_000) -> str:
            """Pay an invoice."""
            ran.append({"invoice_id": invoice_id, "amount": amount})
            return "paid"

        model = ScriptedModel(
            [[function_call(tool, dict(args), call_id="call_1")], [assistant_message("done")]]
        )
        agent = Agent(name="janitor", model=model, tools=[delete_tree, pay_invoice])
        run = signoff.run(agent, "go", run_config=RunConfig(tracing_disabled=True))
        _, requests = await reject_when_asked(server, admin_headers, run)
    assert ran == [], "neither the forced delete nor the payment of 90,000 ran unasked"
    assert asked(requests) == [AS_RUN if tool == "delete_tree" else PAID_AS_RUN]


async def test_openai_agents_runs_the_approved_call_with_the_values_asked_about_and_reports_them(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from signoff.hooks.adapters.openai_agents import SignoffApprovals

    paid: list[int] = []
    async with fast(AsyncGateClient, server, agent_key) as client:
        signoff = SignoffApprovals(client, session_id="conv-1")

        @function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
        def pay_invoice(invoice_id: str, amount: int = 90_000) -> str:
            """Pay an invoice."""
            paid.append(amount)
            return "paid"

        model = ScriptedModel(
            [[function_call("pay_invoice", dict(NO_AMOUNT), call_id="call_1")], [assistant_message("done")]]
        )
        agent = Agent(name="payer", model=model, tools=[pay_invoice])
        task = asyncio.ensure_future(signoff.run(agent, "go", run_config=RunConfig(tracing_disabled=True)))
        async with admin_client(server.url, admin_headers) as admin:
            while not (
                pending := (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
            ):
                assert not task.done(), "the payment of 90,000 was not asked about"
                await asyncio.sleep(0.05)
            (request,) = pending
            assert request["arguments"] == PAID_AS_RUN
            r = await admin.post(
                f"/v1/admin/requests/{request['id']}/decision", json={"verdict": "approve", "operator": "bob"}
            )
            assert r.status_code == 200, r.text
            await asyncio.wait_for(task, 30)
            trail = (await admin.get(f"/v1/admin/requests/{request['id']}")).json()
    assert paid == [90_000]
    [executed] = [e for e in trail["audit"] if e["action"] == "executed"]
    assert executed["detail"]["arguments"] == PAID_AS_RUN  # reported as it ran


async def test_openai_agents_rejects_a_call_whose_validated_arguments_it_cannot_see(
    server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """A parameter that runs the application's own validator: the SDK cannot tell the values the
    tool would get without running it, so nothing is approved and the tool never runs."""
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from signoff.hooks.adapters.openai_agents import SignoffApprovals

    paid: list[int] = []
    async with fast(AsyncGateClient, server, agent_key) as client:
        signoff = SignoffApprovals(client, session_id="conv-1")

        @function_tool(needs_approval=signoff.needs_approval("pay_invoice"))
        def pay_invoice(invoice_id: str, amount: Annotated[int, AfterValidator(lambda v: v * 2)]) -> str:
            """Pay an invoice."""
            paid.append(amount)
            return "paid"

        args = {"invoice_id": "INV-7", "amount": 30_000}
        model = ScriptedModel(
            [[function_call("pay_invoice", args, call_id="call_1")], [assistant_message("done")]]
        )
        agent = Agent(name="payer", model=model, tools=[pay_invoice])
        result = await asyncio.wait_for(
            signoff.run(agent, "go", run_config=RunConfig(tracing_disabled=True)), 30
        )
    assert paid == [], "the tool would have paid 60,000, which no one saw"
    outputs = " ".join(str(getattr(item, "output", "")) for item in result.new_items)
    assert "cannot show the arguments pay_invoice would run with" in outputs
