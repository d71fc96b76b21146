"""Platform callbacks: authenticated by the platform's signature, never by key."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask

from signoff.app.deps import client_address
from signoff.app.runtime import Runtime
from signoff.channels import CallbackRejected, InteractiveChannel

router = APIRouter(prefix="/callbacks", tags=["callbacks"])
log = logging.getLogger("signoff.callbacks")


@router.post("/{channel_type}/{channel}", include_in_schema=True)
async def receive_callback(channel_type: str, channel: str, request: Request) -> JSONResponse:
    """A button click (or verification challenge) from Slack or Feishu, or an ntfy action."""
    # The runtime straight from the app: no dependency to solve on the decision's clock.
    runtime: Runtime = request.app.state.runtime
    target = runtime.channels.get(channel)
    if target is None or target.type != channel_type or not isinstance(target, InteractiveChannel):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no {channel_type} channel named {channel!r}")
    body = await request.body()
    try:
        reply = await target.handle_callback(body, request.headers, runtime.clicks)
    except CallbackRejected as exc:
        log.warning("callback to %s refused: %s", channel, exc.reason)
        await runtime.refusals.refuse(
            surface=channel_type,
            channel=channel,
            reason=exc.reason,
            address=client_address(request),
            size=len(body),
        )
        return JSONResponse({"error": "invalid request"}, exc.status_code)
    background = BackgroundTask(reply.after) if reply.after is not None else None
    return JSONResponse(dict(reply.body or {}), reply.status_code, background=background)
