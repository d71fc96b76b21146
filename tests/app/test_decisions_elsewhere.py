"""Decisions committed by other processes (the command line, other replicas) are counted and
logged once by ``Runtime.observe_decisions``; a decision of this process is counted and logged
by its own commit. The read of recent decisions can see a row of this process's own before
the task that committed it has run its after-commit work (a commit synced on SQLite's worker
thread is visible to other connections first), so it leaves decisions younger than a second
to its next run: a row committed without this process's after-commit work is not logged "by
another process" until then (tests/app/test_activity.py runs the whole server)."""

from __future__ import annotations

import logging
from datetime import datetime

import pytest
import sqlalchemy as sa
import time_machine

from signoff.app.db import transaction
from signoff.app.models import Status, utcnow
from signoff.app.runtime import Runtime
from tests.app.factories import make_request


async def _pending(runtime: Runtime) -> str:
    async with transaction(runtime.sessions) as session:
        req = await make_request(session, runtime.config)
    return req.id


async def _decided_as_elsewhere(runtime: Runtime, request_id: str, at: datetime) -> None:
    """The request expired by a commit that ran none of this process's after-commit work."""
    async with transaction(runtime.sessions) as session:
        await session.exec(  # type: ignore[call-overload]
            sa.text("UPDATE confirmation_request SET status = :s, decided_at = :at WHERE id = :id"),
            params={"s": Status.EXPIRED.value, "at": at.replace(tzinfo=None), "id": request_id},
        )


def _lines(caplog: pytest.LogCaptureFixture, request_id: str) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.requests"]
    return [line for line in said if f"id={request_id}" in line]


async def test_a_decision_of_another_process_is_logged_once_it_has_settled(
    runtime: Runtime, caplog: pytest.LogCaptureFixture, clock: time_machine.Traveller
) -> None:
    caplog.set_level(logging.INFO, logger="signoff.requests")
    rid = await _pending(runtime)
    await _decided_as_elsewhere(runtime, rid, utcnow())
    await runtime.observe_decisions()
    assert [ln for ln in _lines(caplog, rid) if "expired" in ln] == [], "too young: maybe this process's own"
    clock.shift(2)
    await runtime.observe_decisions()
    await runtime.observe_decisions()
    (line,) = [ln for ln in _lines(caplog, rid) if "expired" in ln]
    assert line.startswith(f"request expired id={rid} ")
    assert line.endswith('by="another process"')
