"""Turning a verified ``adaptiveCard/action`` invoke into a :class:`Click`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from signoff.channels._assurance import Assurance
from signoff.channels._contract import (
    MAX_REASON_CHARS,
    CallbackRejected,
    Click,
    GrantChoice,
    Identity,
    Verdict,
    edit_problem,
    parse_edit_value,
)
from signoff.channels.teams._card import GRANT_INPUT, ONCE, REASON_INPUT, edit_input_id
from signoff.channels.teams._config import GUID

__all__ = ["IDENTITY", "EditRefused", "base_conversation", "loose", "parse_invoke"]


IDENTITY = Identity(user_id=GUID, assurance=Assurance.TEAMS_JWT)
"""A Teams user is named by their Microsoft Entra object id (``from.aadObjectId``, a GUID):
the same in every team and chat of the tenant, and what ``people`` carry as ``teams:``."""

TEAMS_CHANNEL_ID = "msteams"
"""The ``channelId`` of an activity from Microsoft Teams."""
_VERDICTS = frozenset(verdict.value for verdict in Verdict)
_MESSAGE_ID = re.compile(r";messageid=\d+$")


class EditRefused(Exception):
    """The edit form held a value that cannot be an approved argument; the clicker is told why."""


def _bad(reason: str) -> CallbackRejected:
    return CallbackRejected(reason, status_code=400)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{what} is not an object")
    return value


def loose(value: object) -> Mapping[str, Any]:
    """``value`` if it is an object, else an empty one (for fields that may be missing)."""
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def base_conversation(conversation_id: str) -> str:
    """A channel thread's conversation id without its ``;messageid=…`` (the channel's own id)."""
    return _MESSAGE_ID.sub("", conversation_id)


def _grant(data: Mapping[str, Any]) -> GrantChoice | None:
    chosen = data.get(GRANT_INPUT)
    if chosen is None or chosen == ONCE or "edit" in data:
        return None  # "Edit and approve" approves once, as on every channel
    if not isinstance(chosen, str):
        raise _bad("grant choice is not text")
    try:
        return GrantChoice.from_dict(json.loads(chosen))
    except (ValueError, RecursionError):
        raise _bad("grant choice names no grant") from None


def _edited(data: Mapping[str, Any]) -> dict[str, Any] | None:
    fields = data.get("edit")
    if fields is None:
        return None
    if not isinstance(fields, list):
        raise _bad("edit data is not a list of fields")
    arguments: dict[str, Any] = {}
    for index, entry in enumerate(fields):
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise _bad("edit data names no fields")
        name, kind = entry
        typed = data.get(edit_input_id(index))
        if isinstance(typed, str) and typed != "":
            arguments[name] = parse_edit_value(typed, as_text=kind == "text")
    if (problem := edit_problem(arguments)) is not None:
        raise EditRefused(problem)
    return arguments


def _reason(data: Mapping[str, Any]) -> str | None:
    text = data.get(REASON_INPUT)
    if not isinstance(text, str) or not text.strip():
        return None
    return text.strip()[:MAX_REASON_CHARS]


def parse_invoke(activity: Mapping[str, Any], *, tenant_id: str) -> Click:
    """The click in a verified ``adaptiveCard/action`` invoke from ``tenant_id``.

    The clicker is ``from.aadObjectId``; their Teams id, name and tenant, the invoke's id
    and the card's message id (``replyToId``) go into ``identity`` for the audit trail,
    the conversation (without a thread's ``;messageid=``) into ``conversation``. The verb
    is the verdict; the data names the request, and carries the reason, the grant chosen
    and the edited values as Teams merged the card's inputs into it. Raises
    :class:`CallbackRejected` (400) for an invoke that is not one of this app's cards'
    (403 from another tenant, or from another Bot Framework channel than Teams),
    :class:`EditRefused` when an edited value cannot be approved.
    """
    if activity.get("channelId") != TEAMS_CHANNEL_ID:
        # The connector signs what every channel of the bot delivers; on Web Chat and Direct
        # Line the page writes `from` and `channelData` itself. Only Teams vouches for them.
        raise CallbackRejected("invoke from another Bot Framework channel than Teams", status_code=403)
    value = _object(activity.get("value"), "invoke value")
    action = _object(value.get("action"), "invoke action")
    if action.get("type") != "Action.Execute":
        raise _bad("invoke is not an Action.Execute")
    verb = action.get("verb")
    if not isinstance(verb, str) or verb not in _VERDICTS:
        raise _bad("Action.Execute has no known verb")
    data = _object(action.get("data") or {}, "action data")
    request_id = _text(data.get("request_id"))
    if request_id is None:
        raise _bad("action data names no request")
    sender = _object(activity.get("from"), "from")
    conversation = _object(activity.get("conversation"), "conversation")
    tenant = loose(loose(activity.get("channelData")).get("tenant"))
    clicker_tenant = _text(conversation.get("tenantId")) or _text(tenant.get("id"))
    if clicker_tenant is None or clicker_tenant.lower() != tenant_id.lower():
        raise CallbackRejected("invoke from another tenant", status_code=403)
    aad = _text(sender.get("aadObjectId"))
    if aad is None or not GUID.match(aad):
        raise _bad("invoke names no clicker (from.aadObjectId)")
    conversation_id = _text(conversation.get("id"))
    verdict = Verdict(verb)
    arguments = _edited(data)
    if arguments is not None and verdict is not Verdict.APPROVE:
        raise _bad("changed arguments come with an approval")
    grant = _grant(data) if verdict is Verdict.APPROVE else None
    facts = {
        "aad_object_id": aad.lower(),
        "teams_user_id": sender.get("id"),
        "tenant_id": clicker_tenant.lower(),
        "activity_id": activity.get("id"),
        "message_id": activity.get("replyToId"),
    }
    return Click(
        request_id=request_id,
        verdict=verdict,
        user_id=aad.lower(),
        user_name=_text(sender.get("name")),
        reason=_reason(data) if verdict is Verdict.REJECT else None,
        event_id=_text(activity.get("id")),
        identity={k: v for k, v in facts.items() if isinstance(v, str) and v},
        conversation=base_conversation(conversation_id) if conversation_id else None,
        grant=grant,
        arguments=arguments,
    )
