"""Gate a Pydantic AI agent's tools with the ``SignoffApprovals`` capability.

Needs signoff-hooks with its pydantic-ai extra (from this checkout: ``pip install './hooks[pydantic-ai]'``).
With ``make run`` going (examples/signoff.yaml)::

    export SIGNOFF_URL=http://127.0.0.1:8000
    export SIGNOFF_API_KEY=$(signoff keys create demo-agent | tail -1)
    python examples/pydantic_ai_agent.py

A scripted model (Pydantic AI's ``FunctionModel``: no LLM, no API key) pays two invoices.
Paying 120 is allowed at once; paying 90,000 matches the "large payments" gate and waits
until Alice or Bob decides. ``SIGNOFF_DEADLINE`` (seconds, default 600) bounds the wait;
it is this example's own setting, not one the client reads.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from signoff.hooks.adapters.pydantic_ai import SignoffApprovals
from signoff.hooks.client import AsyncGateClient, GateConfigError, GateDecision

DEADLINE = float(os.environ.get("SIGNOFF_DEADLINE", "600"))
PAYMENTS = [{"invoice_id": "INV-2001", "amount": 120}, {"invoice_id": "INV-2002", "amount": 90_000}]


def pay_invoice(invoice_id: str, amount: int) -> str:
    """Pay an invoice."""
    return f"paid invoice {invoice_id} ({amount} EUR)"


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for an LLM: one payment per step, then a summary of what the tools said."""
    step = sum(isinstance(message, ModelResponse) for message in messages)
    if step < len(PAYMENTS):
        return ModelResponse(parts=[ToolCallPart("pay_invoice", PAYMENTS[step])])
    said = [str(part.content) for m in messages for part in m.parts if isinstance(part, ToolReturnPart)]
    return ModelResponse(parts=[TextPart("; ".join(said))])


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
        agent = Agent(
            FunctionModel(scripted_model),
            tools=[pay_invoice],
            capabilities=[SignoffApprovals(client, tools=["pay_invoice"])],
        )
        result = await agent.run("Pay this month's invoices.", conversation_id=uuid.uuid4().hex)
    print(f"agent: {result.output}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
