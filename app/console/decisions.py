"""Approve or reject from the console: a vote through the web channel as the signed-in operator."""

from __future__ import annotations

import json

from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.datastructures import FormData

from signoff.app.bodies import without_unstorable
from signoff.app.config import SignoffConfig
from signoff.app.console.auth import Flash, SignedIn
from signoff.app.console.pages import plausible_id
from signoff.app.operators import decide
from signoff.channels import MAX_REASON_CHARS, GrantChoice, Verdict

__all__ = ["decide_from_form"]


async def decide_from_form(
    session: AsyncSession, request_id: str, *, form: FormData, who: SignedIn, config: SignoffConfig
) -> Flash | None:
    """Cast the operator's vote; the message to show, or None if there is no such request.

    A refused vote (not an approver, already decided, …) is audited by the state
    machine and comes back as a message, like a toast in chat.
    """
    verdict = form.get("verdict")
    if verdict not in (Verdict.APPROVE.value, Verdict.REJECT.value):
        return Flash(False, "Choose Approve or Reject.")
    if not plausible_id(request_id):
        return None
    reason = form.get("reason")
    # No column can hold NUL or a lone surrogate; nobody means to type one.
    text = without_unstorable(reason).strip() if isinstance(reason, str) else ""
    if len(text) > MAX_REASON_CHARS:
        return Flash(False, f"The reason is too long (at most {MAX_REASON_CHARS} characters).")
    grant: GrantChoice | None = None
    chosen = form.get("grant")
    if verdict == Verdict.APPROVE.value and isinstance(chosen, str) and chosen.strip():
        try:
            grant = GrantChoice.from_dict(json.loads(chosen))
        except (ValueError, RecursionError):
            return Flash(False, "That grant is not one this request offers.")
    result = await decide(
        session,
        request_id,
        verdict=Verdict(verdict),
        operator=who.person,
        config=config,
        reason=text or None,
        grant=grant,
        via="console",
    )
    if result is None:
        return None
    return Flash(result.accepted, result.message)
