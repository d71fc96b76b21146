"""The ``Authorization`` header however it is spelled, and credentials that outlived what they
stood for.

A header is read by one rule on every route (FastAPI's ``HTTPBearer``: the scheme before the
first space, ``bearer`` in any case, the token after it with surrounding whitespace stripped):
the agents' hot paths (pre-tool-use, wait), which read the header themselves, agree with the
routes FastAPI answers, including for two headers (the first counts), bytes that are not ASCII,
control characters and tokens far longer than any key. Whatever the spelling, the answer is the
route's own or a 401, never a 5xx.

A key revoked (``signoff keys revoke``) stops working within the cache's bound, on every route;
an agent a reload removed keeps its key but is allowed nothing; a personal token of an operator a
reload removed decides nothing."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from signoff.app.audit import Actor
from signoff.app.db import transaction
from signoff.app.keys import CACHE_SECONDS, revoke_keys
from tests.conftest import ADMIN_TOKEN, InProcess
from tests.redteam.support import property_test
from tests.redteam.test_route_credentials import (  # noqa: F401  (fixtures)
    AGENT_A,
    AGENT_B,
    World,
    bearer,
    config,
    new_key,
    password_hashes,
    settings,
    snapshot,
    world,
    world_config,
)

pytestmark = pytest.mark.postgres

Header = list[tuple[bytes, bytes]]


def agent_calls(w: World) -> list[tuple[str, str, dict[str, object] | None]]:
    """One call of each way an agent's key is read: the hot paths and FastAPI's routes."""
    return [
        ("POST", "/v1/hooks/pre-tool-use", {"tool_name": "read_file", "arguments": {}}),
        ("GET", f"/v1/requests/{w.rid_a}/wait?timeout=0", None),
        ("GET", f"/v1/requests/{w.rid_a}", None),
        ("POST", "/v1/hooks/session-start", {}),
    ]


def fastapi_reads(value: str) -> str | None:
    """The token FastAPI's ``HTTPBearer`` reads from one header value."""
    scheme, _, token = value.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def answers(http: httpx.AsyncClient, w: World, kind: str, headers: Header) -> list[int]:
    """The status of each route of ``kind`` called with exactly ``headers``."""
    if kind == "agent":
        calls = agent_calls(w)
    elif kind == "admin":
        calls = [("GET", "/v1/admin/requests?limit=1", None), ("GET", "/v1/admin/audit/verify", None)]
    else:
        calls = [("POST", "/v1/me/requests/00000000000000000000000000000000/decision", {"verdict": "reject"})]
    found = []
    for method, url, body in calls:
        extra: Header = [(b"content-type", b"application/json")] if body is not None else []
        r = await http.request(
            method,
            url,
            content=None if body is None else httpx.Request("POST", "/", json=body).content,
            headers=headers + extra,
        )
        found.append(r.status_code)
    return found


def accepted(kind: str) -> set[int]:
    return {"agent": {200}, "admin": {200}, "personal": {404}}[kind]


SCHEMES = [b"Bearer", b"bearer", b"BEARER", b"bEaReR", b"Bearer:", b"Basic", b"Token", b"", b"Bearer\xa0"]
SEPARATORS = [b" ", b"  ", b"\t", b" \t", b"\t ", b"", b" \x00"]
AROUND = [
    b"",
    b" ",
    b"\t",
    b"\x00",
    b"\x0b",
    b"\x0c",
    b"\x1f",
    b"\x85",
    b"\xa0",
    b"\xe9",
    b"\xff",
    b"x",
    b"\r",
]


@property_test(150)
@given(
    kind=st.sampled_from(["agent", "admin", "personal"]),
    scheme=st.sampled_from(SCHEMES),
    separator=st.sampled_from(SEPARATORS),
    before=st.sampled_from(AROUND),
    after=st.sampled_from(AROUND),
    long_tail=st.sampled_from([0, 0, 0, 300, 70_000]),
)
async def test_every_route_reads_one_spelling_of_the_header_alike(
    world: World,  # noqa: F811
    kind: str,
    scheme: bytes,
    separator: bytes,
    before: bytes,
    after: bytes,
    long_tail: int,
) -> None:
    """Sent in process (no HTTP parser in between refuses a byte first), so the app itself sees
    every byte."""
    token = {"agent": world.key_a, "admin": ADMIN_TOKEN, "personal": world.personal}[kind]
    value = scheme + separator + before + token.encode() + after + b"A" * long_tail
    app = InProcess(world.runtime)
    app.app.state.console_keys = world.server.app.state.console_keys
    before_state = await snapshot(world.runtime)
    async with app, app.client() as http:
        got = await answers(http, world, kind, [(b"authorization", value)])
    assert all(s < 500 for s in got), got
    ok = fastapi_reads(value.decode("latin-1")) == token
    assert set(got) == (accepted(kind) if ok else {401}), (value[:80], got)
    if kind != "agent":
        assert await snapshot(world.runtime) == before_state


