"""Every route the app serves, tried with every credential Signoff knows (two agents' keys, a
revoked and an unknown key, the admin token, a personal token, a console session cookie, each
also where it does not belong: in a cookie, as a bearer token, in the query string), on a real
server and a database built by the migrations.

The contract: a route answers its own credential and nobody else's. The agent API answers an
agent's key (another agent's request is 404, worded as for an id nobody has), the operator API
the admin token, ``/v1/me`` a personal token, the console its session cookie; anything else is
401 (the console: to the sign-in page), never a 5xx, and changes nothing. Callbacks and email
links are authenticated by their own signatures, whatever else a caller sends; ops, receipts'
keys and the API docs answer anyone alike and show no secret, argument or request id. The
table of routes is checked against the app's own: a new route fails here until it is placed."""

from __future__ import annotations

import base64
import copy
import html
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa
import yaml
from fastapi import FastAPI
from hypothesis import assume, given
from hypothesis import strategies as st

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key, revoke_keys
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, InProcess, Server
from tests.console.conftest import (  # noqa: F401  (fixtures)
    SESSION_SECRET,
    Console,
    csrf_of,
    operators,
    password_hashes,
)
from tests.redteam.support import property_test

pytestmark = pytest.mark.postgres

SLACK_SECRET = "matrix-slack-signing-secret-0123"
SENTINEL = "sentinel-argument-7f3a9c"
"""An argument value no unauthenticated answer may show."""
AGENT_A, AGENT_B = "finance-bot", "other-bot"
OIDC_ISSUER = "http://127.0.0.1:9"


def _gate(name: str, tools: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": "confirmation_gate",
        "name": name,
        "tools": [tools],
        "channel": "chat",
        "approvers": ["alice", "bob"],
        "timeout": "30m",
        **extra,
    }


def world_config(hashes: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(DEFAULT_CONFIG)
    body["channels"]["ops-slack"] = {
        "type": "slack",
        "bot_token": "xoxb-matrix",
        "signing_secret": SLACK_SECRET,
        "channel": "C0MATRIX",
    }
    body["agents"][AGENT_A]["hooks"].append(
        _gate("transfers", "transfer_*", grants=[{"scope": "agent", "for": "1h"}])
    )
    body["agents"][AGENT_B]["hooks"] = [_gate("b-payments", "pay_*"), _gate("b-transfers", "transfer_*")]
    body["operators"] = operators(hashes)
    # Nothing listens there: the console's sign-ins through it are made here (see oidc_session).
    body["console"] = {
        "oidc": {"issuer": OIDC_ISSUER, "client_id": "signoff-matrix", "client_secret": "x" * 24}
    }
    return body


@pytest.fixture
def config(password_hashes: dict[str, str]) -> SignoffConfig:  # noqa: F811
    return parse_config(world_config(password_hashes), source="matrix.yaml")


@pytest.fixture
def settings(db_url: str, password_hashes: dict[str, str], tmp_path: Path) -> Settings:  # noqa: F811
    """With ``SIGNOFF_CONFIG`` naming the same configuration: the operator API's reload keeps it."""
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(world_config(password_hashes)), encoding="utf-8")
    return Settings(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,  # type: ignore[arg-type]
        session_secret=SESSION_SECRET,  # type: ignore[arg-type]
        config=path,
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def new_key(runtime: Runtime, agent: str) -> str:
    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, agent, actor=Actor("test"))
    return token


@dataclass
class World:
    server: Server
    key_a: str
    key_b: str
    revoked: str
    session: str
    csrf: str
    """The session's CSRF token: sent with every console form, whatever the credential."""
    personal: str
    rid_a: str
    rid_b: str
    grant: str
    oidc_session: str
    """A console session signed in through the identity provider, of someone no operator entry
    names (dave@example.org)."""
    oidc_csrf: str
    oidc_personal: str
    headers: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def runtime(self) -> Runtime:
        return self.server.runtime

    def client(self) -> httpx.AsyncClient:
        """A client without a cookie jar: each call carries exactly the credential it is given."""
        return httpx.AsyncClient(
            base_url=self.server.url, timeout=30, trust_env=False, follow_redirects=False
        )


