"""Agent API keys: shown once, stored as SHA-256 hashes.

A server process remembers a key it has found live for :data:`CACHE_SECONDS`
(:class:`AgentKeys`, one per :class:`~signoff.app.runtime.Runtime`), so the agent
API does not query the database on every call. The bound on revocation: a key
revoked anywhere (``signoff keys revoke``, another replica, this process) stops
working within :data:`CACHE_SECONDS`, at once after :meth:`AgentKeys.forget`.
Unknown and revoked keys are never remembered: a key created a moment ago works
at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Actor
from signoff.app.models import AgentKey, utcnow

__all__ = ["CACHE_SECONDS", "AgentKeys", "authenticate", "create_key", "revoke_keys"]

PREFIX = "sk_signoff_"
CACHE_SECONDS = 2.0
"""How long a live key is trusted without asking the database again (the revocation bound)."""


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_key(session: AsyncSession, agent_id: str, *, actor: Actor) -> tuple[AgentKey, str]:
    """A new key for ``agent_id``; the plaintext is returned once and never stored."""
    key_id = secrets.token_hex(4)
    token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    row = AgentKey(id=key_id, agent_id=agent_id, key_hash=_hash(token))
    session.add(row)
    await audit.append(
        session, audit.Action.KEY_CREATED, actor=actor, detail={"agent_id": agent_id, "key_id": key_id}
    )
    return row, token


def _plausible(token: str) -> bool:
    return token.startswith(PREFIX) and len(token) <= 200


async def authenticate(session: AsyncSession, token: str) -> str | None:
    """The agent a live key belongs to, or None (always asks the database)."""
    if not _plausible(token):
        return None
    return (
        await session.exec(
            select(AgentKey.agent_id).where(
                col(AgentKey.key_hash) == _hash(token), col(AgentKey.revoked_at).is_(None)
            )
        )
    ).first()


class AgentKeys:
    """The live keys one server process remembers: key hash → (agent, when to ask again).

    Bounded in size; the look-ups behind it run in sessions from ``sessions``.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        seconds: float = CACHE_SECONDS,
        max_entries: int = 10_000,
    ) -> None:
        self.sessions = sessions
        self.seconds = seconds
        self.max_entries = max_entries
        self._entries: dict[str, tuple[str, float]] = {}
        self._lookups: dict[str, asyncio.Future[str | None]] = {}
        """Look-ups in flight, by key hash."""

    async def agent(self, token: str) -> str | None:
        """The agent a live key belongs to, or None: :func:`authenticate` through the cache."""
        if not _plausible(token):
            return None
        digest = _hash(token)
        entry = self._entries.get(digest)
        if entry is not None:
            if entry[1] > time.monotonic():
                return entry[0]
            del self._entries[digest]
        # One look-up per key at a time: the calls that miss together (thousands of agents'
        # long-polls when an entry expires) share it instead of each taking a connection.
        if (pending := self._lookups.get(digest)) is not None:
            return await asyncio.shield(pending)
        shared: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._lookups[digest] = shared
        try:
            async with self.sessions() as session:
                agent = await authenticate(session, token)
            if agent is not None:
                self._remember(digest, agent)
            shared.set_result(agent)
        except Exception as exc:
            shared.set_exception(exc)
            shared.exception()  # retrieved here: nobody else may be waiting
            raise
        finally:
            self._lookups.pop(digest, None)
            if not shared.done():  # the look-up itself was cancelled
                shared.cancel()
        return agent

    def _remember(self, digest: str, agent: str) -> None:
        if self.seconds <= 0:
            return
        if len(self._entries) >= self.max_entries:
            # Drop the oldest entry (dicts keep insertion order).
            self._entries.pop(next(iter(self._entries)), None)
        self._entries[digest] = (agent, time.monotonic() + self.seconds)

    def forget(self) -> None:
        """Trust no remembered key: the next call of each asks the database."""
        self._entries.clear()


async def revoke_keys(
    session: AsyncSession, *, key_id: str | None = None, agent_id: str | None = None, actor: Actor
) -> list[str]:
    """Revoke one key by id, or every key of an agent; returns the ids revoked."""
    stmt = sa.update(AgentKey).where(col(AgentKey.revoked_at).is_(None))
    if key_id is not None:
        stmt = stmt.where(col(AgentKey.id) == key_id)
    elif agent_id is not None:
        stmt = stmt.where(col(AgentKey.agent_id) == agent_id)
    else:
        raise ValueError("name a key id or an agent")
    rows = (
        await session.exec(
            stmt.values(revoked_at=utcnow()).returning(col(AgentKey.id), col(AgentKey.agent_id))
        )
    ).all()
    for kid, agent in rows:
        await audit.append(
            session, audit.Action.KEY_REVOKED, actor=actor, detail={"agent_id": agent, "key_id": kid}
        )
    return [str(r[0]) for r in rows]
