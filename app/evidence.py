"""Evidence packs: the signed receipts of the requests decided in a period, with every key
needed to check them offline (``signoff audit export --receipts``), and checking them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.models import ConfirmationRequest
from signoff.app.receipt_keys import published
from signoff.hooks.receipts import ReceiptInvalid, verify_receipt

__all__ = ["evidence_pack", "receipts_in", "verify_all"]


async def evidence_pack(
    session: AsyncSession, *, since: datetime | None = None, until: datetime | None = None
) -> dict[str, Any]:
    """``{"keys": JWKS, "since", "until", "receipts": [{request_id, receipt, execution_receipt}]}``
    for the requests decided in ``[since, until)``, oldest first."""
    stmt = select(
        ConfirmationRequest.id, ConfirmationRequest.receipt, ConfirmationRequest.execution_receipt
    ).where(col(ConfirmationRequest.decided_at).is_not(None))
    if since is not None:
        stmt = stmt.where(col(ConfirmationRequest.decided_at) >= since)
    if until is not None:
        stmt = stmt.where(col(ConfirmationRequest.decided_at) < until)
    rows = (await session.exec(stmt.order_by(col(ConfirmationRequest.decided_at)))).all()
    return {
        "keys": (await published(session))["keys"],
        "since": since.isoformat() if since else None,
        "until": until.isoformat() if until else None,
        "receipts": [
            {"request_id": rid, "receipt": receipt, "execution_receipt": executed}
            for rid, receipt, executed in rows
        ],
    }


def receipts_in(value: Any) -> Iterator[tuple[str, Mapping[str, Any] | None]]:
    """Every receipt in ``value``, named: a receipt, a request record (its ``receipt`` and
    ``execution_receipt``) or an evidence pack (each of its records)."""
    if isinstance(value, Mapping) and "payload" in value:
        yield "receipt", value
        return
    records = value.get("receipts") if isinstance(value, Mapping) and "receipts" in value else [value]
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, Mapping):
            continue
        name = record.get("request_id") or record.get("id") or "?"
        yield f"request {name}", record.get("receipt")
        if record.get("execution_receipt") is not None:
            yield f"request {name} (execution)", record["execution_receipt"]


def verify_all(value: Any, keys: Any) -> tuple[int, list[str]]:
    """Check every receipt in ``value`` with ``keys``: how many verified, and each problem."""
    good, problems = 0, []
    for name, receipt in receipts_in(value):
        if receipt is None:
            problems.append(f"{name}: no receipt")
            continue
        try:
            verify_receipt(receipt, keys)
        except ReceiptInvalid as exc:
            problems.append(f"{name}: {exc}")
        else:
            good += 1
    return good, problems
