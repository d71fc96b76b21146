"""Decisions made by named operators (operator API, command line, console)."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.config import SignoffConfig
from signoff.app.eligibility import Voter
from signoff.app.votes import VoteResult, cast_vote
from signoff.channels import Verdict

__all__ = ["decide", "operator_voter"]


def operator_voter(operator: str, config: SignoffConfig, *, via: str = "web") -> Voter:
    """``operator`` voting through the built-in web channel (operator API, CLI, console)."""
    person = config.person_for("web", operator)
    return Voter(
        channel="web",
        user_id=operator,
        name=config.display_name(person) if person else operator,
        person=person,
        identity={"via": via},
        operator=True,
    )


async def decide(
    session: AsyncSession,
    request_id: str,
    *,
    verdict: Verdict,
    operator: str,
    config: SignoffConfig,
    reason: str | None = None,
    via: str = "web",
) -> VoteResult | None:
    """Vote as ``operator`` through the built-in web channel, with the gate's approver rules."""
    voter = operator_voter(operator, config, via=via)
    return await cast_vote(session, request_id, voter=voter, verdict=verdict, config=config, reason=reason)
