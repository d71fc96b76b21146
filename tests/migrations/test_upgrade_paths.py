"""Every database the main line ever left upgrades to head and serves its old requests.

For each state a release left a database at (``released.STATES``, from 0001 as first
released), on SQLite and PostgreSQL: rows as that release wrote them, the upgrade
``signoff db upgrade`` runs, then through the HTTP API the old key authenticates, the old
requests read, the approved one replays to an allow, the pending one takes its second vote,
wakes its waiter and replays, and a new call makes a new request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.db import head_revision, migrate
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from tests.conftest import ADMIN_TOKEN, Server
from tests.migrations import released
from tests.migrations.released import APPROVED, APPROVED_CALL, PENDING, PENDING_CALL, STATES, TOKEN

AGENT = {"Authorization": f"Bearer {TOKEN}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

pytestmark = pytest.mark.postgres  # migrations: both databases


def _call(call: tuple[str, dict[str, object]], key: str) -> dict[str, object]:
    return {"tool_name": call[0], "arguments": call[1], "idempotency_key": key}


async def _ask(http: httpx.AsyncClient, call: tuple[str, dict[str, object]], key: str) -> dict[str, str]:
    answer = await http.post("/v1/hooks/pre-tool-use", json=_call(call, key), headers=AGENT)
    assert answer.status_code == 200, answer.text
    body: dict[str, str] = answer.json()
    return body


@pytest.mark.parametrize("state", STATES)
async def test_a_database_left_at_any_release_upgrades_and_serves(
    state: str, empty_url: str, tmp_path: Path, config: SignoffConfig
) -> None:
    await asyncio.to_thread(released.make_database, empty_url, state, tmp_path)
    await asyncio.to_thread(released.write_rows, empty_url)
    assert await asyncio.to_thread(migrate, empty_url) == head_revision()

    runtime = Runtime.create(Settings(database_url=empty_url, admin_token=ADMIN_TOKEN), config)  # type: ignore[arg-type]
    try:
        async with Server(runtime) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            pending = await http.get(f"/v1/requests/{PENDING}", headers=AGENT)
            assert pending.status_code == 200, pending.text
            assert pending.json()["status"] == "pending"
            assert [(g["name"], g["approvals"], g["quorum"]) for g in pending.json()["gates"]] == [
                ("two-person", 1, 2)
            ]
            approved = await http.get(f"/v1/requests/{APPROVED}", headers=AGENT)
            assert approved.json()["status"] == "approved", approved.text

            replay = await _ask(http, APPROVED_CALL, "approved-key")
            assert (replay["decision"], replay["request_id"]) == ("allow", APPROVED), replay

            waiter = asyncio.create_task(
                http.get(f"/v1/requests/{PENDING}/wait", params={"timeout": 20}, headers=AGENT)
            )
            again = await http.post(
                f"/v1/admin/requests/{PENDING}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=ADMIN,
            )
            # The same decision again stands as it was (the callback contract): counted once.
            assert again.status_code == 200, again.text
            assert (again.json()["status"], again.json()["approvals"]) == ("pending", 1)
            bob = await http.post(
                f"/v1/admin/requests/{PENDING}/decision",
                json={"verdict": "approve", "operator": "bob"},
                headers=ADMIN,
            )
            assert bob.json()["status"] == "approved", bob.text
            assert (await asyncio.wait_for(waiter, 20)).json()["status"] == "approved"
            replay = await _ask(http, PENDING_CALL, "pending-key")
            assert (replay["decision"], replay["request_id"]) == ("allow", PENDING), replay

            # A different call under an old key is still refused: the old rows carry their digest.
            other = await _ask(http, ("pay_invoice", {"amount": 70000}), "approved-key")
            assert other["decision"] == "deny"
            assert "different call" in other["reason"]

            assert (await _ask(http, APPROVED_CALL, "new-key"))["decision"] == "pending"
    finally:
        await runtime.aclose()
