"""Gate a plain Python function with the Signoff client and the ``@gate`` decorator.

With ``make run`` going (examples/signoff.yaml)::

    export SIGNOFF_URL=http://127.0.0.1:8000
    export SIGNOFF_API_KEY=$(signoff keys create demo-agent | tail -1)
    python examples/python_client.py

Paying 120 is allowed at once; paying 90,000 matches the "large payments" gate and
waits until Alice or Bob decides. ``SIGNOFF_DEADLINE`` (seconds, default 600) bounds
the wait; it is this example's own setting, not one the client reads.
"""

from __future__ import annotations

import os
import sys
import uuid

from signoff.hooks.client import GateClient, GateConfigError, GateDenied, GateTimeout, GateUnavailable
from signoff.hooks.decorator import call_key, gate

DEADLINE = float(os.environ.get("SIGNOFF_DEADLINE", "600"))
RUN = uuid.uuid4().hex[:8]


def invoice_key(invoice_id: str, amount: int) -> str:
    """Names the payment of one invoice (in this run of the script). The decorator appends a
    digest of the call, so the same invoice with another amount needs its own approval, and
    once the payment has run its approval is used: paying again asks again."""
    return f"python:{RUN}:{invoice_id}"


def main() -> int:
    try:
        client = GateClient(deadline=DEADLINE)  # SIGNOFF_URL / SIGNOFF_API_KEY
    except GateConfigError as exc:
        print(exc, file=sys.stderr)
        return 2

    @gate(client, key=invoice_key)
    def pay_invoice(invoice_id: str, amount: int) -> str:
        return f"paid invoice {invoice_id} ({amount} EUR)"

    with client:
        for invoice_id, amount in [("INV-1001", 120), ("INV-1002", 90_000)]:
            call = f"pay_invoice(invoice_id={invoice_id!r}, amount={amount})"
            arguments = {"invoice_id": invoice_id, "amount": amount}
            # Optional: submit first without waiting, to say who must decide. The decorated
            # call below sends the same idempotency key, so it waits on this very request.
            submitted = client.pre_tool_use(
                "pay_invoice",
                arguments,
                idempotency_key=call_key(invoice_key(**arguments), "pay_invoice", arguments),
                wait=False,
            )
            if submitted.pending:
                print(f"{call}: waiting for approval (Signoff request {submitted.request_id})")
                print(f"  approve with: signoff requests approve {submitted.request_id} --as alice")
            try:
                if not submitted.pending:
                    submitted.raise_for_denial()  # denied or unreachable: no need to ask twice
                result = pay_invoice(invoice_id, amount)  # runs only once Signoff allows it
            except GateTimeout as exc:
                print(f"{call}: not run, no decision in time ({exc.reason})")
            except GateUnavailable as exc:
                print(f"{call}: not run, Signoff could not decide ({exc.reason})")
            except GateDenied as exc:
                print(f"{call}: denied ({exc.reason})")
            else:
                how = "approved" if submitted.pending else "no approval needed"
                print(f"{call}: allowed ({how}) -> {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
