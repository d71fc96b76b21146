"""The email channel's links: ``GET /approve/{token}`` shows, only ``POST`` decides."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from signoff.app import links
from signoff.app.console.render import page
from signoff.app.deps import client_address
from signoff.app.links import LinkPage
from signoff.app.models import utcnow
from signoff.app.runtime import Runtime

router = APIRouter(prefix="/approve", tags=["email links"], include_in_schema=False)

_HEADERS = {"X-Robots-Tag": "noindex, nofollow"}


def _render(request: Request, view: LinkPage) -> Response:
    return page(request, "approve.html", {"view": view}, status_code=view.status_code, headers=_HEADERS)


@router.get("/{token}")
async def show_link(token: str, request: Request) -> Response:
    """The confirmation page for one link; opening it changes nothing."""
    runtime: Runtime = request.app.state.runtime
    return _render(request, await links.open_link(runtime, token, now=utcnow()))


@router.post("/{token}")
async def confirm_link(token: str, request: Request) -> Response:
    """The page's form: the token posted back, and a reason for a rejection."""
    runtime: Runtime = request.app.state.runtime
    form = await request.form(max_files=0, max_fields=8)
    posted, reason = form.get("token"), form.get("reason")
    view = await links.answer_link(
        runtime,
        token,
        posted_token=posted if isinstance(posted, str) else None,
        reason=reason if isinstance(reason, str) else None,
        address=client_address(request),
        now=utcnow(),
    )
    return _render(request, view)
