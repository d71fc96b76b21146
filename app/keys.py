"""Agent API keys: shown once, stored as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import secrets

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from app import audit
from app.audit import Actor
from app.models import AgentKey, utcnow

__all__ = ["authenticate", "create_key", "revoke_keys"]

PREFIX = "sk_signoff_"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


async def create_key(session: AsyncSession, agent_id: str, *, actor: Actor) -> tuple[AgentKey, str]:
    """A new key for ``agent_id``; the plaintext is returned once and never stored."""
    key_id = secrets.token_hex(4)
    token = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    row = AgentKey(id=key_id, agent_id=agent_id, key_hash=_hash(token))
    session.add(row)
    await audit.append(session, "key_created", actor=actor, detail={"agent_id": agent_id, "key_id": key_id})
    return row, token


async def authenticate(session: AsyncSession, token: str) -> str | None:
    """The agent a live key belongs to, or None."""
    if not token.startswith(PREFIX) or len(token) > 200:
        return None
    row = (
        await session.exec(
            select(AgentKey.agent_id).where(
                col(AgentKey.key_hash) == _hash(token), col(AgentKey.revoked_at).is_(None)
            )
        )
    ).first()
    return row


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
        await audit.append(session, "key_revoked", actor=actor, detail={"agent_id": agent, "key_id": kid})
    return [str(r[0]) for r in rows]
