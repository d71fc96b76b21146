"""The console's pages under ``/ui``: each handler parses, asks a service, renders."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import queries, tokens
from signoff.app.audit import Action, Actor
from signoff.app.bodies import storable, without_unstorable
from signoff.app.console import auth, oidc, pages
from signoff.app.console.auth import CheckedFormDep, ConsoleSession, CsrfRefused, Flash, SignedInDep
from signoff.app.console.decisions import decide_from_form
from signoff.app.console.history import csv_lines, history_view, jsonl_lines, parse_history
from signoff.app.console.render import page, secured
from signoff.app.deps import ReadsDep, RuntimeDep, SessionDep, client_address
from signoff.app.models import Status, utcnow
from signoff.app.replicas import live_replicas
from signoff.app.requests import grants
from signoff.app.switches import list_switches, set_switch, unwatched
from signoff.channels import MAX_REASON_CHARS

__all__ = ["router"]

log = logging.getLogger("signoff")
READ_ONLY = "read_only"

router = APIRouter(prefix="/ui", include_in_schema=False)


def _see_other(url: str) -> Response:
    return secured(RedirectResponse(url, status_code=303))


def _not_found(request: Request, who: auth.SignedIn, request_id: str) -> Response:
    return page(
        request,
        "error.html",
        {
            "who": who,
            "title": "No such request",
            "message": f"There is no request {request_id!r}.",
        },
        status_code=404,
    )


def _operators_only(request: Request, who: auth.SignedIn, what: str) -> Response:
    person = who.voter.person if who.voter is not None else None
    fix = (
        f"an entry under operators with person: {person} makes them an operator"
        if person
        else "add them to people (with this email) and an entry under operators with that person"
    )
    message = f"Only operators may {what}; {who.operator} signed in through the identity provider: {fix}."
    context = {"who": who, "title": "Operators only", "message": message}
    return page(request, "error.html", context, status_code=403)


# --- signing in ----------------------------------------------------------------------------------


def _login_page(
    request: Request,
    runtime: RuntimeDep,
    session: ConsoleSession,
    *,
    next_url: str,
    error: str | None = None,
    username: str = "",
    ended: bool = False,
    status_code: int = 200,
) -> Response:
    response = page(
        request,
        "login.html",
        {
            "csrf": auth.keys_of(request).csrf_token(session),
            "next": next_url,
            "error": error,
            "username": username,
            "ended": ended,
            "operators": bool(runtime.config.operators),
            "passwords": runtime.config.console.password_sign_in,
            "oidc": runtime.config.console.oidc is not None,
        },
        status_code=status_code,
    )
    auth.set_session(response, request, session)
    return response


@router.get("/login")
async def sign_in_page(
    request: Request,
    runtime: RuntimeDep,
    next_: Annotated[str, Query(alias="next", max_length=2000)] = auth.HOME,
    ended: bool = False,
) -> Response:
    if await auth.current_operator(request, runtime) is not None:
        return _see_other(auth.safe_next(next_))
    keys = auth.keys_of(request)
    session = auth.session_of(request) or ConsoleSession.start(keys.max_age)
    return _login_page(request, runtime, session, next_url=auth.safe_next(next_), ended=ended)


@router.post("/login")
async def sign_in(request: Request, runtime: RuntimeDep) -> Response:
    form = await request.form()
    keys = auth.keys_of(request)
    anonymous = auth.session_of(request)
    if not keys.csrf_ok(anonymous, form.get("csrf_token")):
        raise CsrfRefused
    assert anonymous is not None
    if not runtime.config.console.password_sign_in:
        return _login_page(
            request,
            runtime,
            anonymous,
            next_url=auth.safe_next(form.get("next")),
            error="Password sign-in is turned off (console.password_sign_in: false); sign in "
            "through your organisation's identity provider.",
            status_code=403,
        )
    name, password = form.get("username"), form.get("password")
    next_url = auth.safe_next(form.get("next"))
    name = name.strip() if isinstance(name, str) else ""
    address = client_address(request)
    limiter = auth.limiter_of(request)
    if wait := limiter.retry_after(address, name):
        log.warning("console: sign-in as %r from %s refused: too many failures", name[:200], address)
        response = _login_page(
            request,
            runtime,
            anonymous,
            next_url=next_url,
            error=f"Too many failed sign-ins. Try again in {_duration(wait)}.",
            username=name,
            status_code=429,
        )
        response.headers["Retry-After"] = str(wait)
        return response
    operator = None
    if name and isinstance(password, str) and password:
        operator = await auth.authenticate(runtime.config, name, password)
    if operator is None:
        limiter.failed(address, name)
        log.warning("console: failed sign-in as %r from %s", name[:200], address)
        return _login_page(
            request,
            runtime,
            anonymous,
            next_url=next_url,
            error="Wrong operator name or password.",
            username=name,
            status_code=401,
        )
    limiter.succeeded(address, name)
    log.info("console: %s signed in", name)
    session = ConsoleSession.start(keys.max_age, operator=name, fingerprint=auth.fingerprint(operator))
    response = _see_other(next_url)
    auth.set_session(response, request, session)
    return response


@router.get("/login/oidc")
async def sign_in_with_oidc(
    request: Request,
    runtime: RuntimeDep,
    next_: Annotated[str, Query(alias="next", max_length=2000)] = auth.HOME,
    recheck: bool = False,
) -> Response:
    """Send the browser to the identity provider (see :mod:`signoff.app.console.oidc`);
    ``recheck``: to confirm a sign-in, without a prompt."""
    keys = auth.keys_of(request)
    anonymous = auth.session_of(request) or ConsoleSession.start(keys.max_age)
    settings = runtime.config.console.oidc
    next_url = auth.safe_next(next_)
    if settings is None:
        return _login_page(
            request,
            runtime,
            anonymous,
            next_url=next_url,
            error="Sign-in through an identity provider is not configured (console.oidc).",
            status_code=404,
        )
    clients: oidc.OidcClients = request.app.state.oidc_clients
    try:
        url, flow = await clients.start(
            settings,
            redirect_uri=oidc.callback_url(runtime.settings.public_url, request),
            next_url=next_url,
            silent=recheck,
        )
    except oidc.SignInRefused as exc:
        return _login_page(request, runtime, anonymous, next_url=next_url, error=exc.reason, status_code=502)
    response = _see_other(url)
    clients.set_flow(response, request, flow)
    return response


@router.get("/oidc/callback")
async def oidc_callback(request: Request, runtime: RuntimeDep, db: SessionDep) -> Response:
    """The identity provider's redirect back: check everything, then sign the person in."""
    keys = auth.keys_of(request)
    anonymous = auth.session_of(request) or ConsoleSession.start(keys.max_age)
    settings = runtime.config.console.oidc
    clients: oidc.OidcClients = request.app.state.oidc_clients
    if settings is None:
        response = _login_page(
            request,
            runtime,
            anonymous,
            next_url=auth.HOME,
            error="Sign-in through an identity provider is not configured (console.oidc).",
            status_code=404,
        )
        clients.clear_flow(response)
        return response
    try:
        claims, next_url = await clients.finish(settings, request)
    except oidc.SignInRefused as exc:
        log.warning("console: OIDC sign-in from %s refused: %s", client_address(request), exc.reason)
        if exc.answered and anonymous.operator is not None and anonymous.person is not None:
            # A sign-in the provider no longer confirms (a disabled account): it ends here. Not
            # for a callback this browser did not start (a link from elsewhere signs nobody
            # out), nor for an operator's password, on which the provider has no word.
            await auth.end_session(db, anonymous, operator=anonymous.operator)
            anonymous = ConsoleSession.start(keys.max_age)
        response = _login_page(
            request, runtime, anonymous, next_url=auth.HOME, error=exc.reason, status_code=401
        )
        clients.clear_flow(response)  # a state is used once, whatever the outcome
        return response
    claims = oidc.keep_groups(claims, runtime.config)
    session = ConsoleSession.start(
        keys.max_age,
        operator=claims.username,
        fingerprint=oidc.fingerprint(settings),
        person=claims.as_dict(),
    )
    log.info("console: %s signed in through %s", claims.username, settings.issuer)
    response = _see_other(auth.safe_next(next_url))
    auth.set_session(response, request, session)
    clients.clear_flow(response)
    return response


