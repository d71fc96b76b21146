"""Bulk rows for the benchmarks, written straight into a migrated database with SQLAlchemy Core."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from signoff.app.db import create_engine
from signoff.app.models import ConfirmationRequest, Delivery, utcnow

GATE = {
    # The key of bench._server.CONFIG's gate: an approval counts only where the gate as
    # configured now takes it, and the gate is found by its key.
    "key": "confirmation_gate[pay_*]",
    "name": "pay_*",
    "approvers": ["alice"],
    "quorum": 1,
    "allow_self_approval": False,
    "require_reject_reason": False,
    "timeout_seconds": 86400.0,
}


def insert_pending(database_url: str, count: int, *, batch: int = 5000, ttl_hours: float = 24) -> list[str]:
    """``count`` pending requests of ``bench-agent``, each with its card already posted (as after
    a restart in normal operation). Returns their ids."""
    return asyncio.run(_insert_pending(database_url, count, batch, ttl_hours))


async def _insert_pending(database_url: str, count: int, batch: int, ttl_hours: float) -> list[str]:
    engine = create_engine(database_url)
    now = utcnow()
    expires = now + timedelta(hours=ttl_hours)
    ids = [uuid.uuid4().hex for _ in range(count)]
    requests = ConfirmationRequest.__table__  # type: ignore[attr-defined]
    deliveries = Delivery.__table__  # type: ignore[attr-defined]
    try:
        for start in range(0, count, batch):
            chunk = ids[start : start + batch]
            async with engine.begin() as conn:
                await conn.execute(
                    requests.insert(),
                    [
                        {
                            "id": rid,
                            "agent_id": "bench-agent",
                            "tool_name": "pay_invoice",
                            "arguments": {"amount": 120000, "to": "ACME GmbH", "n": start + i},
                            "user_id": None,
                            "session_id": "bench",
                            "tool_call_id": None,
                            "idempotency_key": f"bulk-{rid}",
                            "call_digest": "0" * 64,
                            "request_metadata": {},
                            "gate": GATE,
                            "channel": "web",
                            "requester": None,
                            "status": "pending",
                            "created_at": now,
                            "expires_at": expires,
                        }
                        for i, rid in enumerate(chunk)
                    ],
                )
                await conn.execute(
                    deliveries.insert(),
                    [
                        {
                            "request_id": rid,
                            "channel": "web",
                            "kind": "post",
                            "status": "sent",
                            "attempts": 1,
                            "next_attempt_at": now,
                            "message_ref": {"request_id": rid},
                            "created_at": now,
                            "sent_at": now,
                        }
                        for rid in chunk
                    ],
                )
    finally:
        await engine.dispose()
    return ids
