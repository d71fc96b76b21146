"""Serving the console from the app: its router, static files, session keys and the answers
to a request that must sign in first or whose form lost its CSRF token."""

from __future__ import annotations

import logging
import secrets
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from signoff.app.console import auth
from signoff.app.console.auth import CsrfRefused, Keys, SignInRequired
from signoff.app.console.oidc import OidcClients
from signoff.app.console.render import STATIC_DIR, page, secured
from signoff.app.console.router import router
from signoff.app.settings import Settings

__all__ = ["install"]

log = logging.getLogger("signoff")


async def _sign_in_required(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SignInRequired)
    query = {"next": exc.next_url}
    # A stale cookie, or a poll from a page that was signed in: the session has ended.
    if not exc.recheck and (auth.SESSION_COOKIE in request.cookies or request.headers.get("HX-Request")):
        query["ended"] = "1"
    # An OIDC sign-in due to be confirmed goes to the provider, which answers without a prompt.
    url = (
        f"/ui/login/oidc?{urlencode({**query, 'recheck': '1'})}"
        if exc.recheck
        else f"/ui/login?{urlencode(query)}"
    )
    if request.headers.get("HX-Request"):
        # A poll from an open page: have htmx take the whole page to the sign-in form.
        response: Response = Response(status_code=401, headers={"HX-Redirect": url})
    else:
        response = RedirectResponse(url, status_code=303)
    if not exc.recheck:
        auth.clear_session(response)
    return secured(response)


async def _csrf_refused(request: Request, exc: Exception) -> Response:
    return page(
        request,
        "error.html",
        {
            "title": "Form refused",
            "message": "This form did not carry a valid CSRF token for your session, so nothing was done. "
            "Reload the page and try again.",
        },
        status_code=403,
    )


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the console under ``/ui`` (pages, static files, sign-in handling)."""
    if settings.session_secret is not None:
        secret = settings.session_secret.get_secret_value()
    else:
        secret = secrets.token_urlsafe(32)
        log.warning(
            "SIGNOFF_SESSION_SECRET is not set: console sessions are signed with a key made for this "
            "process, so sign-ins end when it restarts and do not carry over to other replicas"
        )
    app.state.console_keys = Keys(secret, max_age=settings.session_max_age_seconds)
    app.state.sign_in_limiter = auth.SignInLimiter()
    app.state.oidc_clients = OidcClients(secret)
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.add_exception_handler(SignInRequired, _sign_in_required)
    app.add_exception_handler(CsrfRefused, _csrf_refused)