async def ask(http: httpx.AsyncClient, key: str, tool: str, **arguments: Any) -> dict[str, Any]:
    call = {
        "tool_name": tool,
        "arguments": arguments,
        "session_id": "s-matrix",
        "idempotency_key": uuid.uuid4().hex,
    }
    r = await http.post("/v1/hooks/pre-tool-use", json=call, headers=bearer(key))
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    answer["call"] = call
    return answer


def oidc_session(server: Server, config: SignoffConfig) -> str:
    """The session cookie the console gives dave@example.org once the provider has signed him
    in, confirmed now (the callback's own, made with the server's keys)."""
    from signoff.app.console import auth
    from signoff.app.console import oidc as console_oidc

    settings = config.console.oidc
    assert settings is not None
    claims = console_oidc.Claims(
        issuer=OIDC_ISSUER,
        subject="dave-subject",
        username="dave@example.org",
        email="dave@example.org",
        email_verified=True,
        checked=time.time(),
    )
    keys: auth.Keys = server.app.state.console_keys
    session = auth.ConsoleSession.start(
        3600,
        operator=claims.username,
        fingerprint=console_oidc.fingerprint(settings),
        person=claims.as_dict(),
    )
    return keys.encode(session)


async def personal_token(console: Console) -> str:
    page = await console.get("/ui/tokens")
    made = await console.client.post("/ui/tokens", data={"csrf_token": csrf_of(page.text), "days": "7"})
    assert made.status_code == 200, made.text
    return html.unescape(made.text.split('<pre id="new-token"><code>')[1].split("</code>")[0])


@pytest.fixture
async def world(runtime: Runtime) -> AsyncIterator[World]:
    async with Server(runtime) as server:
        key_a, key_b, revoked = (
            await new_key(runtime, AGENT_A),
            await new_key(runtime, AGENT_B),
            await new_key(runtime, AGENT_A),
        )
        async with transaction(runtime.sessions) as session:
            assert await revoke_keys(session, key_id=revoked.split("_")[2], actor=Actor("test"))
        runtime.keys.forget()
        console = Console(server.url)
        try:
            assert (await console.sign_in("alice")).status_code == 303
            session_cookie = console.client.cookies["signoff_session"]
            csrf = await console.form_token("/ui/tokens")
            personal = await personal_token(console)
        finally:
            await console.aclose()
        oidc_cookie = oidc_session(server, runtime.config)
        oidc = Console(server.url)
        try:
            oidc.client.cookies.set("signoff_session", oidc_cookie, path="/ui")
            oidc_csrf = await oidc.form_token("/ui/tokens")
            oidc_personal = await personal_token(oidc)
        finally:
            await oidc.aclose()
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            a = await ask(http, key_a, "pay_invoice", amount=90000, memo=SENTINEL)
            b = await ask(http, key_b, "pay_invoice", amount=90000, memo=SENTINEL)
            assert a["decision"] == b["decision"] == "pending", (a, b)
            t = await ask(http, key_a, "transfer_funds", to="acme")
            approved = await http.post(
                f"/v1/admin/requests/{t['request_id']}/decision",
                json={"verdict": "approve", "operator": "alice", "grant": {"scope": "agent", "for": "1h"}},
                headers=bearer(ADMIN_TOKEN),
            )
            assert approved.status_code == 200, approved.text
            grants = (await http.get("/v1/admin/grants", headers=bearer(ADMIN_TOKEN))).json()
        w = World(
            server,
            key_a,
            key_b,
            revoked,
            session_cookie,
            csrf,
            personal,
            a["request_id"],
            b["request_id"],
            grants[0]["id"],
            oidc_cookie,
            oidc_csrf,
            oidc_personal,
        )
        w.headers = credentials(w)
        yield w


def credentials(w: World) -> dict[str, dict[str, str]]:
    """Every credential, and each where it does not belong."""
    basic = base64.b64encode(f"admin:{ADMIN_TOKEN}".encode()).decode()
    return {
        "none": {},
        "agent A": bearer(w.key_a),
        "agent B": bearer(w.key_b),
        "revoked key": bearer(w.revoked),
        "unknown key": bearer("sk_signoff_deadbeef_" + "x" * 43),
        "admin token": bearer(ADMIN_TOKEN),
        "personal token": bearer(w.personal),
        "session cookie": {"Cookie": f"signoff_session={w.session}"},
        "OIDC session": {"Cookie": f"signoff_session={w.oidc_session}"},
        "OIDC personal token": bearer(w.oidc_personal),
        "OIDC session as bearer": bearer(w.oidc_session),
        "OIDC personal token as cookie": {"Cookie": f"signoff_session={w.oidc_personal}"},
        "session as bearer": bearer(w.session),
        "personal token as cookie": {"Cookie": f"signoff_session={w.personal}"},
        "admin token as cookie": {"Cookie": f"signoff_session={ADMIN_TOKEN}"},
        "agent key as cookie": {"Cookie": f"signoff_session={w.key_a}"},
        "admin token, Basic": {"Authorization": f"Basic {basic}"},
        "admin token, no scheme": {"Authorization": ADMIN_TOKEN},
        "agent key, no scheme": {"Authorization": w.key_a},
    }


