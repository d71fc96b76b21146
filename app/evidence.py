"""Evidence packs: the signed receipts of the requests decided in a period, with every key
needed to check them offline (``signoff audit export --receipts``), and checking them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.models import ConfirmationRequest
from signoff.app.receipt_keys import published
from signoff.hooks.receipts import ReceiptInvalid, receipt_digest, verify_receipt

__all__ = ["Filed", "evidence_pack", "receipts_in", "verify_all"]


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


@dataclass(frozen=True, slots=True)
class Filed:
    """A receipt as a file holds it: named, and where a record holds it, what it must be."""

    name: str
    receipt: Mapping[str, Any] | None
    kind: str | None = None
    """``decision`` or ``execution``: the record's slot it is in (None: a bare receipt)."""
    request_id: str | None = None
    """The record's request."""
    decision: Mapping[str, Any] | None = None
    """For an execution receipt, its record's decision receipt."""


def receipts_in(value: Any) -> Iterator[Filed]:
    """Every receipt in ``value``: a receipt, a request record (its ``receipt`` and
    ``execution_receipt``) or an evidence pack (each of its records)."""
    if isinstance(value, Mapping) and "payload" in value:
        yield Filed("receipt", value)
        return
    records = value.get("receipts") if isinstance(value, Mapping) and "receipts" in value else [value]
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, Mapping):
            continue
        rid = record.get("request_id") or record.get("id")
        rid = rid if isinstance(rid, str) else None
        name = f"request {rid or '?'}"
        decision = record.get("receipt")
        yield Filed(name, decision, "decision", rid)
        if record.get("execution_receipt") is not None:
            yield Filed(
                f"{name} (execution)",
                record["execution_receipt"],
                "execution",
                rid,
                decision if isinstance(decision, Mapping) else None,
            )


def _misfiled(filed: Filed, payload: Mapping[str, Any]) -> str | None:
    """What is wrong with a valid receipt where it is filed: another kind, another request's,
    or an execution that follows another decision receipt than its record's."""
    if filed.kind is not None and payload.get("kind") != filed.kind:
        return f"it is a {payload.get('kind')} receipt, filed as the {filed.kind} receipt"
    if filed.request_id is not None and payload.get("request_id") != filed.request_id:
        return f"it is the receipt of request {payload.get('request_id')}"
    if filed.kind == "execution" and filed.decision is not None:
        try:
            follows = receipt_digest(filed.decision)
        except ValueError:
            follows = None
        if payload.get("decision_receipt") != follows:
            return "it follows another decision receipt than its request's"
    return None


def verify_all(value: Any, keys: Any) -> tuple[int, list[str]]:
    """Check every receipt in ``value`` with ``keys``, and that each record holds its own
    request's receipts: how many verified, and each problem."""
    good, problems = 0, []
    for filed in receipts_in(value):
        if filed.receipt is None:
            problems.append(f"{filed.name}: no receipt")
            continue
        try:
            payload = verify_receipt(filed.receipt, keys)
        except ReceiptInvalid as exc:
            problems.append(f"{filed.name}: {exc}")
            continue
        if (wrong := _misfiled(filed, payload)) is not None:
            problems.append(f"{filed.name}: {wrong}")
        else:
            good += 1
    return good, problems
