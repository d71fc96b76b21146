"""The HTTP routers. Their JSON bodies follow the input rule of :mod:`signoff.app.bodies`
(kept apart from it, so that what reads stored rows imports nothing of the web framework)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from signoff.app.bodies import Refused, parse_json

__all__ = ["StrictJSONRequest", "StrictJSONRoute"]


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
