"""Every console form that changes something, sent without its own session's CSRF token:
none, an empty one, one from another visitor's session, one from another operator's session,
one from this browser's session before it signed in, the right one in a JSON body or a query
string, and the form's URL opened with GET or HEAD. Each is refused, the audit log gains
nothing, and the request stays pending."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlmodel import col, func, select

from signoff.app.models import AuditEvent
from signoff.app.runtime import Runtime
from tests.conftest import Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    Agent,
    Console,
    agent,
    config,
    console,
    console_server,
    csrf_of,
    password_hashes,
    settings,
)
from tests.console.test_console_http import status_of

FORMS: list[tuple[str, dict[str, str]]] = [
    ("/ui/requests/{rid}/decision", {"verdict": "approve"}),
    ("/ui/requests/{rid}/decision", {"verdict": "reject", "reason": "no"}),
    ("/ui/grants/{rid}/revoke", {}),
    ("/ui/tokens", {"days": "90"}),
    ("/ui/tokens/revoke", {"token": "sop_x"}),
    ("/ui/tokens/{rid}/revoke", {}),
    ("/ui/switches/read_only", {"on": "1"}),
    ("/ui/logout", {}),
]


async def _events(runtime: Runtime) -> int:
    async with runtime.reads() as s:
        return int((await s.exec(select(func.count(col(AuditEvent.seq))))).one())


@pytest.mark.postgres
async def test_no_console_form_acts_without_its_own_sessions_token(
    console: Console,  # noqa: F811
    console_server: Server,  # noqa: F811
    agent: Agent,  # noqa: F811
    runtime: Runtime,
) -> None:
    before_sign_in = csrf_of((await console.get("/ui/login")).text)
    assert (await console.sign_in("alice")).status_code == 303
    own = csrf_of((await console.get("/ui/tokens")).text)
    others: dict[str, str] = {}
    for who in ("bob", None):
        stranger = Console(console_server.url)
        try:
            if who is not None:
                assert (await stranger.sign_in(who)).status_code == 303
                others[who] = csrf_of((await stranger.get("/ui/tokens")).text)
            else:
                others["visitor"] = csrf_of((await stranger.get("/ui/login")).text)
        finally:
            await stranger.aclose()
    rid = await agent.ask()
    events = await _events(runtime)
    forged: list[str | None] = [None, "", before_sign_in, *others.values(), own.upper()]
    for path, fields in FORMS:
        url = path.format(rid=rid)
        for token in forged:
            data: dict[str, Any] = dict(fields)
            if token is not None:
                data["csrf_token"] = token
            r = await console.client.post(url, data=data)
            assert r.status_code == 403, (url, token, r.status_code)
        as_json = await console.client.post(
            url,
            content=json.dumps({**fields, "csrf_token": own}),
            headers={"content-type": "application/json"},
        )
        in_query = await console.client.post(url, params={"csrf_token": own}, data=fields)
        assert (as_json.status_code, in_query.status_code) == (403, 403), url
        for method in ("GET", "HEAD"):
            r = await console.client.request(method, url, params={**fields, "csrf_token": own})
            # 405, or the page a form lives on (/ui/tokens), which only shows it.
            assert r.status_code in ((200, 405) if url == "/ui/tokens" else (405,)), (method, url)
    assert await _events(runtime) == events, "a refused form left a trace of acting"
    assert await status_of(runtime, rid) == "pending"
    assert (await console.get("/ui/")).status_code == 200, "still signed in"
