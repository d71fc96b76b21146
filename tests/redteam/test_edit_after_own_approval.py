"""An approval with changes that comes too late, from the person whose approval as asked already
decided the request (their "Edit and approve" form submitted after, or at the same moment as,
their Approve button; an operator repeating a decision with arguments): the call runs as
asked, so the edit must be refused as a conflicting decision, never answered as the same
decision again (200, the Slack modal closed as if the changes were taken)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.channels.conftest import (  # noqa: F401  (fixtures)
    _no_proxy,
    fake_slack,
    slack_server,
    slack_settings,
)
from tests.channels.fake_slack import FakeSlack
from tests.channels.slack_support import button_payload, form_body, signed
from tests.channels.test_edit_choices import (
    CALL,
    SLACK,
    open_modal,
    posted_buttons,
    pre,
    slack_gates,  # noqa: F401  (fixture: the edit gates slack_server runs)
    state,
    submission,
)
from tests.conftest import Server
from tests.redteam.support import ADMIN


def approve_click(rid: str, user: str) -> tuple[bytes, dict[str, str]]:
    from signoff.channels.slack import ACTION_APPROVE

    payload = button_payload(ACTION_APPROVE, request_id=rid)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()))


def runs_with(decided: dict[str, Any]) -> dict[str, Any]:
    """The arguments the agent runs the decided call with."""
    changes = {c["field"]: c["approved"] for c in decided.get("changes") or []}
    return {**CALL["arguments"], **changes}


async def test_an_edit_submitted_after_the_same_persons_approval_is_refused_on_the_modal(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    body, headers = approve_click(rid, "W0ALICE")
    assert (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).status_code == 200
    assert (await state(http, agent_key, rid))["status"] == "approved"

    body, headers = submission(view, "W0ALICE", {0: "40000"})
    answer = (await http.post(f"/callbacks/slack/{SLACK}", content=body, headers=headers)).json()
    decided = await state(http, agent_key, rid)
    assert runs_with(decided)["amount"] == 90000
    assert answer.get("response_action") == "errors", (
        f"the modal closed as if amount 40000 were approved; the call runs with {runs_with(decided)}"
    )


async def test_an_edit_racing_the_same_persons_approval_is_taken_or_refused(
    fake_slack: FakeSlack,  # noqa: F811
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    """Approve and the edit form's submission at once: the form closes only when its changes
    are what the call runs with."""
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    await posted_buttons(fake_slack)
    view = await open_modal(fake_slack, http, rid)
    click, click_headers = approve_click(rid, "W0ALICE")
    edit, edit_headers = submission(view, "W0ALICE", {0: "40000"})
    _, edited = await asyncio.gather(
        http.post(f"/callbacks/slack/{SLACK}", content=click, headers=click_headers),
        http.post(f"/callbacks/slack/{SLACK}", content=edit, headers=edit_headers),
    )
    decided = await state(http, agent_key, rid)
    assert decided["status"] == "approved"
    if edited.json().get("response_action") == "clear":
        assert runs_with(decided)["amount"] == 40000, decided


async def test_an_operator_repeating_an_approval_with_changes_is_told_it_conflicts(
    slack_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    _server, http = slack_server
    rid = (await pre(http, agent_key))["request_id"]
    url = f"/v1/admin/requests/{rid}/decision"
    first = await http.post(url, json={"verdict": "approve", "operator": "alice"}, headers=ADMIN)
    assert first.status_code == 200, first.text
    again = await http.post(
        url, json={"verdict": "approve", "operator": "alice", "arguments": {"amount": 40000}}, headers=ADMIN
    )
    decided = await state(http, agent_key, rid)
    assert runs_with(decided)["amount"] == 90000
    assert again.status_code == 409, (again.status_code, again.text)
    # The same decision again is still answered with the decision as it stands.
    same = await http.post(url, json={"verdict": "approve", "operator": "alice"}, headers=ADMIN)
    assert same.status_code == 200, same.text
