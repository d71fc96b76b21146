"""Templates, and the headers every console response carries."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from fastapi.templating import Jinja2Templates
from starlette.requests import Request
from starlette.responses import Response

from signoff.app.console import format as fmt
from signoff.channels import MAX_REASON_CHARS, argument_json, shown_text, while_same

__all__ = ["SECURITY_HEADERS", "STATIC_DIR", "page", "secured"]

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"

SECURITY_HEADERS = {
    # Scripts and styles come only from /ui/static: no inline code, nothing from elsewhere.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(
    when=fmt.when,
    iso=fmt.iso,
    pretty_json=fmt.pretty_json,
    # On pages, JSON the agent chose (audit details, grants) is written as the cards write it.
    compact_json=argument_json,
    shown=shown_text,
    summarize=fmt.summarize,
    duration=fmt.duration,
    while_same=while_same,
)
_env.globals["MAX_REASON_CHARS"] = MAX_REASON_CHARS
templates = Jinja2Templates(env=_env)


def secured(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def page(
    request: Request,
    name: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Render ``templates/name`` with the console's headers."""
    ctx: dict[str, Any] = {"flash": None, "who": None, "nav": "", **context}
    return secured(templates.TemplateResponse(request, name, ctx, status_code=status_code, headers=headers))
