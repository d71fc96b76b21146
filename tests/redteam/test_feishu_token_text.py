"""A Feishu channel that takes unsigned callbacks (``allow_unsigned``, no encrypt key) is
authenticated by its verification token alone, so anyone on the network can post it a
callback: one whose token (or, with the right token, whose challenge) is text no encoder can
carry — a lone surrogate, as JSON's ``\\ud800`` escape writes it — is refused like any other
bad callback (4xx), never a server error, and decides nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.channels.conftest import fake, fake_feishu_server  # noqa: F401  (fixtures)
from tests.channels.feishu_support import TOKEN, card_action
from tests.channels.test_feishu_flow import (  # noqa: F401  (fixtures)
    PLAIN,
    feishu_server,
    pending_request,
)
from tests.conftest import Server

LONE = "\ud800"


def _click(rid: str, token: str) -> dict[str, object]:
    payload = card_action(rid, open_id="ou_alice")
    payload["header"]["token"] = token
    return payload


@pytest.mark.parametrize(
    "what",
    [
        "url_verification with a lone surrogate for its token",
        "card click with a lone surrogate for its token",
        "url_verification with the token and a lone surrogate for its challenge",
    ],
)
async def test_an_unencodable_token_or_challenge_is_refused_not_a_500(
    feishu_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    what: str,
) -> None:
    _server, http = feishu_server
    rid = await pending_request(http, agent_key)
    payload: dict[str, object] = {
        "url_verification with a lone surrogate for its token": {
            "type": "url_verification",
            "token": LONE,
            "challenge": "probe",
        },
        "card click with a lone surrogate for its token": _click(rid, LONE),
        "url_verification with the token and a lone surrogate for its challenge": {
            "type": "url_verification",
            "token": TOKEN,
            "challenge": LONE,
        },
    }[what]
    answer = await http.post(
        f"/callbacks/feishu/{PLAIN}",
        content=json.dumps(payload).encode(),  # ASCII: the surrogate travels as \ud800
        headers={"content-type": "application/json"},
    )
    assert answer.status_code in (400, 401), (answer.status_code, answer.text)
    state = (await http.get(f"/v1/requests/{rid}", headers={"Authorization": f"Bearer {agent_key}"})).json()
    assert state["status"] == "pending"
    assert state["votes"] == []