def _duration(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{seconds} seconds" if seconds < 60 else f"{minutes} minute{'s' if minutes > 1 else ''}"


@router.post("/logout")
async def sign_out(form: CheckedFormDep, who: SignedInDep, session: SessionDep) -> Response:
    # Clearing the cookie is not enough: a copy of it would stay valid until it expires.
    await auth.end_session(session, who.session, operator=who.operator)
    log.info("console: %s signed out", who.operator)
    response = _see_other("/ui/login")
    auth.clear_session(response)
    return response


# --- the queue -----------------------------------------------------------------------------------


@router.get("")
async def console_root() -> Response:
    return _see_other(auth.HOME)


@router.get("/")
async def show_queue(request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep) -> Response:
    view = await pages.queue_view(session, runtime.config, utcnow())
    return page(request, "queue.html", {"who": who, "nav": "queue", "view": view, "version": view.version})


@router.get("/queue/rows")
async def queue_rows(
    request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep, v: str = ""
) -> Response:
    """The queue's table for the page's poll: 204 (nothing to swap) while it is unchanged."""
    view = await pages.queue_view(session, runtime.config, utcnow())
    if v == view.version:
        return secured(Response(status_code=204))
    return page(request, "_queue.html", {"who": who, "view": view, "version": view.version})


# --- one request ---------------------------------------------------------------------------------


@router.get("/requests/{request_id}")
async def show_request(
    request_id: str, request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep
) -> Response:
    view = await pages.request_view(
        session, runtime.config, request_id, person=who.person, now=utcnow(), voter=who.voter
    )
    if view is None:
        return _not_found(request, who, request_id)
    response = page(
        request, "request.html", {"who": who, "nav": "queue", "view": view, "flash": auth.read_flash(request)}
    )
    auth.forget_flash(request, response)
    return response


@router.get("/requests/{request_id}/live")
async def request_live(
    request_id: str,
    request: Request,
    who: SignedInDep,
    runtime: RuntimeDep,
    session: ReadsDep,
    seen: str = "",
    v: str = "",
) -> Response:
    """The request's votes, cards and trail for the page's poll; a new status reloads the page."""
    view = await pages.request_view(
        session, runtime.config, request_id, person=who.person, now=utcnow(), voter=who.voter
    )
    if view is None or view.row.status != seen:
        return secured(Response(status_code=200, headers={"HX-Refresh": "true"}))
    if v == view.version:
        return secured(Response(status_code=204))
    return page(request, "_request_live.html", {"who": who, "view": view})


@router.post("/requests/{request_id}/decision")
async def decide_request(
    request_id: str,
    request: Request,
    who: SignedInDep,
    form: CheckedFormDep,
    runtime: RuntimeDep,
    session: SessionDep,
) -> Response:
    flash = await decide_from_form(session, request_id, form=form, who=who, config=runtime.config)
    if flash is None:
        return _not_found(request, who, request_id)
    response = _see_other(f"/ui/requests/{quote(request_id, safe='')}")
    auth.set_flash(response, request, flash)
    return response


# --- grants --------------------------------------------------------------------------------------


@router.get("/grants")
async def show_grants(
    request: Request,
    who: SignedInDep,
    session: ReadsDep,
    all_: Annotated[str, Query(alias="all", max_length=1)] = "",
) -> Response:
    """Active grants (who can still act without asking), or every grant with ``?all=1``."""
    now = utcnow()
    active = all_ != "1"
    rows = await grants.list_grants(session, active=True if active else None, now=now)
    response = page(
        request,
        "grants.html",
        {
            "who": who,
            "nav": "grants",
            "grants": rows,
            "active": active,
            "now": now,
            "flash": auth.read_flash(request),
        },
    )
    auth.forget_flash(request, response)
    return response


@router.post("/grants/{grant_id}/revoke")
async def revoke_grant(
    grant_id: str,
    request: Request,
    who: SignedInDep,
    form: CheckedFormDep,
    runtime: RuntimeDep,
    session: SessionDep,
) -> Response:
    """Revoke a grant as the signed-in operator (audited)."""
    if not who.may_operate(runtime.config):
        return _operators_only(request, who, "revoke grants")
    grant, revoked = (None, False)
    if pages.plausible_id(grant_id):
        grant, revoked = await grants.revoke(session, grant_id, actor=Actor("web", who.operator, who.name))
    if grant is None:
        flash = Flash(False, f"There is no grant {grant_id!r}.")
    elif revoked:
        flash = Flash(True, f"Grant {grant_id} is revoked: from the next call on it allows nothing.")
    else:
        flash = Flash(False, f"Grant {grant_id} was already revoked by {grant.revoked_by}.")
    response = _see_other("/ui/grants")
    auth.set_flash(response, request, flash)
    return response


# --- personal tokens for the command line --------------------------------------------------------

TOKEN_DAYS = (1, 7, 30, 90)


def _owner(who: auth.SignedIn) -> str:
    return tokens.owner_of(who.session.operator or who.operator, who.session.person)


async def _tokens_page(
    request: Request,
    who: auth.SignedIn,
    session: AsyncSession,
    *,
    token: str | None = None,
    until: datetime | None = None,
) -> Response:
    context = {
        "who": who,
        "nav": "tokens",
        "token": token,
        "until": until,
        "tokens": await tokens.list_tokens(session, owner=_owner(who)),
        "flash": auth.read_flash(request),
    }
    response = page(request, "tokens.html", context)
    auth.forget_flash(request, response)
    return response


@router.get("/tokens")
async def show_tokens(request: Request, who: SignedInDep, session: ReadsDep) -> Response:
    """The signed-in person's tokens (made, expires, last used; never their text)."""
    return await _tokens_page(request, who, session)


@router.post("/tokens")
async def create_token(
    request: Request, who: SignedInDep, form: CheckedFormDep, session: SessionDep
) -> Response:
    """A personal token carrying the signed-in identity (shown once; recorded and its creation
    audited)."""
    raw = form.get("days")
    days = int(raw) if isinstance(raw, str) and raw.isdigit() and int(raw) in TOKEN_DAYS else 30
    label = form.get("label")
    label = (
        without_unstorable(" ".join(label.split()))[: tokens.LABEL_CHARS] if isinstance(label, str) else ""
    )
    made = ConsoleSession.start(
        days * 86400,
        operator=who.session.operator,
        fingerprint=who.session.fingerprint,
        person=who.session.person,
    )
    until = datetime.fromtimestamp(made.expires, UTC)
    await tokens.create(
        session,
        nonce=made.nonce,
        owner=_owner(who),
        operator=who.operator,
        person=who.person,
        expires_at=until,
        label=label,
        actor=Actor("web", who.operator, who.name),
    )
    await session.flush()
    text = auth.keys_of(request).encode_token(made)
    return await _tokens_page(request, who, session, token=text, until=until)


def _revoked(request: Request, flash: Flash) -> Response:
    response = _see_other("/ui/tokens")
    auth.set_flash(response, request, flash)
    return response


@router.post("/tokens/revoke")
async def revoke_token(
    request: Request, who: SignedInDep, form: CheckedFormDep, session: SessionDep
) -> Response:
    """Revoke a token of one's own given its text."""
    raw = form.get("token")
    found = auth.keys_of(request).decode_token(raw.strip() if isinstance(raw, str) else None)
    row, revoked = None, False
    if found is not None and tokens.owner_of(found.operator or "", found.person) == _owner(who):
        actor = Actor("web", who.operator, who.name)
        row, revoked = await tokens.revoke(
            session, tokens.token_id(found.nonce), actor=actor, owner=_owner(who)
        )
    if row is None or not revoked:
        return _revoked(
            request, Flash(False, "That is not a live token of yours (expired, mistyped, or someone else's).")
        )
    return _revoked(request, Flash(True, _REVOKED))


_REVOKED = "The token is revoked: the command line can no longer decide with it."


@router.post("/tokens/{token_id}/revoke")
async def revoke_token_by_id(
    token_id: Annotated[str, Path(max_length=64)],
    request: Request,
    who: SignedInDep,
    form: CheckedFormDep,
    session: SessionDep,
) -> Response:
    """Revoke one of one's own tokens by its id, as the tokens page lists it (audited)."""
    row, revoked = None, False
    if storable(token_id):
        actor = Actor("web", who.operator, who.name)
        row, revoked = await tokens.revoke(session, token_id, actor=actor, owner=_owner(who))
    if row is None:
        return _revoked(request, Flash(False, f"You have no token {token_id!r}."))
    if not revoked:
        return _revoked(request, Flash(False, f"Token {token_id} was already revoked by {row.revoked_by}."))
    return _revoked(request, Flash(True, _REVOKED))


# --- webhooks ------------------------------------------------------------------------------------


@router.get("/webhooks")
async def show_webhooks(
    request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep
) -> Response:
    """The configured webhooks, and the events that could not be delivered to them."""
    failed = await queries.failed_webhooks(session)
    return page(
        request,
        "webhooks.html",
        {
            "who": who,
            "nav": "webhooks",
            "webhooks": queries.masked_webhooks(runtime.config),
            "failed": failed,
        },
    )


# --- history and exports -------------------------------------------------------------------------


@router.get("/history")
async def show_history(
    request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep
) -> Response:
    q = parse_history(request.query_params)
    view = await history_view(session, runtime.config, q)
    return page(
        request,
        "history.html",
        {
            "who": who,
            "nav": "history",
            "q": q,
            "view": view,
            "statuses": [s.value for s in Status],
            "agents": sorted(runtime.config.agents),
        },
    )


def _attachment(kind: str) -> dict[str, str]:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return {"Content-Disposition": f'attachment; filename="signoff-history-{stamp}.{kind}"'}


@router.get("/history/export.csv")
async def export_csv(request: Request, who: SignedInDep, runtime: RuntimeDep) -> Response:
    which = parse_history(request.query_params).filter
    return secured(
        StreamingResponse(
            csv_lines(runtime.reads, runtime.config, which),
            media_type="text/csv; charset=utf-8",
            headers=_attachment("csv"),
        )
    )


@router.get("/history/export.jsonl")
async def export_jsonl(request: Request, who: SignedInDep, runtime: RuntimeDep) -> Response:
    which = parse_history(request.query_params).filter
    return secured(
        StreamingResponse(
            jsonl_lines(runtime.reads, which), media_type="application/jsonl", headers=_attachment("jsonl")
        )
    )


# --- audit and configuration ---------------------------------------------------------------------


@router.get("/audit")
async def show_audit(
    request: Request,
    who: SignedInDep,
    session: ReadsDep,
    before: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    action: Annotated[str, Query(max_length=64)] = "",
    request_id: Annotated[str, Query(alias="request", max_length=64)] = "",
) -> Response:
    action, request_id = action.strip(), request_id.strip()
    view = await pages.audit_view(
        session, before=before, action=action or None, request_id=request_id or None
    )
    base_query = urlencode({k: v for k, v in (("action", action), ("request", request_id)) if v})
    return page(
        request,
        "audit.html",
        {
            "who": who,
            "nav": "audit",
            "view": view,
            "before": before,
            "action": action,
            "request_id": request_id,
            "actions": [a.value for a in Action],
            "base_query": base_query,
        },
    )


@router.get("/audit/verify")
async def verify_audit(request: Request, who: SignedInDep, session: ReadsDep) -> Response:
    result = await pages.verification(session)
    if request.headers.get("HX-Request"):
        return page(request, "_audit_verify.html", {"result": result})
    return page(request, "audit_verify.html", {"who": who, "nav": "audit", "result": result})


@router.get("/config")
async def show_config(request: Request, who: SignedInDep, runtime: RuntimeDep, session: ReadsDep) -> Response:
    view = pages.config_view(runtime.config)
    switches = {s.name: s for s in await list_switches(session)}
    replicas = await live_replicas(session, utcnow())
    response = page(
        request,
        "config.html",
        {
            "who": who,
            "nav": "config",
            "view": view,
            "version": runtime.version,
            "loaded_at": runtime.loaded_at,
            "replicas": replicas,
            "replicas_differ": len({r.config_version for r in replicas} | {runtime.version}) > 1,
            "switches": {name: switches.get(name) for name in view.guarded},
            "flash": auth.read_flash(request),
        },
    )
    auth.forget_flash(request, response)
    return response


@router.post("/switches/{name}")
async def flip_switch(
    name: str,
    request: Request,
    who: SignedInDep,
    form: CheckedFormDep,
    runtime: RuntimeDep,
    session: SessionDep,
) -> Response:
    """Turn a switch a ``readonly_guard`` watches on or off as the signed-in operator (audited)."""
    if not who.may_operate(runtime.config):
        return _operators_only(request, who, "turn switches on or off")
    on = form.get("on") == "1"
    if (why := unwatched(runtime.config, name, on=on)) is not None:
        context = {"who": who, "title": "No such switch", "message": why[0].upper() + why[1:] + "."}
        return page(request, "error.html", context, status_code=404)
    reason = without_unstorable(str(form.get("reason") or "")).strip()[:MAX_REASON_CHARS] or None
    await set_switch(session, name, on=on, actor=Actor("web", who.operator, who.name), reason=reason)
    response = _see_other("/ui/config")
    mode = "Read-only mode" if name == READ_ONLY else f"The {name} switch"
    auth.set_flash(response, request, Flash(True, f"{mode} is {'on' if on else 'off'}."))
    return response
