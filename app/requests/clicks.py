"""The server's :class:`signoff.channels.ClickHandler`: clicks from any channel become votes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel import col
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.bodies import storable
from signoff.app.channel_types import identity_of, is_chat
from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.deliveries import CARD_REF
from signoff.app.models import ConfirmationRequest, Status, Vote, utcnow
from signoff.app.requests.cards import build_card
from signoff.app.requests.eligibility import (
    NOT_HERE,
    GateSnapshot,
    Voter,
    card_gates,
    eligible_gates,
    gates_of,
)
from signoff.app.requests.states import get_request
from signoff.app.requests.tally import forget, votes_for
from signoff.app.requests.votes import VoteResult, apply_vote, refuse_vote
from signoff.channels import Card, Channel, Click, ClickAnswer, ClickOutcome, InteractiveChannel, MessageRef

__all__ = ["LOOKUP_SECONDS", "ClickService"]

log = logging.getLogger("signoff.clicks")

LOOKUP_SECONDS = 1.5
"""How long a clicker's look-up may take (Slack and Feishu want an answer within 3 s)."""

_CHANNEL_GONE = "This channel is no longer configured in Signoff, so a click here does not count."
_LOOK_UP = "look the clicker up"
"""What :meth:`ClickService._refusal` answers when only the clicker's email can tell."""


