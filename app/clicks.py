"""The server's :class:`signoff.channels.ClickHandler`: clicks from any channel become votes."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.config import SignoffConfig
from signoff.app.confirmations import Voter, build_card, cast_vote, votes_for
from signoff.app.db import transaction
from signoff.app.models import Vote
from signoff.channels import Card, Click, ClickOutcome

__all__ = ["ClickService"]


class ClickService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        config: SignoffConfig,
        *,
        reads: async_sessionmaker[AsyncSession] | None = None,
    ) -> None:
        self._sessions = sessions
        self._reads = reads or sessions
        self._config = config

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        kind = self._config.channel_type(channel)
        person = self._config.person_for(kind, click.user_id) or self._config.person_for(
            kind, click.identity.get("union_id", "")
        )
        voter = Voter(
            channel=channel,
            channel_type=kind,
            user_id=click.user_id,
            # The directory name for people it knows; the platform's name for everyone else.
            name=self._config.display_name(person) if person else click.user_name,
            person=person,
            identity={**click.identity, **({"event_id": click.event_id} if click.event_id else {})},
        )
        async with transaction(self._sessions) as session:
            result = await cast_vote(
                session,
                click.request_id,
                voter=voter,
                verdict=click.verdict,
                config=self._config,
                reason=click.reason,
            )
        if result is None:
            return ClickOutcome(False, "This request no longer exists.", _missing_card(click.request_id))
        # The card as committed, read after the write transaction has let go.
        async with self._reads() as session:
            votes = await votes_for(session, result.request.id)
        card = build_card(result.request, votes, self._config, kind)
        return ClickOutcome(result.accepted, result.message, card)

    async def enrich_identity(
        self, channel: str, user_id: str, *, name: str | None, email: str | None
    ) -> None:
        values: dict[str, str] = {}
        if name:
            values["name"] = name
        if email:
            values["email"] = email
        if not values:
            return
        async with transaction(self._sessions) as session:
            await session.exec(
                sa.update(Vote)
                .where(col(Vote.channel) == channel, col(Vote.user_id) == user_id)
                .values(**values)
            )


def _missing_card(request_id: str) -> Card:
    from datetime import UTC, datetime

    epoch = datetime.fromtimestamp(0, UTC)
    return Card(
        request_id=request_id,
        agent_id="",
        tool_name="",
        arguments={},
        status="cancelled",
        created_at=epoch,
        expires_at=epoch,
        quorum=1,
        approvers=(),
        reason="unknown request",
    )
