"""FastAPI dependencies: the runtime, the request's transaction, agent and operator auth."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.db import transaction
from signoff.app.runtime import Runtime
from signoff.hooks import ServiceUnavailable

_bearer = HTTPBearer(auto_error=False)


async def get_runtime(request: Request) -> Runtime:
    # ``async``: FastAPI runs a plain ``def`` dependency in a worker thread, a thread hop
    # on every request.
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def client_address(request: Request) -> str:
    """The caller's address: the peer's, or behind a proxy trusted by ``FORWARDED_ALLOW_IPS``
    the one it forwards (uvicorn rewrites the peer from ``X-Forwarded-For``)."""
    return request.client.host if request.client else "?"


async def get_session(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    async with transaction(runtime.sessions) as session:
        yield session


# scope="function": commit before the response is sent, so a client never sees
# an answer whose transaction could still fail.
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]


async def get_reads(runtime: RuntimeDep) -> AsyncIterator[AsyncSession]:
    async with runtime.reads() as session:
        yield session


ReadsDep = Annotated[AsyncSession, Depends(get_reads, scope="function")]
"""A session for reading only (on SQLite it never queues behind writers)."""
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, read as FastAPI's ``HTTPBearer`` reads it."""
    scheme, token = get_authorization_scheme_param(authorization)
    return token if token and scheme.lower() == "bearer" else None


async def agent_for(runtime: Runtime, token: str | None) -> str:
    """The agent whose live key ``token`` is; 401 for none, an unknown or a revoked key, 503
    when the database cannot say."""
    if token is None:
        raise _unauthorized("missing API key: send `Authorization: Bearer <agent key>`")
    try:
        agent = await runtime.keys.agent(token)
    except SQLAlchemyError as exc:
        # The key was not judged: 503 with the database's reason (the app's handler), never a
        # 401, which an agent's client takes as a final deny.
        raise ServiceUnavailable("the agent key could not be checked") from exc
    if agent is None:
        raise _unauthorized("unknown or revoked API key; create one with `signoff keys create AGENT`")
    return agent


async def get_agent(runtime: RuntimeDep, credentials: Credentials) -> str:
    return await agent_for(runtime, credentials.credentials if credentials is not None else None)


AgentDep = Annotated[str, Depends(get_agent)]


async def require_admin(runtime: RuntimeDep, credentials: Credentials) -> None:
    token = runtime.settings.admin_token
    if token is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, "the operator API is disabled: set SIGNOFF_ADMIN_TOKEN"
        )
    if credentials is None or not hmac.compare_digest(
        credentials.credentials.encode(), token.get_secret_value().encode()
    ):
        raise _unauthorized("wrong or missing admin token")


AdminDep = Depends(require_admin)