async def test_of_two_authorization_headers_the_first_counts_on_every_route(world: World) -> None:  # noqa: F811
    junk = b"Bearer sk_signoff_deadbeef_" + b"x" * 43
    app = InProcess(world.runtime)
    app.app.state.console_keys = world.server.app.state.console_keys
    async with app, app.client() as http:
        for kind, token in (("agent", world.key_a), ("admin", ADMIN_TOKEN), ("personal", world.personal)):
            good = b"Bearer " + token.encode()
            first = await answers(http, world, kind, [(b"authorization", good), (b"authorization", junk)])
            second = await answers(http, world, kind, [(b"authorization", junk), (b"authorization", good)])
            assert set(first) == accepted(kind), (kind, first)
            assert set(second) == {401}, (kind, second)
            empty_first = await answers(
                http, world, kind, [(b"authorization", b""), (b"authorization", good)]
            )
            assert set(empty_first) == {401}, (kind, empty_first)
            joined = await answers(http, world, kind, [(b"authorization", good + b", " + junk)])
            assert set(joined) == {401}, (kind, joined)
    # And through the real server (uvicorn's parser keeps both headers).
    async with httpx.AsyncClient(base_url=world.server.url, timeout=30) as http:
        good = b"Bearer " + world.key_a.encode()
        first = await answers(http, world, "agent", [(b"authorization", good), (b"authorization", junk)])
        second = await answers(http, world, "agent", [(b"authorization", junk), (b"authorization", good)])
        assert set(first) == {200}, first
        assert set(second) == {401}, second


