"""Gate an OpenAI Agents SDK agent's tools with Signoff's ``needs_approval`` and resolver.

Needs signoff-hooks with its openai-agents extra
(from this checkout: ``pip install './hooks[openai-agents]'``).
With ``make run`` going (examples/signoff.yaml)::

    export SIGNOFF_URL=http://127.0.0.1:8000
    export SIGNOFF_API_KEY=$(signoff keys create demo-agent | tail -1)
    python examples/openai_agents_agent.py

A scripted model (the SDK's ``agents.testing.ScriptedModel``: no LLM, no API key) pays two
invoices. Paying 120 is allowed at once; paying 90,000 matches the "large payments" gate,
interrupts the run, and ``SignoffApprovals.run`` waits until Alice or Bob decides, then
resumes it. ``SIGNOFF_DEADLINE`` (seconds, default 600) bounds the wait; it is this
example's own setting, not one the client reads.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

from signoff.hooks.adapters.openai_agents import SignoffApprovals
from signoff.hooks.client import AsyncGateClient, GateConfigError, GateDecision

DEADLINE = float(os.environ.get("SIGNOFF_DEADLINE", "600"))


def pay_invoice(invoice_id: str, amount: int) -> str:
    """Pay an invoice."""
    return f"paid invoice {invoice_id} ({amount} EUR)"


def scripted_model() -> ScriptedModel:
    """Stands in for an LLM: one payment per turn, then a final answer."""
    return ScriptedModel(
        [
            [function_call("pay_invoice", {"invoice_id": "INV-4001", "amount": 120}, call_id="call_1")],
            [function_call("pay_invoice", {"invoice_id": "INV-4002", "amount": 90_000}, call_id="call_2")],
            [assistant_message("Done.")],
        ]
    )


class PrintingGateClient(AsyncGateClient):
    """An AsyncGateClient that prints each decision and who to ask while a person decides.

    Only for this demo: in your code pass a plain ``AsyncGateClient()``.
    """

    async def pre_tool_use(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        wait: bool = True,
        **options: Any,
    ) -> GateDecision:
        key = idempotency_key or f"{self.runtime}:demo:{uuid.uuid4().hex}"
        call = f"{tool_name}({', '.join(f'{k}={v!r}' for k, v in (arguments or {}).items())})"
        decision = await super().pre_tool_use(
            tool_name, arguments, idempotency_key=key, wait=False, **options
        )
        if decision.pending and wait:
            print(f"{call}: waiting for approval (Signoff request {decision.request_id})")
            print(f"  approve with: signoff requests approve {decision.request_id} --as alice")
            # The same idempotency key: this waits on the request just created.
            decision = await super().pre_tool_use(tool_name, arguments, idempotency_key=key, **options)
        if decision.allowed:
            print(f"{call}: allowed ({decision.reason if decision.request_id else 'no approval needed'})")
        elif decision.failure is not None:
            print(f"{call}: not run, Signoff could not decide ({decision.reason})")
        elif not decision.pending:
            print(f"{call}: denied ({decision.reason})")
        return decision


async def main() -> int:
    try:
        client = PrintingGateClient(deadline=DEADLINE)  # SIGNOFF_URL / SIGNOFF_API_KEY
    except GateConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    async with client:
        # A stable session id (the conversation id) lets a saved RunState resume elsewhere.
        signoff = SignoffApprovals(client, session_id=uuid.uuid4().hex)
        tool = function_tool(pay_invoice, needs_approval=signoff.needs_approval("pay_invoice"))
        agent = Agent(name="bookkeeper", model=scripted_model(), tools=[tool])
        result = await signoff.run(
            agent, "Pay this month's invoices.", run_config=RunConfig(tracing_disabled=True)
        )
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            print(f"tool output: {item.output}")
    print(f"agent: {result.final_output}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
