"""Signed one-click links (the email channel's): what opening one shows, what confirming it does.

``GET /approve/{token}`` only reads: mail scanners and link previews open every link in
a message, so opening one must never decide anything. ``POST`` from the page it shows
(the form carries the token back; no cookie is involved) votes as the link's recipient
through :class:`signoff.app.requests.clicks.ClickService`, the path every channel's clicks take:
eligibility, quorum, grants, audit and card updates are the same code. A token is refused
when its signature or expiry fails; its vote is refused once the recipient has voted, once
the request is decided, and for anyone the gate does not list.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from signoff.app.bodies import without_unstorable
from signoff.app.models import Status
from signoff.app.requests.cards import build_card
from signoff.app.requests.eligibility import Voter, gates_of, same_voter
from signoff.app.requests.states import get_request
from signoff.app.requests.tally import votes_for
from signoff.app.requests.votes import describe_decided
from signoff.app.runtime import Runtime
from signoff.channels import MAX_REASON_CHARS, CallbackRejected, Card, Click, ClickAnswer, Verdict
from signoff.channels.email import LinkToken

__all__ = ["LinkPage", "answer_link", "open_link"]

log = logging.getLogger("signoff.links")

CHANNEL_TYPE = "email"
LINKED_TYPES = frozenset({"email", "ntfy"})
"""Channel types whose tokens this page answers: email links, and an ntfy notification's
Reject… when the gate wants a reason (the page has the field for it)."""
_REFUSED_TEXT = {
    "link expired": "This link has expired: the request's deadline has passed.",
}
_REFUSED_DEFAULT = "This link is not valid. Open it exactly as it arrived in your email."


@dataclass(frozen=True, slots=True)
class LinkPage:
    """What a link's page shows."""

    status_code: int
    title: str
    state: Literal["confirm", "done", "answered", "refused"]
    """``confirm``: the form; ``done``: this visit voted; ``answered``: nothing more to do here
    (decided, or already voted); ``refused``: the link or the vote was refused."""
    message: str | None = None
    card: Card | None = None
    token: str | None = None
    choice: str = ""
    """``approve``, ``grant`` or ``reject``."""
    choice_label: str = ""
    explain: str | None = None
    recipient: str = ""
    reason_required: bool = False
    error: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Opened:
    token: LinkToken
    card: Card | None
    answered: str | None
    """Why there is nothing to confirm (decided, already voted, no such request)."""
    recipient: str


_LINKS_OFF = LinkPage(404, "Links are off", "refused", "This server does not answer email links.")


def _refused(reason: str, status_code: int) -> LinkPage:
    return LinkPage(status_code, "Link not valid", "refused", _REFUSED_TEXT.get(reason, _REFUSED_DEFAULT))


async def _open(runtime: Runtime, text: str, now: datetime) -> _Opened | LinkPage:
    """Verify ``text`` and read the request as it stands; never writes."""
    signer = runtime.links
    if signer is None:
        return _LINKS_OFF
    try:
        token = signer.verify(text, now=now)
    except CallbackRejected as exc:
        log.warning("email link refused: %s", exc.reason)
        return _refused(exc.reason, exc.status_code)
    config = runtime.config
    channel = config.channels.get(token.channel)
    if channel is None or channel.type not in LINKED_TYPES:
        return LinkPage(404, "Link not valid", "refused", "This link's channel is no longer configured.")
    kind = channel.type
    person = config.person_for(kind, token.recipient)
    recipient = config.display_name(person) if person else token.recipient
    async with runtime.reads() as session:
        req = await get_request(session, token.request_id)
        votes = await votes_for(session, token.request_id) if req is not None else []
    if req is None:
        return LinkPage(404, "No such request", "refused", "This request no longer exists.")
    card = build_card(req, votes, config, kind, channel=token.channel, public_url=runtime.settings.public_url)
    if req.status != Status.PENDING:
        return _Opened(token, card, describe_decided(req), recipient)
    if req.expires_at <= now:
        return _Opened(token, card, "This request has already expired.", recipient)
    voter = Voter(token.channel, token.recipient, person=person)
    here = {i for i, g in enumerate(gates_of(req)) if g.channel == token.channel}
    mine = [v for v in votes if v.gate in here and same_voter(v, voter, config)]
    if mine:
        verdict = "approved" if mine[0].verdict == Verdict.APPROVE.value else "rejected"
        return _Opened(
            token, card, f"You already {verdict} this request; it is still waiting for others.", recipient
        )
    return _Opened(token, card, None, recipient)


