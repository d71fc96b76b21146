from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

from signoff.hooks.adapters.openai_agents import SignoffApprovals
from signoff.hooks.client import AsyncGateClient, GateClient
from tests.hooks.signoff_fakes import KEY, URL, Scripted, pending, state, submitted

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05, "deadline": 0.5}
NO_TRACING = RunConfig(tracing_disabled=True)


def setup(
    fake: Scripted,
    *,
    arguments: Any = None,
    pre_submit: bool = True,
    tools: list[str] | None = None,
    sync_client: bool = False,
) -> tuple[SignoffApprovals, Agent[Any], list[str]]:
    client: AsyncGateClient | GateClient
    if sync_client:
        client = GateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST)
    else:
        client = AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST)
    signoff = SignoffApprovals(client, session_id="conv-1", tools=tools, user_id="dev-1")
    ran: list[str] = []

    @function_tool(needs_approval=signoff.needs_approval("delete_file") if pre_submit else True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    model = ScriptedModel(
        [
            [function_call("delete_file", arguments or {"path": "/data"}, call_id="call_1")],
            [assistant_message("done")],
        ]
    )
    return signoff, Agent(name="janitor", model=model, tools=[delete_file]), ran


def outputs(result: Any) -> list[Any]:
    return [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]


@pytest.mark.parametrize("sync_client", [False, True], ids=["async-client", "sync-client"])
async def test_approved_call_runs_once(sync_client: bool) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved"))
    signoff, agent, ran = setup(fake, sync_client=sync_client)
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert result.final_output == "done"
    assert ran == ["/data"]
    assert outputs(result) == ["deleted /data"]
    bodies = fake.bodies()
    assert len(bodies) == 3, "submitted by needs_approval, by resolve, and again once approved"
    assert {b["idempotency_key"] for b in bodies} == {"openai-agents:conv-1:call_1"}
    assert bodies[0]["arguments"] == {"path": "/data"}
    assert bodies[0]["user_id"] == "dev-1"
    assert [r.url.path for r in fake.sent("wait")] == ["/v1/requests/req-1/wait"]
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == "openai-agents:conv-1:call_1"
    assert (report["tool_name"], report["arguments"], report["result"]) == (
        "delete_file",
        {"path": "/data"},
        "deleted /data",
    )


async def test_rejected_call_never_runs_and_the_model_sees_why() -> None:
    rejected = state("req-1", "rejected", reason="not today", decided_by={"channel": "slack", "name": "Bob"})
    fake = Scripted().on("submit", pending("req-1")).on("wait", rejected)
    signoff, agent, ran = setup(fake)
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == []
    assert outputs(result) == ["The tool call was denied: Rejected by Bob (slack): not today."]
    assert fake.sent("report") == [], "a call that did not run is not reported"


async def test_outright_allow_does_not_interrupt() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    signoff, agent, ran = setup(fake)
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == ["/data"]
    assert len(fake.sent("submit")) == 1
    assert result.interruptions == []
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == "openai-agents:conv-1:call_1"


async def test_resolve_works_with_plain_needs_approval_true() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    signoff, agent, ran = setup(fake, pre_submit=False)
    await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == ["/data"]
    assert fake.bodies()[0]["idempotency_key"] == "openai-agents:conv-1:call_1"


@pytest.mark.parametrize("reply", [httpx.ConnectError("refused"), httpx.Response(401)], ids=["down", "401"])
async def test_gate_failures_reject(reply: Any) -> None:
    fake = Scripted().on("submit", reply)
    signoff, agent, ran = setup(fake)
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == []
    (output,) = outputs(result)
    assert output.startswith("The tool call was not run: Signoff could not confirm it")


async def test_rewritten_arguments_are_rejected_because_they_cannot_be_applied() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"path": "/tmp"}))
    signoff, agent, ran = setup(fake)
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == [], "never the original call"
    (output,) = outputs(result)
    assert output.startswith(
        "The tool call was denied: Signoff approved delete_file only with changed arguments"
    )
    assert 'path: "/data" → "/tmp"' in output, "the reason names the approved values"
    assert fake.sent("report") == []


async def test_run_refuses_hooks_that_would_not_report() -> None:
    from agents import RunHooks

    fake = Scripted().on("submit", submitted("allow"))
    signoff, agent, ran = setup(fake)
    with pytest.raises(TypeError, match="SignoffRunHooks"):
        await signoff.run(agent, "clean up", run_config=NO_TRACING, hooks=RunHooks())
    assert ran == []


async def test_malformed_arguments_are_rejected() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    signoff, agent, ran = setup(fake, arguments="{not json")
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == []
    assert "not valid JSON" in outputs(result)[0]


async def test_uncovered_interruptions_are_left_pending() -> None:
    fake = Scripted().on("submit", pending("req-1"))
    signoff, agent, ran = setup(fake, tools=["something_else"])
    result = await signoff.run(agent, "clean up", run_config=NO_TRACING)
    assert ran == []
    assert [item.name for item in result.interruptions] == ["delete_file"]
    assert fake.sent("wait") == []
