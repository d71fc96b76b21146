"""Agent API keys: shown once, stored as SHA-256 hashes.

A server process remembers a key it has found live for :data:`CACHE_SECONDS`,
so the agent API does not query the database on every call. The bound on
revocation: a key revoked in this process (``revoke_keys``) stops working here
at once; one revoked elsewhere (``signoff keys revoke``, another replica)
stops working here within :data:`CACHE_SECONDS`. Unknown and revoked keys are
never remembered: a key created a moment ago works at once.
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

__all__ = ["CACHE_SECONDS", "KeyCache", "authenticate", "authenticate_cached", "create_key", "revoke_keys"]

PREFIX = "sk_signoff_"
CACHE_SECONDS = 2.0
"""How long a live key is trusted without asking the database again (the revocation bound)."""


class KeyCache:
    """Live keys by (database, key hash) → (agent, when to check again); bounded in size."""

    def __init__(self, seconds: float = CACHE_SECONDS, max_entries: int = 10_000) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, scope: str, digest: str) -> str | None:
        entry = self._entries.get((scope, digest))
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            self._entries.pop((scope, digest), None)
            return None
        return entry[0]

    def put(self, scope: str, digest: str, agent_id: str) -> None:
        if self.seconds <= 0:
            return
        if len(self._entries) >= self.max_entries:
            # Drop the oldest entry (dicts keep insertion order).
            self._entries.pop(next(iter(self._entries)), None)
        self._entries[(scope, digest)] = (agent_id, time.monotonic() + self.seconds)

    def clear(self) -> None:
        self._entries.clear()


KEYS = KeyCache()


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


async def _lookup(session: AsyncSession, digest: str) -> str | None:
    return (
        await session.exec(
            select(AgentKey.agent_id).where(
                col(AgentKey.key_hash) == digest, col(AgentKey.revoked_at).is_(None)
            )
        )
    ).first()


async def authenticate(session: AsyncSession, token: str) -> str | None:
    """The agent a live key belongs to, or None (always asks the database)."""
    if not _plausible(token):
        return None
    return await _lookup(session, _hash(token))


async def authenticate_cached(
    sessions: async_sessionmaker[AsyncSession], scope: str, token: str, *, cache: KeyCache = KEYS
) -> str | None:
    """:func:`authenticate` through the process's cache of live keys; ``scope`` names the database."""
    if not _plausible(token):
        return None
    digest = _hash(token)
    agent = cache.get(scope, digest)
    if agent is not None:
        return agent
    # One look-up per key at a time: the calls that miss together (thousands of agents'
    # long-polls when an entry expires) share it instead of each taking a connection.
    key = (scope, digest)
    if (pending := _LOOKUPS.get(key)) is not None:
        return await asyncio.shield(pending)
    shared: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    _LOOKUPS[key] = shared
    try:
        async with sessions() as session:
            agent = await _lookup(session, digest)
        if agent is not None:
            cache.put(scope, digest, agent)
        shared.set_result(agent)
    except Exception as exc:
        shared.set_exception(exc)
        shared.exception()  # retrieved here: nobody else may be waiting
        raise
    finally:
        _LOOKUPS.pop(key, None)
        if not shared.done():  # the look-up itself was cancelled
            shared.cancel()
    return agent


_LOOKUPS: dict[tuple[str, str], asyncio.Future[str | None]] = {}
"""Key look-ups in flight, by (database, key hash)."""


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
    if rows:
        # Revoked in this process: stop trusting remembered keys now, and again once the
        # revocation commits (a lookup in between could have remembered the key anew).
        KEYS.clear()
        sa.event.listen(session.sync_session, "after_commit", lambda _s: KEYS.clear(), once=True)
    return [str(r[0]) for r in rows]
