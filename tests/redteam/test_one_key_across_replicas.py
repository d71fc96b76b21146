"""One idempotency key, one call, across two ``signoff serve`` processes of one PostgreSQL
database: first asks racing under a new key on both replicas, half of them for another call,
make one request for one call; once approved only that call is allowed, and once it is
reported executed on one replica, no replay on either is allowed."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.app.test_replicas import fake_slack, pg, replicas  # noqa: F401  (fixtures)
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.postgres

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_first_asks_racing_under_one_key_on_two_replicas_make_one_request_for_one_call(
    replicas: tuple[str, str, str],  # noqa: F811
) -> None:
    a, b, token = replicas
    agent = {"Authorization": f"Bearer {token}"}
    key = f"race-{uuid.uuid4().hex}"
    calls = [{"tool_name": "pay_x", "arguments": {"n": n}, "idempotency_key": key} for n in (1, 2)]
    urls = (a, b)

    async def ask_all(http: httpx.AsyncClient) -> list[tuple[int, str, str | None]]:
        rs = await asyncio.gather(
            *(
                http.post(f"{urls[i % 2]}/v1/hooks/pre-tool-use", json=calls[(i // 2) % 2], headers=agent)
                for i in range(16)
            )
        )
        return [
            (calls[(i // 2) % 2]["arguments"]["n"], r.json()["decision"], r.json().get("request_id"))
            for i, r in enumerate(rs)
        ]

    async with httpx.AsyncClient(timeout=60) as http:
        first = await ask_all(http)
        assert {d for _, d, _ in first} <= {"pending", "deny"}, first
        waiting = {(n, rid) for n, d, rid in first if d == "pending"}
        assert len(waiting) == 1, first
        ((own, rid),) = waiting
        d = await http.post(
            f"{a}/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers=ADMIN,
        )
        assert d.status_code == 200, d.text
        replays = await ask_all(http)
        assert {n for n, d, _ in replays if d == "allow"} == {own}, replays
        call = calls[own - 1]
        ran = await http.post(f"{b}/v1/hooks/post-tool-use", json={**call, "result": "ok"}, headers=agent)
        assert ran.status_code == 200, ran.text
        after = await ask_all(http)
        assert {d for _, d, _ in after} == {"deny"}, after


async def test_a_cancel_on_one_replica_racing_an_approval_on_the_other_has_one_outcome(
    replicas: tuple[str, str, str],  # noqa: F811
) -> None:
    a, b, token = replicas
    agent = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=60) as http:
        for n in range(4):
            call = {
                "tool_name": "pay_x",
                "arguments": {"n": n},
                "idempotency_key": f"cancel-{uuid.uuid4().hex}",
            }
            rid = (await http.post(f"{a}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()[
                "request_id"
            ]
            urls = (a, b) if n % 2 else (b, a)
            cancel, approve = await asyncio.gather(
                http.post(f"{urls[0]}/v1/requests/{rid}/cancel", headers=agent),
                http.post(
                    f"{urls[1]}/v1/admin/requests/{rid}/decision",
                    json={"verdict": "approve", "operator": "alice"},
                    headers=ADMIN,
                ),
            )
            # One wins; the other is told the request is already decided (409 or 410).
            assert {cancel.status_code, approve.status_code} & {200} == {200}, (cancel.text, approve.text)
            assert (cancel.status_code == 200) != (approve.status_code == 200), (
                cancel.text,
                approve.text,
            )
            assert {cancel.status_code, approve.status_code} - {200} <= {409, 410}
            final = "cancelled" if cancel.status_code == 200 else "approved"
            replays = await asyncio.gather(
                *(
                    http.post(f"{(a, b)[i % 2]}/v1/hooks/pre-tool-use", json=call, headers=agent)
                    for i in range(8)
                )
            )
            expected = "allow" if final == "approved" else "deny"
            assert {r.json()["decision"] for r in replays} == {expected}, [r.text for r in replays]
            for url in (a, b):
                shown = (await http.get(f"{url}/v1/requests/{rid}/wait", headers=agent)).json()
                assert shown["status"] == final
