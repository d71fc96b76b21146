"""The HTTP routers. Their JSON bodies follow the input rule of :mod:`signoff.app.bodies`
(kept apart from it, so that what reads stored rows imports nothing of the web framework)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from signoff.app.bodies import Refused, parse_json
from signoff.app.requests.votes import VoteResult

__all__ = ["StrictJSONRequest", "StrictJSONRoute", "refusal"]


def refusal(result: VoteResult) -> JSONResponse | None:
    """A decision through the API refused, answered by the callback contract (None: it was
    recorded, or repeated the same person's same decision: 200 with the request as it stands).
    409 names the final state and who made it; 410: the request expired or was cancelled; 422:
    what the vote asked cannot be (changes the gates do not allow). Answered, not raised: the
    refusal's audit event is committed with the answer."""
    if result.answer.ok:
        return None
    code = 422 if result.unprocessable else result.answer.status_code
    return JSONResponse({"detail": result.message, "status": result.request.status}, code)


class StrictJSONRequest(Request):
    """A request whose JSON body is read by :func:`parse_json` (a refusal is a 422)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json(await self.body())
            except Refused as exc:
                raise HTTPException(422, str(exc)) from None
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose JSON body follows the rule (FastAPI reads bodies with ``request.json()``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
