"""Decisions with a personal token (``Authorization: Bearer sop_…``): the command line deciding
against a running server as the person who made the token in the console, at ``cli_token``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from signoff.app import queries, tokens
from signoff.app.console import auth
from signoff.app.db import transaction
from signoff.app.deps import Credentials, RuntimeDep
from signoff.app.operators import decide
from signoff.app.requests.eligibility import Voter
from signoff.app.routers import StrictJSONRoute, refusal
from signoff.app.schemas import Problem, RequestOut, Text, Unprocessable
from signoff.channels import MAX_REASON_CHARS, Assurance, Verdict

__all__ = ["router"]

router = APIRouter(prefix="/v1/me", tags=["people"], route_class=StrictJSONRoute)
ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": Problem}, 404: {"model": Problem}}
_MAKE_ONE = "make one in the console under Token (/ui/tokens)"


class PersonalDecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    reason: Text | None = Field(default=None, max_length=MAX_REASON_CHARS)


async def token_voter(request: Request, runtime: RuntimeDep, credentials: Credentials) -> Voter:
    """Who the personal token decides as; 401 for none, a forged, expired or revoked one, one
    the server has no row of, or one whose sign-in no longer holds. Each use is noted on the
    token (its ``last used``)."""

    def refused(why: str) -> HTTPException:
        return HTTPException(status.HTTP_401_UNAUTHORIZED, why, headers={"WWW-Authenticate": "Bearer"})

    raw = credentials.credentials if credentials is not None else None
    if raw is None or not raw.startswith(auth.TOKEN_PREFIX):
        raise refused(f"missing personal token: send `Authorization: Bearer sop_…` ({_MAKE_ONE})")
    found = auth.keys_of(request).decode_token(raw)
    if found is None:
        raise refused(f"this personal token is forged or has expired; {_MAKE_ONE}")
    voter = auth.voter_of(found, runtime.config, via="cli-token", assurance=Assurance.CLI_TOKEN)
    if voter is None:
        raise refused(
            f"this token's sign-in no longer holds (password or identity provider changed); {_MAKE_ONE}"
        )
    if await auth.ended(runtime, found):
        raise refused(f"this personal token was revoked; {_MAKE_ONE}")
    async with transaction(runtime.sessions) as session:
        why = await tokens.use(session, found.nonce)
    if why is not None:
        raise refused(f"{why}; {_MAKE_ONE}")
    return voter


TokenVoterDep = Annotated[Voter, Depends(token_voter)]


@router.post(
    "/requests/{request_id}/decision",
    response_model=RequestOut,
    responses={**ERRORS, 409: {"model": Problem}, 410: {"model": Problem}, 422: {"model": Unprocessable}},
)
async def decide_as_token_holder(
    request_id: str, body: PersonalDecisionIn, voter: TokenVoterDep, runtime: RuntimeDep
) -> RequestOut | JSONResponse:
    """Approve or reject as the token's person (a vote like any other). The callback contract:
    the same decision again answers 200 with the request as it stands; a refused or conflicting
    one 409; one on an expired or cancelled request 410."""
    async with transaction(runtime.sessions) as session:
        result = await decide(
            session,
            request_id,
            verdict=body.verdict,
            operator=voter.key,
            config=runtime.config,
            reason=body.reason,
            voter=voter,
        )
    if result is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no request {request_id!r}")
    if (refused := refusal(result)) is not None:
        return refused
    # Read once the decision has committed: the waiting agents answer first.
    async with runtime.reads() as reads:
        (shown,) = await queries.request_outs(reads, [result.request])
    return shown
