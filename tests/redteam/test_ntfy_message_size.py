"""An ntfy notification stays within ntfy's message limit whatever the call, so its Approve
action never travels without the arguments it approves.

ntfy takes a message body of at most 4096 bytes; a longer one becomes an attachment
("You received a file: attachment.txt") on a server that keeps attachments, the actions
kept, or is refused on one that does not. The arguments' share of a notification was fixed
(3000 bytes) whatever the rest took, and the tool's line was not bounded at all: a call
whose tool name is long (an agent names its tool, up to 500 characters) and whose arguments
fill their share made a body over the limit. On a server with attachments the approver got
an Approve under a file instead of the call; here (attachments off, like the fake server)
the notification was refused and the request cancelled.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from signoff.channels import Card, argument_json
from signoff.channels.ntfy._message import MAX_MESSAGE_BYTES, render_notification
from tests.channels.fake_ntfy import FakeNtfy
from tests.channels.test_ntfy_flow import (  # noqa: F401  (fixtures)
    ALICE,
    PUBLIC,
    notified,
    ntfy,
    phone_server,
)
from tests.conftest import Server
from tests.redteam.support import ask, property_test, status

# 500 characters, 1,479 bytes in UTF-8; matches the gate "transfer_*".
LONG_TOOL = "transfer_" + "\u5b57" * 491
FULL = {"to": "acme", "amount": 10, **{f"note_{i:02}": "v" * 400 for i in range(14)}}


def _approvable_only_whole(message: dict[str, Any], arguments: dict[str, Any]) -> None:
    body = str(message["message"])
    assert len(body.encode("utf-8")) <= MAX_MESSAGE_BYTES, len(body.encode("utf-8"))
    if "Approve" in [a["label"] for a in message.get("actions", [])]:
        assert all(f"{argument_json(name)}: " in body for name in arguments), body


async def test_a_long_tool_name_does_not_push_a_notification_over_ntfys_limit(
    phone_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    ntfy: FakeNtfy,  # noqa: F811
    agent_key: str,
) -> None:
    server, http = phone_server
    answer = await ask(http, agent_key, {"tool_name": LONG_TOOL, "arguments": FULL})
    assert answer["decision"] == "pending", answer
    rid = answer["request_id"]
    [alice] = await notified(ntfy, ALICE, rid)
    _approvable_only_whole(alice.message, FULL)
    assert await status(server.runtime, rid) == "pending"


NOW = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)
ODD = st.characters(codec="utf-8", exclude_categories=("Cs",))
# Runs of one character as well as mixed text: long names and values come up often.
RUN = st.builds(lambda c, n, rest: c * n + rest, ODD, st.integers(0, 600), st.text(ODD, max_size=20))


@property_test(40)
@given(
    tool=RUN.map(lambda text: text[:500] or "t"),
    arguments=st.dictionaries(st.text(ODD, max_size=30), RUN, max_size=30),
    quorum=st.integers(1, 3),
    reason=st.booleans(),
)
def test_no_notification_is_over_the_limit_and_approvable(
    tool: str, arguments: dict[str, Any], quorum: int, reason: bool
) -> None:
    card = Card(
        request_id="0f" * 16,
        agent_id="finance-bot",
        tool_name=tool,
        arguments=arguments,
        status="pending",
        created_at=NOW,
        expires_at=NOW + timedelta(minutes=30),
        quorum=quorum,
        approvers=(),
        require_reject_reason=reason,
        console_url=f"{PUBLIC}/ui/requests/{'0f' * 16}",
    )
    notification = render_notification(
        card,
        topic=ALICE,
        callback_url=f"{PUBLIC}/callbacks/ntfy/phone",
        approve_token="A" * 180,
        reject_token="R" * 180,
        reject_page=f"{PUBLIC}/approve/{'R' * 180}",
        now=NOW,
    )
    _approvable_only_whole(notification.as_json(), arguments)