OWN = {
    "agent": {"agent A", "agent B"},
    "admin": {"admin token"},
    "personal": {"personal token", "OIDC personal token"},
    "console": {"session cookie", "OIDC session"},
}
"""The credentials each guarded kind of route answers."""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """As the app declares it; ``{…}`` filled from the world."""
    guard: str
    """agent, admin, personal, console; or public (anyone alike), signed (callbacks and email
    links: their own signatures), sign-in (the console's way in)."""
    json: Any = None
    form: dict[str, str] | None = None
    url: str | None = None
    """What is requested when it differs from ``path`` (a mount)."""


PRE_BODY = {"tool_name": "read_file", "arguments": {"path": "/etc/hosts"}}
ROUTES = [
    Route("POST", "/v1/hooks/pre-tool-use", "agent", json=PRE_BODY),
    Route("POST", "/v1/hooks/post-tool-use", "agent", json={**PRE_BODY, "result": "ok"}),
    Route("POST", "/v1/hooks/session-start", "agent", json={}),
    Route("GET", "/v1/requests/{request_id}", "agent"),
    Route("GET", "/v1/requests/{request_id}/wait", "agent", url="/v1/requests/{request_id}/wait?timeout=0"),
    Route("POST", "/v1/requests/{request_id}/cancel", "agent"),
    Route("GET", "/v1/admin/requests", "admin"),
    Route("GET", "/v1/admin/requests/{request_id}", "admin"),
    Route(
        "POST",
        "/v1/admin/requests/{request_id}/decision",
        "admin",
        json={"verdict": "approve", "operator": "alice"},
    ),
    Route("GET", "/v1/admin/grants", "admin"),
    Route("DELETE", "/v1/admin/grants/{grant_id}", "admin"),
    Route("GET", "/v1/admin/tokens", "admin"),
    Route("DELETE", "/v1/admin/tokens/{token_id}", "admin", url="/v1/admin/tokens/{token_id}?operator=alice"),
    Route("GET", "/v1/admin/audit", "admin"),
    Route("GET", "/v1/admin/audit/verify", "admin"),
    Route("GET", "/v1/admin/config", "admin"),
    Route("POST", "/v1/admin/config/reload", "admin"),
    Route("GET", "/v1/admin/switches", "admin"),
    Route("PUT", "/v1/admin/switches/{name}", "admin", json={"on": True, "operator": "alice"}),
    Route("POST", "/v1/me/requests/{request_id}/decision", "personal", json={"verdict": "approve"}),
    Route("POST", "/callbacks/{channel_type}/{channel}", "signed", form={"payload": "{}"}),
    Route("GET", "/approve/{token}", "signed"),
    Route("POST", "/approve/{token}", "signed", form={"token": "{token}"}),
    Route("GET", "/healthz", "public"),
    Route("GET", "/readyz", "public"),
    Route("GET", "/metrics", "public"),
    Route("GET", "/v1/receipts/keys", "public"),
    Route("GET", "/openapi.json", "public"),
    Route("GET", "/docs", "public"),
    Route("GET", "/docs/oauth2-redirect", "public"),
    Route("GET", "/redoc", "public"),
    Route("*", "/static-offline-docs", "public", url="/static-offline-docs/swagger-ui.css"),
    Route("*", "/ui/static", "public", url="/ui/static/console.js"),
    Route("GET", "/ui/login", "sign-in"),
    Route("POST", "/ui/login", "sign-in", form={"username": "alice", "password": "wrong"}),
    Route("GET", "/ui/login/oidc", "sign-in"),
    Route("GET", "/ui/oidc/callback", "sign-in"),
    Route("GET", "/ui", "sign-in"),
    Route("POST", "/ui/logout", "console", form={}),
    Route("GET", "/ui/", "console"),
    Route("GET", "/ui/queue/rows", "console"),
    Route("GET", "/ui/requests/{request_id}", "console"),
    Route("GET", "/ui/requests/{request_id}/live", "console"),
    Route("POST", "/ui/requests/{request_id}/decision", "console", form={"verdict": "approve"}),
    Route("GET", "/ui/grants", "console"),
    Route("POST", "/ui/grants/{grant_id}/revoke", "console", form={}),
    Route("GET", "/ui/tokens", "console"),
    Route("POST", "/ui/tokens", "console", form={"days": "7"}),
    Route("POST", "/ui/tokens/revoke", "console", form={"token": "{personal}"}),
    Route("POST", "/ui/tokens/{token_id}/revoke", "console", form={}),
    Route("GET", "/ui/webhooks", "console"),
    Route("GET", "/ui/history", "console"),
    Route("GET", "/ui/history/export.csv", "console"),
    Route("GET", "/ui/history/export.jsonl", "console"),
    Route("GET", "/ui/audit", "console"),
    Route("GET", "/ui/audit/verify", "console"),
    Route("GET", "/ui/config", "console"),
    Route("POST", "/ui/switches/{name}", "console", form={"on": "1"}),
]


