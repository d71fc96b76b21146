"""One INFO line for each event of a request's life: created, a vote, a refused vote, the
decision, the expiry. Each names the request, its agent, tool and gate, who acted and the
verdict, with secrets in any of them masked (:mod:`signoff.app.redaction`), and is logged
once the transaction that made the event has committed (never for one rolled back).

``request created id=3f0c… agent=finance-bot tool=pay_invoice gate=payments``
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.config import DEFAULT_REDACT
from signoff.app.db import on_commit
from signoff.app.redaction import redactor

__all__ = ["gate_names", "line", "log_after_commit"]

log = logging.getLogger("signoff.requests")

_WORDS = frozenset(DEFAULT_REDACT)
_QUOTED = frozenset(' \t\n\r"=')


def _value(value: object) -> str:
    text = str(redactor(_WORDS).value(str(value)))
    return json.dumps(text, ensure_ascii=False) if not text or _QUOTED.intersection(text) else text


def line(event: str, request_id: str, fields: dict[str, object | None]) -> str:
    """``event id=… key=value …``: values masked, quoted when they hold spaces, ``"`` or
    ``=``; fields that are None left out."""
    parts = [event, f"id={request_id}"]
    parts.extend(f"{k}={_value(v)}" for k, v in fields.items() if v is not None)
    return " ".join(parts)


def _log(event: str, request_id: str, fields: dict[str, object | None]) -> None:
    log.info("%s", line(event, request_id, fields))


def log_after_commit(session: AsyncSession, event: str, request_id: str, **fields: object | None) -> None:
    """Log ``event`` about ``request_id`` once ``session``'s transaction commits."""
    if log.isEnabledFor(logging.INFO):
        on_commit(session, functools.partial(_log, event, request_id, fields))


def gate_names(gate: Mapping[str, Any] | None, gates: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The names of a request's gates (its ``gates`` snapshots, else its one ``gate``), joined."""
    names = [str(g.get("name") or g.get("key") or "") for g in gates or ()]
    if not names and gate:
        names = [str(gate.get("name") or "")]
    return ",".join(n for n in names if n) or None
