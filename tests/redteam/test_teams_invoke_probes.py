"""Invokes Signoff must not count, through POST /callbacks/teams/{channel}: no vote, no 500."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.channels.teams_fake import FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    CHANNEL,
    ask,
    fake,
    posted,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server


def _b64(d: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()


async def test_forged_invokes_decide_nothing(
    fake: FakeBotFramework,  # noqa: F811
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    url = f"/callbacks/teams/{CHANNEL}"
    claims = fake.claims()
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = (
        fake.keys[fake.kid]
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    hs_head = _b64({"alg": "HS256", "kid": fake.kid, "typ": "JWT"}) + "." + _b64(claims)
    hs = (
        hs_head
        + "."
        + base64.urlsafe_b64encode(hmac.new(pem, hs_head.encode(), hashlib.sha256).digest())
        .rstrip(b"=")
        .decode()
    )
    none = _b64({"alg": "none", "kid": fake.kid}) + "." + _b64(claims) + "."
    now = int(time.time())
    tokens = {
        "other key, published kid": fake.sign(claims, key=other),
        "alg none": none,
        "HS256 with the public key": hs,
        "not yet valid": fake.sign({**claims, "nbf": now + 3600}),
        "expired beyond leeway": fake.sign({**claims, "exp": now - 120}),
        "no exp": fake.sign({k: v for k, v in claims.items() if k != "exp"}),
        "aud list without us": fake.sign({**claims, "aud": ["someone-else"]}),
    }
    for what, token in tokens.items():
        body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id), token=token)
        answer = await http.post(url, content=body, headers=headers)
        assert answer.status_code in (401, 403), (what, answer.status_code)

    # Valid token, bad activity.
    bad = []
    a = fake.activity(
        rid, "approve", aad=ALICE, reply_to=card_id, tenant="00000000-0000-0000-0000-000000000000"
    )
    bad.append(("other tenant", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["conversation"].pop("tenantId")
    a["channelData"]["tenant"]["id"] = "00000000-0000-0000-0000-000000000000"
    bad.append(("other tenant in channelData", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["channelId"] = "webchat"
    bad.append(("channel not endorsed", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["channelId"] = ["msteams"]
    bad.append(("unhashable channelId", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["conversation"]["id"] = None
    bad.append(("no conversation id", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["value"]["action"]["data"]["grant"] = "[1]"
    bad.append(("grant not an object", a))
    a = fake.activity(rid, "approve", aad=ALICE, reply_to=card_id)
    a["value"]["action"]["data"]["edit"] = [["amount", "number"]]
    a["value"]["action"]["data"]["edit_0"] = "1"
    bad.append(("edit", a))
    for what, activity in bad:
        body, headers = fake.invoke(activity)
        answer = await http.post(url, content=body, headers=headers)
        assert answer.status_code < 500, (what, answer.status_code)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == [], [(v.user_id, v.verdict) for v in votes]
