"""Gate a LangChain v1 (LangGraph) agent's tools with the ``SignoffMiddleware``.

Needs signoff-hooks with its langchain extra (from this checkout: ``pip install './hooks[langchain]'``).
With ``make run`` going (examples/signoff.yaml)::

    export SIGNOFF_URL=http://127.0.0.1:8000
    export SIGNOFF_API_KEY=$(signoff keys create demo-agent | tail -1)
    python examples/langchain_agent.py

A scripted model (LangChain's ``GenericFakeChatModel``: no LLM, no API key) pays two
invoices. Paying 120 is allowed at once; paying 90,000 matches the "large payments" gate
and waits until Alice or Bob decides. ``SIGNOFF_DEADLINE`` (seconds, default 600) bounds
the wait; it is this example's own setting, not one the client reads.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from signoff.hooks.adapters.langchain import SignoffMiddleware
from signoff.hooks.client import GateClient, GateConfigError, GateDecision

DEADLINE = float(os.environ.get("SIGNOFF_DEADLINE", "600"))


@tool
def pay_invoice(invoice_id: str, amount: int) -> str:
    """Pay an invoice."""
    return f"paid invoice {invoice_id} ({amount} EUR)"


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, accepting tools like a real one (its replies are scripted)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def scripted_model() -> ScriptedChatModel:
    """Stands in for an LLM: one payment per step, then a final answer."""
    payments = [("call_1", "INV-3001", 120), ("call_2", "INV-3002", 90_000)]
    replies = [
        AIMessage(
            content="",
            tool_calls=[{"name": "pay_invoice", "args": {"invoice_id": i, "amount": a}, "id": call_id}],
        )
        for call_id, i, a in payments
    ]
    return ScriptedChatModel(messages=iter([*replies, AIMessage(content="Done.")]))


class PrintingGateClient(GateClient):
    """A GateClient that prints each decision and who to ask while a person decides.

    Only for this demo: in your code pass a plain ``GateClient()``.
    """

    def pre_tool_use(
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
        decision = super().pre_tool_use(tool_name, arguments, idempotency_key=key, wait=False, **options)
        if decision.pending and wait:
            print(f"{call}: waiting for approval (Signoff request {decision.request_id})")
            print(f"  approve with: signoff requests approve {decision.request_id} --as alice")
            # The same idempotency key: this waits on the request just created.
            decision = super().pre_tool_use(tool_name, arguments, idempotency_key=key, **options)
        if decision.allowed:
            print(f"{call}: allowed ({decision.reason if decision.request_id else 'no approval needed'})")
        elif decision.failure is not None:
            print(f"{call}: not run, Signoff could not decide ({decision.reason})")
        elif not decision.pending:
            print(f"{call}: denied ({decision.reason})")
        return decision


def main() -> int:
    try:
        client = PrintingGateClient(deadline=DEADLINE)  # SIGNOFF_URL / SIGNOFF_API_KEY
    except GateConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    with client:
        agent = create_agent(
            scripted_model(), [pay_invoice], middleware=[SignoffMiddleware(client, tools=["pay_invoice"])]
        )
        # The thread id makes the idempotency key langchain:<thread_id>:<tool_call_id>.
        config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
        output = agent.invoke({"messages": [HumanMessage("Pay this month's invoices.")]}, config)
    for message in output["messages"]:
        if isinstance(message, ToolMessage):
            print(f"tool {message.name} ({message.status}): {message.content}")
    print(f"agent: {output['messages'][-1].content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
