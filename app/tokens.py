"""Personal tokens for the command line: made in the console, each a row of its own.

A token is signed text carrying its maker's sign-in (:meth:`signoff.app.console.auth.Keys.encode_token`)
and a random nonce; its row (:class:`~signoff.app.models.PersonalToken`) is found by the start
of that nonce's SHA-256, the token's id. Its text is never stored. The row is what lets its
owner see their tokens (made, expires, last used) and revoke one by id, and an operator do
the same for anyone's: a token with no row, or a revoked one, decides nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.models import PersonalToken, utcnow

__all__ = ["LABEL_CHARS", "create", "list_tokens", "owner_of", "revoke", "token_id", "use"]

LABEL_CHARS = 100
"""The longest label a token may have."""


def token_id(nonce: str) -> str:
    """The id of the token carrying ``nonce`` (the ``token`` its audit events name)."""
    return hashlib.sha256(nonce.encode()).hexdigest()[:16]


def owner_of(operator: str, person: Mapping[str, object] | None) -> str:
    """Whose a token made signed in as ``operator`` is: that operator's, or for a sign-in
    through the identity provider (``person``, its claims), that account's (by issuer and
    subject, never the username it chose)."""
    subject = (person or {}).get("subject")
    if person is None or not isinstance(subject, str):
        return operator
    digest = hashlib.sha256(f"{person.get('issuer')}#{subject}".encode()).hexdigest()[:32]
    return f"oidc:{digest}"


async def create(
    session: AsyncSession,
    *,
    nonce: str,
    owner: str,
    operator: str,
    person: str,
    expires_at: datetime,
    label: str | None,
    actor: Actor,
) -> PersonalToken:
    """Record a new token (audited); tokens past their expiry are forgotten meanwhile."""
    now = utcnow()
    await session.exec(sa.delete(PersonalToken).where(col(PersonalToken.expires_at) < now))
    row = PersonalToken(
        id=token_id(nonce),
        owner=owner,
        operator=operator,
        person=person,
        label=label or None,
        created_at=now,
        expires_at=expires_at,
    )
    session.add(row)
    detail = {"token": row.id, "expires_at": expires_at.isoformat(), "person": person}
    if row.label:
        detail["label"] = row.label
    await audit.append(session, Action.TOKEN_CREATED, actor=actor, detail=detail)
    return row


async def list_tokens(
    session: AsyncSession, *, owner: str | None = None, person: str | None = None, live: bool = False
) -> list[PersonalToken]:
    """Tokens not yet expired, newest first: ``owner``'s or ``person``'s (both None: everyone's);
    ``live``: only those not revoked."""
    stmt = select(PersonalToken).where(col(PersonalToken.expires_at) > utcnow())
    if owner is not None:
        stmt = stmt.where(col(PersonalToken.owner) == owner)
    if person is not None:
        stmt = stmt.where(col(PersonalToken.person) == person)
    if live:
        stmt = stmt.where(col(PersonalToken.revoked_at).is_(None))
    stmt = stmt.order_by(col(PersonalToken.created_at).desc(), col(PersonalToken.id))
    return list((await session.exec(stmt)).all())


async def revoke(
    session: AsyncSession, tid: str, *, actor: Actor, owner: str | None = None
) -> tuple[PersonalToken | None, bool]:
    """Revoke token ``tid`` (audited): from this transaction's commit on, it decides nothing
    on any replica. ``owner``: only if it is theirs (someone else's is not found). Returns the
    token (None: no such token) and whether this call revoked it (False: it was already)."""
    stmt = select(PersonalToken).where(col(PersonalToken.id) == tid)
    if owner is not None:
        stmt = stmt.where(col(PersonalToken.owner) == owner)
    found = (await session.exec(stmt)).first()
    if found is None:
        return None, False
    done = await session.exec(
        sa.update(PersonalToken)
        .where(col(PersonalToken.id) == tid, col(PersonalToken.revoked_at).is_(None))
        .values(revoked_at=utcnow(), revoked_by=(actor.name or actor.id or actor.channel)[:200])
        .returning(col(PersonalToken.id))
    )
    if done.first() is None:
        await session.refresh(found)
        return found, False
    await session.refresh(found)
    await audit.append(
        session, Action.TOKEN_REVOKED, actor=actor, detail={"token": tid, "person": found.person}
    )
    return found, True


async def use(session: AsyncSession, nonce: str) -> str | None:
    """Note the token carrying ``nonce`` used now; why it may not be (None: it may)."""
    now = utcnow()
    tid = token_id(nonce)
    used = await session.exec(
        sa.update(PersonalToken)
        .where(col(PersonalToken.id) == tid, col(PersonalToken.revoked_at).is_(None))
        .where(col(PersonalToken.expires_at) > now)
        .values(last_used_at=now)
        .returning(col(PersonalToken.id))
    )
    if used.first() is not None:
        return None
    found = (await session.exec(select(PersonalToken).where(col(PersonalToken.id) == tid))).first()
    if found is None:
        return (
            "this personal token is not one the server knows (made before tokens were listed, or forgotten)"
        )
    if found.revoked_at is not None:
        return "this personal token was revoked"
    return "this personal token has expired"