def _choice_label(token: LinkToken, card: Card) -> tuple[str, str | None]:
    if token.grant is not None:
        return token.grant.label(), token.grant.explain(card.agent_id, card.tool_name)
    if token.verdict is Verdict.REJECT:
        return "Reject", f"{card.agent_id} will not be allowed to run {card.tool_name}."
    label = "Approve once" if card.grants else "Approve"
    return label, f"{card.agent_id} may run {card.tool_name} with these arguments, once."


def _confirm(opened: _Opened, text: str, *, error: str | None = None, reason: str = "") -> LinkPage:
    assert opened.card is not None
    label, explain = _choice_label(opened.token, opened.card)
    return LinkPage(
        422 if error else 200,
        f"{label}?",
        "confirm",
        card=opened.card,
        token=text,
        choice=opened.token.choice,
        choice_label=label,
        explain=explain,
        recipient=opened.recipient,
        reason_required=opened.token.verdict is Verdict.REJECT and opened.card.require_reject_reason,
        error=error,
        reason=reason,
    )


async def open_link(runtime: Runtime, text: str, *, now: datetime) -> LinkPage:
    """The page ``GET /approve/{text}`` shows. Reads only: state and audit log stay as they are."""
    opened = await _open(runtime, text, now)
    if isinstance(opened, LinkPage):
        return opened
    if opened.answered is not None:
        # An expired or cancelled request answers 410, as its form would (the callback contract).
        gone = opened.card is not None and opened.card.status in ("expired", "cancelled")
        return LinkPage(410 if gone else 200, "Nothing to do", "answered", opened.answered, card=opened.card)
    return _confirm(opened, text)


async def answer_link(
    runtime: Runtime,
    text: str,
    *,
    posted_token: str | None,
    reason: str | None,
    address: str,
    now: datetime,
) -> LinkPage:
    """What ``POST /approve/{text}`` does: vote as the link's recipient, with its choice.
    A refused link or form is counted and sampled into the audit log as from ``address``."""
    signer = runtime.links
    if signer is None:
        return _LINKS_OFF
    try:
        token = signer.verify(text, now=now)
    except CallbackRejected as exc:
        log.warning("email link refused: %s", exc.reason)
        await runtime.refusals.refuse(
            surface=CHANNEL_TYPE, channel=None, reason=exc.reason, address=address, size=len(text)
        )
        return _refused(exc.reason, exc.status_code)
    if posted_token != text:
        # Only the link's own page sends its token back in the form.
        await runtime.refusals.refuse(
            surface=CHANNEL_TYPE,
            channel=token.channel,
            reason="form without its link's token",
            address=address,
            size=len(text),
        )
        return LinkPage(
            400,
            "Form refused",
            "refused",
            "This form did not come from the link's page, so nothing was done. Open the link again.",
        )
    opened = await _open(runtime, text, now)
    if isinstance(opened, LinkPage):
        return opened
    # No column can hold NUL or a lone surrogate; nobody means to type one (as in the console).
    reason = without_unstorable(reason or "").strip()
    if len(reason) > MAX_REASON_CHARS:
        return _confirm(
            opened, text, error=f"A reason has at most {MAX_REASON_CHARS} characters.", reason=reason
        )
    if token.verdict is Verdict.APPROVE:
        reason = ""  # the approve form asks for none
    if opened.answered is None and token.verdict is Verdict.REJECT and opened.card is not None:
        if opened.card.require_reject_reason and not reason:
            return _confirm(opened, text, error="A reason is required to reject this request.")
    click = Click(
        request_id=token.request_id,
        verdict=token.verdict,
        user_id=token.recipient,
        reason=reason or None,
        identity={"link": token.choice},
        grant=token.grant,
    )
    outcome = await runtime.clicks.click(token.channel, click)
    # The callback contract: 200 recorded, 200 the same decision again (the page shows it as
    # it stands), 409 decided otherwise, 410 expired or cancelled.
    if outcome.accepted:
        title = {"approved": "Approved", "rejected": "Rejected"}.get(outcome.card.status, "Vote recorded")
        return LinkPage(200, title, "done", outcome.message, card=outcome.card)
    if outcome.answer is ClickAnswer.REPEATED:
        return LinkPage(200, "Already decided", "answered", outcome.message, card=outcome.card)
    code = outcome.answer.status_code
    return LinkPage(code, "Nothing was done", "refused", outcome.message, card=outcome.card)