class ClickService:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        config: SignoffConfig,
        *,
        reads: async_sessionmaker[AsyncSession] | None = None,
        channels: Mapping[str, Channel] | None = None,
        public_url: str | None = None,
    ) -> None:
        """``public_url``: ``SIGNOFF_PUBLIC_URL``, for the cards' links to the console."""
        self._sessions = sessions
        self._reads = reads or sessions
        self._config = config
        self._channels = channels or {}
        self._public_url = public_url

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        """Apply one click in one unit of work, reading its request once (under lock): where
        it came from, the vote, the transition. A decision wakes the agents waiting on it as
        it commits (:func:`signoff.app.db.wake_after_commit`); the card is drawn after."""
        kind = self._config.channel_type(channel)
        voter = self._voter(channel, kind, click)
        target = self._channels.get(channel)
        interactive = target if isinstance(target, InteractiveChannel) else None
        async with transaction(self._sessions) as session:
            req = await get_request(session, click.request_id, for_update=True)
            if req is None:
                return _no_request(click)
            why = await self._refusal(session, req, channel, kind, interactive, voter, click)
            voted = None
            if why is not _LOOK_UP or interactive is None:
                voted = await self._apply(session, req, voter, click, why)
        if voted is None:
            # Only the platform can say whether the clicker is the requester: ask it outside
            # any transaction (never with the request locked), then vote in a unit of work of
            # its own.
            assert interactive is not None
            voter, refused = await self._with_email(interactive, voter)
            async with transaction(self._sessions) as session:
                req = await get_request(session, click.request_id, for_update=True)
                if req is None:
                    return _no_request(click)
                voted = await self._apply(session, req, voter, click, refused)
        # The card is drawn once the vote has committed (the waiting agents answer first),
        # from the votes as they are then.
        async with self._reads() as session:
            votes = await votes_for(session, voted.request.id)
        card = build_card(
            voted.request, votes, self._config, kind, channel=channel, public_url=self._public_url
        )
        return ClickOutcome(voted.accepted, voted.message, card, voted.answer)

    async def _refusal(
        self,
        session: AsyncSession,
        req: ConfirmationRequest,
        channel: str,
        kind: str,
        target: InteractiveChannel | None,
        voter: Voter,
        click: Click,
    ) -> str | None:
        """Why the click cannot count, found before voting (None: let the state machine say),
        or :data:`_LOOK_UP` when the clicker's email must be looked up first."""
        if kind == "web":
            return NOT_HERE  # decided in Signoff itself, by operators: there is no card to click
        if target is None:
            # A chat click whose channel a reload removed while the click was on its way: where
            # its card is can no longer be checked, so it does not count.
            return _CHANNEL_GONE if is_chat(kind) and channel not in self._channels else None
        every = gates_of(req)
        here = card_gates(every, channel, created_at=req.created_at, now=utcnow())
        if not here:
            return None  # a card of another channel: the state machine refuses it (audited there)
        gates = [every[i] for i in here]
        why = _elsewhere(target, await _posted_card(session, req.id, channel), click)
        if why is None and self._needs_email(req, gates, voter):
            return _LOOK_UP
        return why

    async def _apply(
        self, session: AsyncSession, req: ConfirmationRequest, voter: Voter, click: Click, why: str | None
    ) -> VoteResult:
        """The vote (or its refusal) on the locked ``req``."""
        if why is not None:
            return await refuse_vote(
                session, req, voter=voter, verdict=click.verdict, why=why, reason=click.reason
            )
        return await apply_vote(
            session,
            req,
            voter=voter,
            verdict=click.verdict,
            config=self._config,
            reason=click.reason,
            grant=click.grant,
            arguments=click.arguments,
        )

    def _voter(self, channel: str, kind: str, click: Click) -> Voter:
        known = (self._config.person_for(kind, uid) for uid in identity_of(kind).clicker_ids(click))
        person = next((p for p in known if p is not None), None)
        return Voter(
            channel=channel,
            user_id=click.user_id,
            # The directory name for people it knows; the platform's name for everyone else.
            name=self._config.display_name(person) if person else click.user_name,
            person=person,
            identity={**click.identity, **({"event_id": click.event_id} if click.event_id else {})},
            assurance=identity_of(kind).assurance,
            outsider=click.outsider,
        )

    def _needs_email(self, req: ConfirmationRequest, gates: list[GateSnapshot], voter: Voter) -> bool:
        """Whether the clicker's email could show the call was made for them: the request
        is open and names someone, a gate of this card the clicker may otherwise vote on
        forbids self-approval, and the ids alone do not tell (when both are people of the
        directory, the directory has already told)."""
        requesters = (req.requester, req.user_id)
        if req.status != Status.PENDING or not any(requesters):
            return False
        eligible, _ = eligible_gates(
            gates,
            requesters=requesters,
            voter=voter,
            config=self._config,
            created_at=req.created_at,
            now=utcnow(),
        )
        if all(gates[i].allow_self_approval for i in eligible):
            return False  # no gate to vote on (refused anyway), or self-approval is allowed
        return voter.person is None or not any(self._config.recognise(r) for r in requesters)

    async def _with_email(self, target: InteractiveChannel, voter: Voter) -> tuple[Voter, str | None]:
        """``voter`` with the email ``target`` knows for them, or why the click is refused."""
        try:
            async with asyncio.timeout(LOOKUP_SECONDS):
                _, email = await target.lookup_user(voter.user_id)
        except Exception as exc:  # unreachable, refused, too slow: nobody may vouch for the clicker
            log.warning("looking up %s on %s failed: %r", voter.user_id, target.name, exc)
            return voter, "Signoff could not look up who you are; please try again."
        return replace(voter, email=email), None

    async def current_card(self, channel: str, request_id: str) -> Card | None:
        if not storable(request_id):
            return None  # no request is named so (and no database could be asked about it)
        kind = self._config.channel_type(channel)
        async with self._reads() as session:
            req = await get_request(session, request_id)
            if req is None:
                return None
            votes = await votes_for(session, request_id)
        return build_card(req, votes, self._config, kind, channel=channel, public_url=self._public_url)

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
            forget(session)
            await session.exec(
                sa.update(Vote)
                .where(col(Vote.channel) == channel, col(Vote.user_id) == user_id)
                .values(**values)
            )


async def _posted_card(session: AsyncSession, request_id: str, channel: str) -> MessageRef | None:
    """Where the request's card was posted on ``channel`` (None until it is): by its post, or
    by the escalation that brought it there."""
    ref = (await session.exec(CARD_REF, params={"request_id": request_id, "channel": channel})).first()
    return {str(k): str(v) for k, v in ref.items()} if ref else None


def _elsewhere(target: InteractiveChannel, posted: MessageRef | None, click: Click) -> str | None:
    """Why a click on ``target`` does not count for the card posted there as ``posted``: it
    came from another conversation (or did not say which)."""
    conversation = target.conversation_of(posted)
    if conversation is not None and click.conversation != conversation:
        return NOT_HERE
    return None


def _no_request(click: Click) -> ClickOutcome:
    return ClickOutcome(
        False, "This request no longer exists.", _missing_card(click.request_id), ClickAnswer.MISSING
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
