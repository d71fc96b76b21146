"""The gated agent learns an approver's ntfy topic (the secret that reads their notifications)
from its own request's API view, and with it approves its next call as that approver."""

from __future__ import annotations

import base64
import json

import httpx

from tests.channels.fake_ntfy import FakeNtfy
from tests.channels.test_ntfy_flow import (  # noqa: F401  (fixtures)
    ALICE,
    PUBLIC,
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


def _decoded(token: str) -> str:
    payload = token.split(".")[0]
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()


async def test_an_actions_token_and_the_reject_pages_address_never_carry_the_topic(
    phone_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> None:
    """The Reject… page's address (browser history, a proxy's log) and the actions' tokens
    name the recipient sealed: none of them reads as the topic, and they still decide as her."""
    _, http = phone_server
    wire = await pre(http, agent_key, {"tool_name": "wire_money", "arguments": {"to": "acme"}})
    transfer = await pre(http, agent_key)
    [on_wire] = await notified(ntfy, ALICE, wire)
    [on_transfer] = await notified(ntfy, ALICE, transfer)
    page = on_wire.action("Reject…")["url"]
    tokens = [page.rsplit("/", 1)[1], on_wire.action("Approve")["body"]]
    tokens += [on_transfer.action("Approve")["body"], on_transfer.action("Reject")["body"]]
    for token in tokens:
        assert ALICE not in token
        assert ALICE not in _decoded(token), "a token reads as Alice's topic"
    shown = await http.get(page.removeprefix(PUBLIC))
    assert shown.status_code == 200
    assert ALICE not in shown.text
    assert (await tap(http, on_transfer, "Reject")).status_code == 200
    decided = await state(http, agent_key, transfer)
    assert decided["status"] == "rejected"
    assert [v["user_id"] for v in decided["votes"]] == ["alice"]