def served(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves (a mount's method is ``*``)."""

    def walk(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
        for r in routes:
            if hasattr(r, "original_router"):  # an included router
                yield from walk(r.original_router.routes, prefix + r.include_context.prefix)
            else:
                for method in getattr(r, "methods", None) or ["*"]:
                    if method != "HEAD":
                        yield method, prefix + r.path

    return set(walk(list(app.routes)))


def fill(text: str, w: World, *, rid: str) -> str:
    return (
        text.replace("{request_id}", rid)
        .replace("{grant_id}", w.grant)
        .replace("{token_id}", "0123456789abcdef")
        .replace("{name}", "read_only")
        .replace("{channel_type}", "slack")
        .replace("{channel}", "ops-slack")
        .replace("{token}", "bm90LWEtbGluaw.c2lnbmF0dXJl")
        .replace("{personal}", w.personal)
        .replace("{csrf}", w.csrf)
    )


async def call(
    http: httpx.AsyncClient, route: Route, w: World, headers: dict[str, str], *, rid: str
) -> httpx.Response:
    url = fill(route.url or route.path, w, rid=rid)
    method = "GET" if route.method == "*" else route.method
    form = None
    if route.form is not None:
        form = {k: fill(v, w, rid=rid) for k, v in route.form.items()}
        if route.guard == "console":
            oidc = w.oidc_session in headers.get("Cookie", "")
            form["csrf_token"] = w.oidc_csrf if oidc else w.csrf
    return await http.request(method, url, json=route.json, data=form, headers=headers)


async def snapshot(runtime: Runtime, *, audit: bool = True) -> dict[str, Any]:
    """What a refused call must leave as it was."""
    queries = {
        "requests": "SELECT id, status, executed_at, decided_at FROM confirmation_request ORDER BY id",
        "votes": "SELECT request_id, voter, verdict FROM vote ORDER BY request_id, voter",
        "grants": "SELECT id, revoked_at FROM approval_grant ORDER BY id",
        "keys": "SELECT id, revoked_at FROM agent_key ORDER BY id",
        "switches": 'SELECT name, "on" FROM switch ORDER BY name',
        "sessions ended": "SELECT session_digest FROM console_session_revocation ORDER BY session_digest",
        "deliveries": "SELECT count(*) FROM delivery",
    }
    if audit:
        queries["audit"] = "SELECT count(*) FROM audit_event"
    async with runtime.sessions() as s:
        return {name: [tuple(row) for row in (await s.exec(sa.text(q))).all()] for name, q in queries.items()}


def to_sign_in(response: httpx.Response) -> bool:
    return response.status_code == 303 and response.headers.get("location", "").startswith("/ui/login?")


async def test_the_table_names_every_route_the_app_serves(world: World) -> None:
    listed = {(r.method, r.path) for r in ROUTES}
    served_now = served(world.server.app)
    assert served_now - listed == set(), "routes no credential was tried on"
    assert listed - served_now == set(), "routes the app no longer serves"


async def test_each_route_answers_its_own_credential_and_refuses_every_other(world: World) -> None:
    """Refusals first (none may change anything), then each route's own credential."""
    problems: list[str] = []
    async with world.client() as http:
        for route in ROUTES:
            for name, headers in world.headers.items():
                if route.guard in OWN and name in OWN[route.guard]:
                    continue
                # Agent B on agent A's request is refused like anyone else's call is.
                signed = route.guard in ("signed", "sign-in")
                before = await snapshot(world.runtime, audit=not signed)
                r = await call(http, route, world, headers, rid=world.rid_a)
                after = await snapshot(world.runtime, audit=not signed)
                where = f"{route.method} {route.path} with {name}: {r.status_code} {r.text[:200]!r}"
                # The provider unreachable (nothing listens at OIDC_ISSUER): a gateway's 502.
                unreachable = route.path == "/ui/login/oidc" and r.status_code == 502
                if r.status_code >= 500 and not unreachable:
                    problems.append(f"server error: {where}")
                if route.guard in ("agent", "admin", "personal"):
                    if r.status_code != 401 or r.headers.get("www-authenticate") != "Bearer":
                        problems.append(f"not 401: {where}")
                elif route.guard == "console":
                    if not to_sign_in(r):
                        problems.append(f"not sent to sign in: {where}")
                elif route.guard == "signed" and r.status_code < 400:
                    problems.append(f"unsigned call answered: {where}")
                if before != after and route.guard not in ("public", "sign-in"):
                    changed = [k for k in before if before[k] != after[k]]
                    problems.append(f"changed {changed}: {where}")
        # Signing out last: it ends the session the other console routes are called with.
        for route in sorted(ROUTES, key=lambda r: r.path == "/ui/logout"):
            for name in sorted(OWN.get(route.guard, ())):
                r = await call(http, route, world, world.headers[name], rid=world.rid_a)
                where = f"{route.method} {route.path} with {name}: {r.status_code} {r.text[:200]!r}"
                operating = route.path in ("/ui/grants/{grant_id}/revoke", "/ui/switches/{name}")
                if name == "OIDC session" and operating:
                    # Someone no operator entry names does not act for the service.
                    if r.status_code != 403 or "Operators only" not in r.text:
                        problems.append(f"a provider's account acted for the service: {where}")
                elif r.status_code >= 500 or r.status_code in (401, 403) or to_sign_in(r):
                    problems.append(f"own credential refused: {where}")
                theirs = name == "agent B" and "{request_id}" in route.path
                if theirs and r.status_code != 404:
                    problems.append(f"another agent's request answered: {where}")
    assert problems == [], "\n".join(problems)


async def test_public_routes_answer_anyone_alike_and_show_no_secret(world: World) -> None:
    secrets = {
        "agent key": world.key_a,
        "another agent's key": world.key_b,
        "admin token": ADMIN_TOKEN,
        "personal token": world.personal,
        "session cookie": world.session,
        "OIDC session": world.oidc_session,
        "OIDC personal token": world.oidc_personal,
        "session secret": SESSION_SECRET,
        "slack signing secret": SLACK_SECRET,
        "an argument": SENTINEL,
        "a request id": world.rid_a,
        "another request id": world.rid_b,
        "a grant id": world.grant,
    }
    async with world.client() as http:
        for route in (r for r in ROUTES if r.guard == "public"):
            statuses = set()
            for headers in world.headers.values():
                r = await call(http, route, world, headers, rid=world.rid_a)
                statuses.add(r.status_code)
                shown = [what for what, value in secrets.items() if value in r.text]
                assert shown == [], f"{route.path} shows {shown}"
            assert statuses == {200}, (route.path, statuses)


async def test_another_agents_request_is_404_worded_as_an_unknown_one(world: World) -> None:
    """Agent B learns nothing of agent A's request: not its existence (the same 404 as for an id
    nobody has), not its state, and cannot wait on it, cancel it or use its approval."""
    unknown = uuid.uuid4().hex
    async with world.client() as http:
        for method, template in (
            ("GET", "/v1/requests/{}"),
            ("GET", "/v1/requests/{}/wait?timeout=0"),
            ("GET", "/v1/requests/{}/wait?timeout=1"),
            ("POST", "/v1/requests/{}/cancel"),
        ):
            before = await snapshot(world.runtime)
            theirs = await http.request(method, template.format(world.rid_a), headers=bearer(world.key_b))
            nobodys = await http.request(method, template.format(unknown), headers=bearer(world.key_b))
            assert await snapshot(world.runtime) == before
            assert theirs.status_code == nobodys.status_code == 404, (template, theirs.text, nobodys.text)
            assert theirs.json()["detail"].replace(world.rid_a, unknown) == nobodys.json()["detail"]
            assert set(theirs.headers) - {"date", "x-request-id"} == set(nobodys.headers) - {
                "date",
                "x-request-id",
            }
        mine = await http.get(f"/v1/requests/{world.rid_a}", headers=bearer(world.key_a))
        assert mine.status_code == 200
        assert mine.json()["status"] == "pending"


async def test_another_agent_replaying_an_approved_calls_key_gets_its_own_answer(world: World) -> None:
    """Agent A's call is approved; agent B sends the same call with A's idempotency key (and A's
    session and tool call ids), then reports it executed: B is asked for its own approval, and
    A's approval is neither used nor used up."""
    async with world.client() as http:
        a = await ask(http, world.key_a, "pay_invoice", amount=70000)
        rid = a["request_id"]
        approved = await http.post(
            f"/v1/admin/requests/{rid}/decision",
            json={"verdict": "approve", "operator": "alice"},
            headers=bearer(ADMIN_TOKEN),
        )
        assert approved.status_code == 200, approved.text
        stolen = {**a["call"], "tool_call_id": "t-1"}
        replay = await http.post("/v1/hooks/pre-tool-use", json=stolen, headers=bearer(world.key_b))
        assert replay.status_code == 200
        assert replay.json()["decision"] == "pending", replay.json()
        assert replay.json()["request_id"] != rid
        report = await http.post(
            "/v1/hooks/post-tool-use", json={**stolen, "result": "paid"}, headers=bearer(world.key_b)
        )
        assert report.status_code == 200, report.text
        async with world.runtime.sessions() as s:
            executed = (
                await s.exec(
                    sa.text("SELECT executed_at FROM confirmation_request WHERE id = :id"), params={"id": rid}
                )
            ).one()[0]
        assert executed is None, "agent B's report used up agent A's approval"
        again = await ask(http, world.key_a, "pay_invoice", amount=70000)
        assert again["decision"] == "pending"  # a new key: a new call
        own = await http.post("/v1/hooks/pre-tool-use", json=a["call"], headers=bearer(world.key_a))
        assert own.json()["decision"] == "allow", own.json()
        # Agent A's grant for transfers (scope: agent) is A's alone.
        assert (await ask(http, world.key_a, "transfer_funds", to="acme"))["decision"] == "allow"
        assert (await ask(http, world.key_b, "transfer_funds", to="acme"))["decision"] == "pending"


async def test_the_console_polls_without_a_session_are_told_to_sign_in(world: World) -> None:
    """The htmx endpoints answer a poll without a session 401 with where to sign in, and show
    nothing of the queue or the request."""
    async with world.client() as http:
        for path in ("/ui/queue/rows", f"/ui/requests/{world.rid_a}/live", "/ui/audit/verify"):
            for name, headers in world.headers.items():
                if name in OWN["console"]:
                    continue
                r = await http.get(path, headers={**headers, "HX-Request": "true"})
                assert r.status_code == 401, (path, name, r.status_code)
                assert r.headers["hx-redirect"].startswith("/ui/login?"), (path, name)
                assert SENTINEL not in r.text, (path, name)


async def test_a_token_in_the_query_string_or_a_cookie_is_no_credential(world: World) -> None:
    async with world.client() as http:
        for name in ("access_token", "token", "api_key", "key", "authorization"):
            for value in (world.key_a, ADMIN_TOKEN, world.personal):
                for route in (r for r in ROUTES if r.guard in ("agent", "admin", "personal")):
                    url = fill(route.url or route.path, world, rid=world.rid_a)
                    url += ("&" if "?" in url else "?") + httpx.QueryParams({name: value}).__str__()
                    r = await http.request(route.method, url, json=route.json)
                    assert r.status_code == 401, (url, r.status_code)
                    r = await http.request(
                        route.method,
                        fill(route.url or route.path, world, rid=world.rid_a),
                        json=route.json,
                        headers={"Cookie": f"{name}={value}"},
                    )
                    assert r.status_code == 401, (route.path, name, r.status_code)


async def test_without_an_admin_token_the_operator_api_is_off_for_everyone(
    world: World, db_url: str, config: SignoffConfig
) -> None:
    """``SIGNOFF_ADMIN_TOKEN`` unset: 403 for every credential (the admin token of another
    server included), and nothing changes."""
    off = Settings(database_url=db_url, session_secret=SESSION_SECRET)  # type: ignore[arg-type]
    runtime = Runtime.create(off, config, channels={"chat": FakeChannel("chat")})
    try:
        async with InProcess(runtime) as app, app.client() as http:
            for route in (r for r in ROUTES if r.guard == "admin"):
                for name, headers in world.headers.items():
                    before = await snapshot(world.runtime)
                    r = await call(http, route, world, headers, rid=world.rid_a)
                    assert r.status_code == 403, (route.path, name, r.status_code, r.text[:200])
                    assert await snapshot(world.runtime) == before, (route.path, name)
    finally:
        await runtime.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://signoff:pw-0f9e8d7c@127.0.0.1:1/signoff",  # nothing listens
        "postgresql://postgres:pw-0f9e8d7c@127.0.0.1:5432/no_such_database_4c1d",
    ],
)
async def test_an_unavailable_database_is_named_to_anyone_without_its_password(
    url: str, config: SignoffConfig
) -> None:
    """``/readyz`` and the agent API answer 503 naming why, to callers without any credential:
    never with the database URL's password."""
    down = Settings(database_url=url, session_secret=SESSION_SECRET)  # type: ignore[arg-type]
    runtime = Runtime.create(down, config, channels={"chat": FakeChannel("chat")})
    try:
        async with InProcess(runtime) as app, app.client() as http:
            for method, path in (("GET", "/readyz"), ("POST", "/v1/hooks/pre-tool-use")):
                headers = bearer("sk_signoff_deadbeef_" + "x" * 43)
                r = await http.request(method, path, json=PRE_BODY, headers=headers)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert "pw-0f9e8d7c" not in r.text, r.text
                assert "pw-0f9e8d7c" not in str(r.headers)
    finally:
        await runtime.aclose()


def _variants() -> st.SearchStrategy[Callable[[str], str]]:
    """Spellings near a request id: only the id itself is that request."""
    return st.sampled_from(
        [
            str.upper,
            lambda rid: rid[:-1],
            lambda rid: rid + "0",
            lambda rid: f" {rid}",
            lambda rid: f"{rid} ",
            lambda rid: f"{rid}\u200b",
            lambda rid: f"{rid}\t",
            lambda rid: rid.replace("a", "\uff41").replace("1", "\uff11"),  # fullwidth
            lambda rid: rid.replace("e", "\u0435"),  # Cyrillic
            lambda rid: f"{rid[:8]}-{rid[8:12]}-{rid[12:16]}-{rid[16:20]}-{rid[20:]}",  # as a UUID
            lambda rid: f"{rid}%",
            lambda rid: f"{rid};",
            lambda rid: f"{rid}' OR '1'='1",
            lambda rid: "%",
            lambda rid: "_" * len(rid),
        ]
    )


@property_test(40)
@given(variant=_variants(), mine=st.booleans())
async def test_only_a_request_id_itself_names_the_request(
    world: World, variant: Callable[[str], str], mine: bool
) -> None:
    """Agent A asking for a spelling near its own request's id, or agent B near A's: 404 for
    reading, waiting and cancelling, whatever the database's collation or wildcards, and
    nothing changes."""
    rid = variant(world.rid_a)
    assume(rid != world.rid_a)
    key = world.key_a if mine else world.key_b
    before = await snapshot(world.runtime)
    async with world.client() as http:
        for method, template in (
            ("GET", "/v1/requests/{}"),
            ("GET", "/v1/requests/{}/wait?timeout=0"),
            ("POST", "/v1/requests/{}/cancel"),
        ):
            r = await http.request(method, template.format(quote(rid, safe="")), headers=bearer(key))
            assert r.status_code in (404, 422), (rid, template, r.status_code, r.text[:200])
            assert SENTINEL not in r.text, r.text  # nothing of the request's
            assert "tool_name" not in r.text, r.text
    assert await snapshot(world.runtime) == before
