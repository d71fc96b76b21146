"""Turning a verified card callback into a :class:`Click`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from signoff.channels._assurance import Assurance
from signoff.channels._contract import (
    CallbackRejected,
    Click,
    GrantChoice,
    Identity,
    Verdict,
    edit_problem,
    parse_edit_value,
)

__all__ = ["IDENTITY", "MAX_REASON_CHARS", "REASON_FIELD", "EditRefused", "edit_field", "parse_click"]


class EditRefused(Exception):
    """The edit form held a value that cannot be an approved argument; the clicker is told why."""


def edit_field(index: int) -> str:
    """``name`` of the edit form's input for the ``index``-th field."""
    return f"edit_{index}"


REASON_FIELD = "reason"
"""``name`` of the rejection form's input; its text arrives in ``action.form_value``."""
MAX_REASON_CHARS = 1000
_VERDICTS = frozenset(verdict.value for verdict in Verdict)


def _unparseable(reason: str) -> CallbackRejected:
    return CallbackRejected(reason, status_code=400)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _unparseable(f"{what} is not an object")
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _button_value(action: Mapping[str, Any]) -> tuple[str, Verdict, GrantChoice | None]:
    value = action.get("value")
    if isinstance(value, str):
        # Legacy callbacks may carry the value as a JSON string.
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise _unparseable("action value is not an object") from None
    value = _object(value, "action value")
    request_id = _text(value.get("request_id"))
    if request_id is None:
        raise _unparseable("action value names no request")
    verdict = value.get("verdict")
    if not isinstance(verdict, str) or verdict not in _VERDICTS:
        raise _unparseable("action value has no known verdict")
    grant = None
    if "edit" in value and verdict != Verdict.APPROVE.value:
        raise _unparseable("changed arguments come with an approval")
    if "grant" in value:
        # Drawn by this app only on approvals; anything else is not one of its buttons.
        try:
            grant = GrantChoice.from_dict(value["grant"])
        except ValueError:
            raise _unparseable("action value names no grant") from None
        if verdict != Verdict.APPROVE.value:
            raise _unparseable("a grant is given with an approval")
    return request_id, Verdict(verdict), grant


def _edited(action: Mapping[str, Any]) -> dict[str, Any] | None:
    """The changed arguments the edit form submitted (None: not the edit form). The button's
    value lists each field with whether it held text; an empty input leaves its field as is."""
    value = action.get("value")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    fields = value.get("edit") if isinstance(value, dict) else None
    if fields is None:
        return None
    if not isinstance(fields, list):
        raise _unparseable("edit value is not a list of fields")
    form = action.get("form_value")
    form = form if isinstance(form, dict) else {}
    arguments: dict[str, Any] = {}
    for index, entry in enumerate(fields):
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise _unparseable("edit value names no fields")
        name, kind = entry
        typed = form.get(edit_field(index))
        if isinstance(typed, str) and typed != "":
            arguments[name] = parse_edit_value(typed, as_text=kind == "text")
    if (problem := edit_problem(arguments)) is not None:
        raise EditRefused(problem)
    return arguments


def _reason(action: Mapping[str, Any]) -> str | None:
    form = action.get("form_value")
    if not isinstance(form, dict):
        return None
    text = form.get(REASON_FIELD)
    if not isinstance(text, str) or not text.strip():
        return None
    return text.strip()[:MAX_REASON_CHARS]


IDENTITY = Identity(
    user_id=re.compile(r"^(ou|on)_[A-Za-z0-9]+$"), aliases=("union_id",), assurance=Assurance.FEISHU_SIGNED
)
"""A Feishu user is named by their ``open_id`` (``ou_…``, per app) or their ``union_id``
(``on_…``, the same across a developer's apps): a click names them by both."""


def _identity(**facts: object) -> dict[str, str]:
    return {key: value for key, value in facts.items() if isinstance(value, str) and value}


def parse_click(payload: Mapping[str, Any], *, legacy: bool = False) -> Click:
    """Parse a verified ``card.action.trigger`` (or, with ``legacy``, an old card callback).

    The clicker is identified by ``open_id`` (per app); ``union_id``, ``user_id``,
    ``tenant_key``, the delivery's ``event_id`` and the card's ``open_message_id`` go
    into ``identity`` for the audit trail, the card's ``open_chat_id`` into
    ``conversation``. The edit form's submit is an approval with the changed arguments.
    Raises :class:`CallbackRejected` (400) when the click does not name a request and a
    verdict, :class:`EditRefused` when an edited value cannot be approved.
    """
    if legacy:
        operator: Mapping[str, Any] = payload
        header: Mapping[str, Any] = {}
        action = _object(payload.get("action"), "action")
        context: Mapping[str, Any] = payload
    else:
        header = _object(payload.get("header"), "header")
        event = _object(payload.get("event"), "event")
        operator = _object(event.get("operator"), "operator")
        action = _object(event.get("action"), "action")
        context = _object(event.get("context") or {}, "context")

    open_id = _text(operator.get("open_id"))
    if open_id is None:
        raise _unparseable("click without an operator open_id")
    request_id, verdict, grant = _button_value(action)
    event_id = _text(header.get("event_id"))
    return Click(
        request_id=request_id,
        verdict=verdict,
        user_id=open_id,
        reason=_reason(action),
        event_id=event_id,
        identity=_identity(
            open_id=open_id,
            union_id=operator.get("union_id"),
            user_id=operator.get("user_id"),
            tenant_key=operator.get("tenant_key") or header.get("tenant_key"),
            event_id=event_id,
            open_message_id=context.get("open_message_id"),
        ),
        conversation=_text(context.get("open_chat_id")),
        grant=grant,
        arguments=_edited(action),
        # A member of an external group: their tenant is not the one the app is installed in.
        outsider=_outsider(_text(operator.get("tenant_key")), _text(header.get("tenant_key"))),
    )


def _outsider(own: str | None, here: str | None) -> bool:
    return own is not None and here is not None and own != here
