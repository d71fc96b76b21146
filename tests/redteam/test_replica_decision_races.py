"""Deciding one request on two ``signoff serve`` processes of one PostgreSQL database at once:
an operator rejecting through one replica while the approver's Slack button reaches the other,
with agents waiting on both. One decision is recorded, once, the audit log still verifies,
and every waiter and every replay is answered the decision recorded."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from sqlmodel import col, select

from signoff.app.audit import verify_chain
from signoff.app.db import create_engine, sessionmaker
from signoff.app.models import AuditEvent
from signoff.channels.slack import ACTION_APPROVE
from tests.app.test_replicas import fake_slack, pg, replicas  # noqa: F401  (fixtures)
from tests.channels.fake_slack import FakeSlack
from tests.channels.slack_support import button_payload, form_body, signed
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.postgres

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def posted(fake: FakeSlack, rid: str) -> None:
    for _ in range(300):
        if any(rid in json.dumps(c.args.get("blocks")) for c in fake.calls_to("chat.postMessage")):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the card of {rid} was not posted")


@pytest.mark.parametrize("rounds", [3])
async def test_an_operator_on_one_replica_and_a_click_on_the_other_make_one_decision(
    replicas: tuple[str, str, str],  # noqa: F811
    fake_slack: FakeSlack,  # noqa: F811
    pg: str,  # noqa: F811
    rounds: int,
) -> None:
    a, b, key = replicas
    agent = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60) as http:
        for n in range(rounds):
            call = {"tool_name": "pay_x", "arguments": {"n": n}, "idempotency_key": f"race-{n}"}
            rid = (await http.post(f"{a}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()[
                "request_id"
            ]
            await posted(fake_slack, rid)
            waiters = [
                asyncio.create_task(
                    http.get(f"{url}/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent)
                )
                for url in (a, b)
            ]
            await asyncio.sleep(0.3)
            payload = button_payload(ACTION_APPROVE, request_id=rid)
            payload["user"]["id"] = "W0ALICE"
            payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
            body = form_body(payload)
            api, click = await asyncio.gather(
                http.post(
                    f"{a}/v1/admin/requests/{rid}/decision",
                    json={"verdict": "reject", "operator": "alice", "reason": "no"},
                    headers=ADMIN,
                ),
                http.post(
                    f"{b}/callbacks/slack/ops-slack",
                    content=body,
                    headers=signed(body, timestamp=int(time.time())),
                ),
            )
            assert api.status_code in (200, 409), api.text
            assert click.status_code == 200, click.text
            shown = (await http.get(f"{a}/v1/requests/{rid}", headers=agent)).json()
            final = shown["status"]
            assert final in {"approved", "rejected"}
            assert (api.status_code == 200) == (final == "rejected")
            for waiter in waiters:
                waited = (await asyncio.wait_for(waiter, 40)).json()
                assert (waited["status"], waited["decided_by"]) == (final, shown["decided_by"])
            for url in (a, b):
                replay = (await http.post(f"{url}/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
                assert replay["decision"] == ("allow" if final == "approved" else "deny"), replay

    engine = create_engine(pg)
    async with sessionmaker(engine)() as s:
        moved = (
            await s.exec(
                select(AuditEvent.request_id).where(col(AuditEvent.action).in_(["approved", "rejected"]))
            )
        ).all()
        _, broken = await verify_chain(s)
    await engine.dispose()
    assert len(moved) == len(set(moved)) == rounds, moved
    assert broken is None, broken
