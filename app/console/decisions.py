"""Approve or reject from the console: a vote through the web channel as the signed-in operator."""

from __future__ import annotations

import json
from typing import Any

from sqlmodel.ext.asyncio.session import AsyncSession
from starlette.datastructures import FormData

from signoff.app.bodies import without_unstorable
from signoff.app.config import SignoffConfig
from signoff.app.console.auth import Flash, SignedIn
from signoff.app.console.pages import plausible_id
from signoff.app.operators import decide
from signoff.channels import MAX_REASON_CHARS, GrantChoice, Verdict, edit_problem, parse_edit_value

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
    arguments: dict[str, Any] = {}
    if verdict == Verdict.APPROVE.value:
        # ``edit:text:FIELD`` / ``edit:json:FIELD``: the approval form's inputs; empty ones
        # keep their field, unchanged ones are no change (the state machine compares).
        for key, typed in form.multi_items():
            kind, _, name = key.removeprefix("edit:").partition(":")
            if not key.startswith("edit:") or kind not in ("text", "json") or not name:
                continue
            if isinstance(typed, str) and typed != "":
                arguments[name] = parse_edit_value(without_unstorable(typed), as_text=kind == "text")
        if (problem := edit_problem(arguments)) is not None:
            return Flash(False, problem)
    result = await decide(
        session,
        request_id,
        verdict=Verdict(verdict),
        operator=who.person,
        config=config,
        reason=text or None,
        grant=grant,
        arguments=arguments or None,
        via="console",
        voter=who.voter,
    )
    if result is None:
        return None
    # The callback contract: the same decision again stands (shown as done); a conflicting or
    # late one names the final state and who made it.
    return Flash(result.answer.ok, result.message)
