"""Decisions made by named operators (operator API, command line, console)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.config import SignoffConfig
from signoff.app.requests.eligibility import Voter, gates_of
from signoff.app.requests.grants import resolve_choice
from signoff.app.requests.states import get_request
from signoff.app.requests.votes import VoteResult, apply_vote
from signoff.channels import Assurance, GrantChoice, Verdict

__all__ = ["VIA_ASSURANCE", "GrantNamed", "decide", "operator_voter"]

VIA_ASSURANCE: dict[str, Assurance] = {
    "cli": Assurance.CLI_LOCAL,
    "api": Assurance.ADMIN_TOKEN,
    "console": Assurance.CONSOLE_PASSWORD,
}
"""How an operator deciding through each surface is identified, unless the surface says
(a console session signed in through OIDC says ``oidc``)."""


@dataclass(frozen=True, slots=True)
class GrantNamed:
    """A grant an operator names by scope and time (and ``same``, when given): one of those the
    request's gates offer, found once the request is read (see :func:`decide`)."""

    scope: str
    seconds: int
    same: Sequence[str] | None = None


def operator_voter(
    operator: str, config: SignoffConfig, *, via: str = "web", assurance: Assurance | None = None
) -> Voter:
    """``operator`` voting through the built-in web channel (operator API, CLI, console),
    identified at ``assurance`` (by default, what ``via`` implies)."""
    person = config.person_for("web", operator)
    return Voter(
        channel="web",
        user_id=operator,
        name=config.display_name(person) if person else operator,
        person=person,
        identity={"via": via},
        operator=True,
        assurance=assurance or VIA_ASSURANCE.get(via),
    )


async def decide(
    session: AsyncSession,
    request_id: str,
    *,
    verdict: Verdict,
    operator: str,
    config: SignoffConfig,
    reason: str | None = None,
    grant: GrantChoice | GrantNamed | None = None,
    arguments: Mapping[str, Any] | None = None,
    via: str = "web",
    voter: Voter | None = None,
) -> VoteResult | None:
    """Vote as ``operator`` through the built-in web channel, with the gate's approver rules
    (approving with ``grant``, or with ``arguments`` changed, when given), reading the request
    once, under lock. A named grant the gates do not offer is refused with nothing recorded.
    ``voter``: who votes, when the surface knows more than the operator's name (a console
    session signed in through OIDC: its groups, aliases and assurance). None if there is no
    such request."""
    req = await get_request(session, request_id, for_update=True)
    if req is None:
        return None
    if isinstance(grant, GrantNamed):
        found = resolve_choice(gates_of(req), scope=grant.scope, seconds=grant.seconds, same=grant.same)
        if isinstance(found, str):
            return VoteResult(False, found, req)
        grant = found
    return await apply_vote(
        session,
        req,
        voter=voter or operator_voter(operator, config, via=via),
        verdict=verdict,
        config=config,
        reason=reason,
        grant=grant,
        arguments=arguments,
    )
