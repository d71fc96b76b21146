"""What the Bot Framework's OpenID metadata and signing keys answer never turns an invoke into a
500, through POST /callbacks/teams/{channel}: a key entry that is not a key is skipped (the
others still verify), a document that cannot be read refuses with 503, and nothing counts."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.channels.teams_fake import FakeBotFramework
from tests.channels.test_teams_flow import (  # noqa: F401  (fixtures)
    ALICE,
    CHANNEL,
    ask,
    posted,
    teams_server,
    votes_and_audit,
)
from tests.conftest import Server

URL = f"/callbacks/teams/{CHANNEL}"


class GarbledKeys(FakeBotFramework):
    """Publishes :attr:`extra` entries beside its keys, or answers :attr:`raw` instead of the
    keys document or the metadata."""

    def __init__(self) -> None:
        super().__init__()
        self.extra: list[Any] = []
        self.raw_keys: bytes | None = None
        self.raw_metadata: bytes | None = None

    async def _jwks(self, request: web.Request) -> web.Response:
        if self.raw_keys is not None:
            return web.Response(body=self.raw_keys, content_type="application/json")
        answer = await super()._jwks(request)
        assert answer.body is not None
        document = json.loads(bytes(answer.body))  # type: ignore[arg-type]
        return web.json_response({"keys": [*self.extra, *document["keys"]]})

    async def _metadata(self, request: web.Request) -> web.Response:
        if self.raw_metadata is not None:
            return web.Response(body=self.raw_metadata, content_type="application/json")
        return await super()._metadata(request)


@pytest.fixture
async def fake() -> AsyncIterator[GarbledKeys]:
    fake = GarbledKeys()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


BAD_ENTRIES: list[Any] = [
    {"kty": "RSA", "use": "sig", "kid": "bad-n", "n": 1, "e": "AQAB"},
    {"kty": "RSA", "use": "sig", "kid": "bad-b64", "n": "!!", "e": "AQAB"},
    {"kty": "RSA", "use": "sig", "kid": "no-numbers"},
    {"kty": "RSA", "use": "sig", "kid": "half-private", "n": "AQAB", "e": "AQAB", "d": 1, "p": 1},
    {"kty": "RSA", "use": "sig", "kid": "list-n", "n": ["a"], "e": "AQAB"},
]


@pytest.mark.parametrize("entry", BAD_ENTRIES, ids=[e["kid"] for e in BAD_ENTRIES])
async def test_a_key_entry_that_is_no_key_is_skipped(
    fake: GarbledKeys,
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    entry: dict[str, Any],
) -> None:
    server, http = teams_server
    fake.extra = [entry]
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    body, headers = fake.invoke(fake.activity(rid, "reject", aad=ALICE, reply_to=card_id))
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 200, (answer.status_code, answer.text)
    # A token naming the broken entry's kid verifies under nothing.
    forged = fake.sign(fake.claims(), kid=fake.kid).split(".")
    head = base64.urlsafe_b64encode(
        json.dumps({"alg": "RS256", "kid": entry["kid"], "typ": "JWT"}).encode()
    ).rstrip(b"=")
    token = ".".join([head.decode(), *forged[1:]])
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id), token=token)
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 401, (answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert [v.verdict for v in votes] == ["reject"]


DOCUMENTS = {
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "nested object": b'{"keys":' * 50_000 + b"[]" + b"}" * 50_000,
    "not utf-8": b'{"keys": "\xff\xfe"}',
    "array": b"[]",
    "number": b"1e999999",
}


@pytest.mark.parametrize("document", DOCUMENTS.values(), ids=list(DOCUMENTS))
@pytest.mark.parametrize("where", ["keys", "metadata"])
async def test_an_unreadable_document_refuses_with_503(
    fake: GarbledKeys,
    teams_server: tuple[Server, httpx.AsyncClient],  # noqa: F811
    agent_key: str,
    document: bytes,
    where: str,
) -> None:
    server, http = teams_server
    rid = await ask(http, agent_key)
    [card_id] = await posted(fake)
    if where == "keys":
        fake.raw_keys = document
    else:
        fake.raw_metadata = document
    body, headers = fake.invoke(fake.activity(rid, "approve", aad=ALICE, reply_to=card_id))
    answer = await http.post(URL, content=body, headers=headers)
    assert answer.status_code == 503, (answer.status_code, answer.text)
    votes, _ = await votes_and_audit(server, rid)
    assert votes == []
