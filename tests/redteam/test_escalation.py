"""An escalation approver decides only from the escalation's time, and never their own call,
through the operator API."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import age, attack_config, decide, pending, status


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


def deploy() -> dict[str, Any]:
    return {
        "tool_name": "deploy_prod",
        "arguments": {"ref": "v1"},
        "user_id": "U_CAROL",
        "session_id": "s-9",
        "idempotency_key": f"deploy-{uuid.uuid4().hex}",
    }


async def test_an_escalation_approver_cannot_decide_through_the_operator_api_before_their_time(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    call = {**deploy(), "user_id": "U_BOB"}
    rid = await pending(http, agent_key, call)
    r = await decide(http, rid, operator="carol")
    assert r.status_code in (403, 409, 422), r.text
    assert await status(runtime, rid) == "pending"
    await age(runtime, rid, timedelta(minutes=11))
    assert (await decide(http, rid, operator="carol")).status_code == 200


async def test_the_requester_cannot_approve_their_own_call_once_it_escalates_to_them(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    rid = await pending(http, agent_key, deploy())
    await age(runtime, rid, timedelta(minutes=11))
    for operator in ("carol", "Carol", "CAROL"):
        r = await decide(http, rid, operator=operator)
        assert r.status_code in (403, 409, 422), r.text
    assert await status(runtime, rid) == "pending"
