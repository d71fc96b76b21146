"""The public keys receipts are signed with: anyone holding a receipt may fetch them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from signoff.app import receipt_keys
from signoff.app.deps import RuntimeDep

router = APIRouter(prefix="/v1/receipts", tags=["receipts"])


@router.get("/keys")
async def list_receipt_keys(runtime: RuntimeDep) -> dict[str, Any]:
    """Every key receipts were signed with, as a JWKS (``{"keys": [{"kid", "kty": "OKP",
    "crv": "Ed25519", "x", "not_before", "not_after"}]}``): the one in use has ``not_after``
    null; a rotated-out key verifies only receipts issued before its ``not_after``."""
    async with runtime.reads() as session:
        keys = await receipt_keys.published(session)
    if not keys["keys"]:  # nothing signed yet, and the start made no key (a read-only start)
        await receipt_keys.prepare(runtime.sessions, None)
        async with runtime.reads() as session:
            keys = await receipt_keys.published(session)
    return keys