async def test_bytes_no_http_parser_lets_through_are_refused_before_the_app(world: World) -> None:  # noqa: F811
    """Through uvicorn: a NUL, a bare CR or a line break in the header is refused by the server
    (400) or by the client before it is sent, a header past the server's limit too (400, 431);
    never a 5xx, never accepted."""
    for after in (b"\x00", b"\r", b"\n", b"\r\nX-Other: 1", b"\xe9", b"A" * 12_000, b"A" * 70_000):
        reader, writer = await asyncio.open_connection("127.0.0.1", world.server.port)
        try:
            writer.write(
                b"GET /v1/requests/" + world.rid_a.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + world.key_a.encode() + after + b"\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), 10)
        finally:
            writer.close()
        status = int(status_line.split()[1]) if status_line else 0
        refused = status in (400, 401, 431)
        assert refused or (after.startswith(b"\r\n") and status == 200), (after[:20], status_line)


async def test_a_revoked_key_stops_working_on_every_route_and_its_successor_works(world: World) -> None:  # noqa: F811
    old = await new_key(world.runtime, AGENT_A)
    new = await new_key(world.runtime, AGENT_A)
    async with httpx.AsyncClient(base_url=world.server.url, timeout=30) as http:
        for method, url, body in agent_calls(world):
            assert (await http.request(method, url, json=body, headers=bearer(old))).status_code == 200
        async with transaction(world.runtime.sessions) as session:
            assert await revoke_keys(session, key_id=old.split("_")[2], actor=Actor("test"))
        await asyncio.sleep(CACHE_SECONDS + 0.2)  # the documented bound for another process's revoke
        for method, url, body in agent_calls(world):
            refused = await http.request(method, url, json=body, headers=bearer(old))
            assert refused.status_code == 401, (url, refused.status_code)
            fresh = await http.request(method, url, json=body, headers=bearer(new))
            assert fresh.status_code == 200, (url, fresh.status_code)


async def test_credentials_of_what_a_reload_removed(
    world: World,  # noqa: F811
    password_hashes: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A reload takes agent B and the operator alice out. B's key still authenticates as B (its
    reports still count, README), but is allowed nothing and sees nothing of A's; alice's
    personal token and console session decide nothing, nor do a session signed in through the
    identity provider and its personal token once ``console.oidc`` is removed."""
    body = world_config(password_hashes)
    without = copy.deepcopy(body)
    del without["agents"][AGENT_B]
    del without["operators"]["alice"]
    del without["console"]  # sign-ins through the identity provider turned off
    path = tmp_path / "without.yaml"
    path.write_text(yaml.safe_dump(without), encoding="utf-8")
    assert (await world.runtime.reload(path)).ok
    async with httpx.AsyncClient(base_url=world.server.url, timeout=30) as http:
        call = {"tool_name": "pay_invoice", "arguments": {"amount": 5}}
        answer = await http.post("/v1/hooks/pre-tool-use", json=call, headers=bearer(world.key_b))
        assert answer.status_code == 200
        assert answer.json()["decision"] == "deny", answer.json()
        theirs = await http.get(f"/v1/requests/{world.rid_a}", headers=bearer(world.key_b))
        assert theirs.status_code == 404
        before = await snapshot(world.runtime)
        vote = await http.post(
            f"/v1/me/requests/{world.rid_a}/decision",
            json={"verdict": "approve"},
            headers=bearer(world.personal),
        )
        assert vote.status_code == 401, vote.text
        page = await http.get("/ui/", headers={"Cookie": f"signoff_session={world.session}"})
        assert page.status_code == 303
        assert page.headers["location"].startswith("/ui/login?")
        form = await http.post(
            f"/ui/requests/{world.rid_a}/decision",
            data={"verdict": "approve", "csrf_token": world.csrf},
            headers={"Cookie": f"signoff_session={world.session}"},
        )
        assert form.status_code == 303
        assert form.headers["location"].startswith("/ui/login?")
        oidc_vote = await http.post(
            f"/v1/me/requests/{world.rid_a}/decision",
            json={"verdict": "approve"},
            headers=bearer(world.oidc_personal),
        )
        assert oidc_vote.status_code == 401, oidc_vote.text
        oidc_page = await http.get("/ui/", headers={"Cookie": f"signoff_session={world.oidc_session}"})
        assert oidc_page.status_code == 303
        assert oidc_page.headers["location"].startswith("/ui/login?")
        assert await snapshot(world.runtime) == before


async def test_a_personal_token_and_a_session_cookie_each_have_one_spelling(world: World) -> None:  # noqa: F811
    """A byte that is not ASCII, or base64 padding, after the signature makes another token:
    refused, as any other change to it is (the signature library alone would skip the one and
    take the other). Whitespace around one (``\x85`` and ``\xa0`` too, as Python reads
    whitespace) is no part of it: the headers' rule, as for every credential."""
    before = await snapshot(world.runtime)
    app = InProcess(world.runtime)
    async with app, app.client() as http:
        for extra in (b"\xe9", b"\xff", b"\x85=", b"\xa0=", b"=", b"==", b"\xc3\xa9"):
            vote = await http.post(
                "/v1/me/requests/00000000000000000000000000000000/decision",
                content=b'{"verdict": "approve"}',
                headers=[
                    (b"authorization", b"Bearer " + world.personal.encode() + extra),
                    (b"content-type", b"application/json"),
                ],
            )
            assert vote.status_code == 401, (extra, vote.status_code, vote.text[:200])
            cookie = b"signoff_session=" + world.session.encode() + extra
            page = await http.get("/ui/", headers=[(b"cookie", cookie)])
            assert page.status_code == 303, (extra, page.status_code)
            assert page.headers["location"].startswith("/ui/login?"), extra
            form = await http.post(
                f"/ui/requests/{world.rid_a}/decision",
                content=f"verdict=approve&csrf_token={world.csrf}".encode(),
                headers=[(b"cookie", cookie), (b"content-type", b"application/x-www-form-urlencoded")],
            )
            assert form.status_code == 303, (extra, form.status_code)
            assert form.headers["location"].startswith("/ui/login?"), extra
        # The spellings as made still work.
        mine = await http.get("/ui/", headers=[(b"cookie", b"signoff_session=" + world.session.encode())])
        assert mine.status_code == 200
    assert await snapshot(world.runtime) == before
