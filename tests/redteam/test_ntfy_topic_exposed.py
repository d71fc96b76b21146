"""The gated agent learns an approver's ntfy topic (the secret that reads their notifications)
from its own request's API view, and with it approves its next call as that approver."""

from __future__ import annotations

import json

import httpx

from tests.channels.fake_ntfy import FakeNtfy
from tests.channels.test_ntfy_flow import (  # noqa: F401  (fixtures)
    ALICE,
    notified,
    ntfy,
    phone_server,
    pre,
    state,
    tap,
)
from tests.conftest import Server


async def test_the_agent_api_never_shows_an_approvers_ntfy_topic(
    phone_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> None:
    """On a server without access control (ntfy.sh) the topic reads its person's notifications,
    the signed Approve of the agent's next call among them: the agent never sees it, in its
    request pending or decided, nor in the decision's receipt."""
    _, http = phone_server
    first = await pre(http, agent_key, {"tool_name": "wire_money", "arguments": {"to": "acme"}})
    [alice] = await notified(ntfy, ALICE, first)
    assert (await tap(http, alice, "Approve")).status_code == 200
    pending = json.dumps(await state(http, agent_key, first))  # still pending: 1 of 2
    assert ALICE not in pending, "the gated agent reads Alice's ntfy topic from its request"
    assert '"user_id": "alice"' in pending  # named by her directory key instead
