"""Decisions made by named operators (operator API, command line, console)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.config import SignoffConfig
from signoff.app.requests.eligibility import Voter, gates_of
from signoff.app.requests.grants import resolve_choice
from signoff.app.requests.states import get_request
from signoff.app.requests.votes import VoteResult, cast_vote
from signoff.channels import GrantChoice, Verdict

__all__ = ["decide", "operator_voter", "resolve_grant"]


async def resolve_grant(
    session: AsyncSession, request_id: str, *, scope: str, seconds: int, same: Sequence[str] | None
) -> GrantChoice | str | None:
    """The grant of the request's gates an operator names (by scope and time, and ``same`` when
    given), or why none is meant; None if there is no such request."""
    req = await get_request(session, request_id)
    if req is None:
        return None
    return resolve_choice(gates_of(req), scope=scope, seconds=seconds, same=same)


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
    grant: GrantChoice | None = None,
    arguments: Mapping[str, Any] | None = None,
    via: str = "web",
) -> VoteResult | None:
    """Vote as ``operator`` through the built-in web channel, with the gate's approver rules
    (approving with ``grant``, or with ``arguments`` changed, when given)."""
    voter = operator_voter(operator, config, via=via)
    return await cast_vote(
        session,
        request_id,
        voter=voter,
        verdict=verdict,
        config=config,
        reason=reason,
        grant=grant,
        arguments=arguments,
    )
