"""What receipts cost: signing and verifying a decision receipt, and the action digest taken
for every gated call as it arrives. In-process CPU time per operation (``time.process_time``:
time other processes take the core is not counted), the median over rounds; the target is
under 1 ms each.

    python -m bench.receipts [--rounds 15] [--number 500]
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from signoff.app.receipt_keys import SigningKey, sign
from signoff.hooks.receipts import action_digest, canonical_bytes, verify_receipt

ARGUMENTS = {
    "amount": 90000,
    "currency": "EUR",
    "vendor": "ACME GmbH",
    "memo": "Invoice 2026-114 for the October consulting work, see https://erp.example.com/inv/2026-114",
    "lines": [{"sku": "C-1", "hours": 32, "rate": 180.0}, {"sku": "C-2", "hours": 8, "rate": 210.5}],
}
VOTE = {
    "gate": "payments",
    "person": "alice",
    "verdict": "approve",
    "channel": "ops-slack",
    "user_id": "U0ALICE",
    "name": "Alice Liu",
    "assurance": None,
    "at": "2026-12-02T18:00:00.123456+00:00",
}
PAYLOAD: dict[str, Any] = {
    "kind": "decision",
    "version": 1,
    "request_id": "0af3" * 8,
    "agent": "finance-bot",
    "tool": "pay_invoice",
    "session": "s-1",
    "verdict": "approved",
    "action_digest": "a" * 64,
    "approved_digest": "a" * 64,
    "votes": [VOTE, {**VOTE, "person": "bob", "user_id": "U0BOB", "name": "Bob Chen"}],
    "gates": [{"name": "payments", "channel": "ops-slack", "approvers": ["alice", "bob"], "quorum": 2}],
    "decided_by": {"channel": "ops-slack", "user_id": "U0BOB", "name": "Bob Chen"},
    "reason": "invoice checked against the PO",
    "policy_version": "3f2a9c0d",
    "decided_at": "2026-12-02T18:00:00.123456+00:00",
    "issued_at": "2026-12-02T18:00:00.234567+00:00",
}


def measure(rounds: int, number: int) -> dict[str, float]:
    """Median µs of each operation, timed in turn in every round."""
    key = SigningKey(Ed25519PrivateKey.generate())
    keys = {"keys": [{"kid": key.kid, "kty": "OKP", "crv": "Ed25519", "x": key.x}]}
    receipt = sign(PAYLOAD, key)
    subjects: dict[str, Callable[[], Any]] = {
        "sign a decision receipt": lambda: sign(PAYLOAD, key),
        "verify it": lambda: verify_receipt(receipt, keys),
        "of which RFC 8785 of the payload": lambda: canonical_bytes(PAYLOAD),
        "action digest of a call": lambda: action_digest(
            agent="finance-bot", tool="pay_invoice", arguments=ARGUMENTS, session="s-1", policy_version="x"
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(rounds):
        for name, fn in subjects.items():
            spent = timeit.timeit(fn, number=number, timer=time.process_time)
            times[name].append(spent / number * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receipts", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=500)
    args = parser.parse_args()
    for name, us in measure(args.rounds, args.number).items():
        print(f"{name:36} {us:8.0f} µs{'  (over 1 ms)' if us > 1000 and 'of which' not in name else ''}")


if __name__ == "__main__":
    main()
