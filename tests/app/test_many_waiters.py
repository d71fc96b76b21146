"""Many agents parked on long-polls at once, over real HTTP: every one is woken by its own
decision, none is answered 5xx, and they share their reads of the database."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import event

from signoff.app.db import transaction
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.conftest import Server
from tests.waiting import eventually

pytestmark = pytest.mark.postgres

ON_ONE = 500
"""Waiters on one request."""
REQUESTS = 60
"""Requests with two waiters each."""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def pending(http: httpx.AsyncClient, key: str, n: int) -> str:
    r = await http.post(
        "/v1/hooks/pre-tool-use",
        json={"tool_name": "pay_x", "arguments": {"amount": 90000, "n": n}},
        headers=auth(key),
    )
    assert r.json()["decision"] == "pending", r.text
    return str(r.json()["request_id"])


class Reads:
    """Counts the statements that read requests on the runtime's read engine."""

    def __init__(self, runtime: Runtime) -> None:
        self.engine = runtime.reads.kw["bind"].sync_engine
        self.count = 0

    def _seen(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        if "FROM confirmation_request" in statement:
            self.count += 1

    def __enter__(self) -> Reads:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=0)
"""One connection per waiter, as separate agents have."""


async def park(http: httpx.AsyncClient, key: str, ids: list[str]) -> list[asyncio.Task[httpx.Response]]:
    return [
        asyncio.create_task(http.get(f"/v1/requests/{rid}/wait", params={"timeout": 60}, headers=auth(key)))
        for rid in ids
    ]


async def test_every_waiter_is_woken_by_its_own_decision(
    server: Server, runtime: Runtime, agent_key: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=90, limits=LIMITS) as http:
        one = await pending(http, agent_key, -1)
        many = [await pending(http, agent_key, n) for n in range(REQUESTS)]
        ids = [one] * ON_ONE + many + many
        verdicts = {rid: Verdict.APPROVE if n % 2 == 0 else Verdict.REJECT for n, rid in enumerate(many)}
        verdicts[one] = Verdict.APPROVE

        waiters = await park(http, agent_key, ids)
        await eventually(lambda: runtime.hub.waiting == len(ids), timeout=60)
        assert not any(w.done() for w in waiters)

        with Reads(runtime) as reads:
            for rid, verdict in verdicts.items():
                async with transaction(runtime.sessions) as s:
                    await decide(s, rid, verdict=verdict, operator="bob", config=runtime.config)
            answers = await asyncio.wait_for(asyncio.gather(*waiters), 60)

    assert [a.status_code for a in answers if a.status_code != 200] == []
    expected = {rid: "approved" if v is Verdict.APPROVE else "rejected" for rid, v in verdicts.items()}
    wrong = [
        (rid, a.json()["status"])
        for rid, a in zip(ids, answers, strict=True)
        if a.json()["status"] != expected[rid]
    ]
    assert wrong == []
    assert all(a.json()["id"] == rid for rid, a in zip(ids, answers, strict=True))
    assert runtime.hub.waiting == 0
    # The 500 woken together on one request read it once between them, not once each;
    # the others at most once per decision.
    assert reads.count <= len(verdicts) + 10, reads.count


async def test_waiters_arriving_together_share_their_first_read(
    server: Server, runtime: Runtime, agent_key: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=90, limits=LIMITS) as http:
        ids = [await pending(http, agent_key, n) for n in range(20)] * 10
        with Reads(runtime) as reads:
            waiters = await park(http, agent_key, ids)
            await eventually(lambda: runtime.hub.waiting == len(ids), timeout=60)
        assert reads.count < len(ids) // 2, reads.count
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
