"""Callback verification and payload parsing (pure functions: raw body + headers + clock in)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from signoff.channels._contract import (
    CallbackRejected,
    Click,
    GrantChoice,
    Verdict,
    edit_problem,
    parse_edit_value,
)
from signoff.channels.slack._blocks import (
    ACTION_APPROVE,
    ACTION_EDIT,
    ACTION_GRANT,
    ACTION_REJECT,
    EDIT_ACTION_ID,
    EDIT_MODAL_CALLBACK_ID,
    REASON_ACTION_ID,
    REASON_BLOCK_ID,
    REJECT_MODAL_CALLBACK_ID,
    edit_block_id,
)

__all__ = [
    "MAX_BODY_BYTES",
    "SIGNATURE_WINDOW_SECONDS",
    "EditPress",
    "EditSubmission",
    "actions_of",
    "click_from_block_actions",
    "click_from_view_submission",
    "edit_from_view_submission",
    "edit_press",
    "lower_headers",
    "parse_payload",
    "verify_request",
]

SIGNATURE_WINDOW_SECONDS = 300
MAX_BODY_BYTES = 1024 * 1024
"""Slack interactivity payloads are a few kilobytes; anything this large is not from Slack."""

_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-fA-F]{64}")
_VERDICTS = {ACTION_APPROVE: Verdict.APPROVE, ACTION_REJECT: Verdict.REJECT}


def lower_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Header names are case-insensitive; Slack's letter case must not be assumed."""
    return {key.lower(): value for key, value in headers.items()}


def verify_request(body: bytes, headers: Mapping[str, str], signing_secret: str, now: float) -> None:
    """Check Slack's ``v0`` signature over the raw body; raise :class:`CallbackRejected` if it fails.

    The signature is ``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}`` keyed with
    the signing secret; the timestamp must be within five minutes of ``now``.
    Missing or malformed headers, a non-numeric timestamp and a body that is
    not UTF-8 are rejections (401), as is a body over :data:`MAX_BODY_BYTES` (413).
    """
    if len(body) > MAX_BODY_BYTES:
        raise CallbackRejected(f"body of {len(body)} bytes is over the limit", status_code=413)
    lowered = lower_headers(headers)
    timestamp = lowered.get("x-slack-request-timestamp")
    signature = lowered.get("x-slack-signature")
    if timestamp is None or signature is None:
        raise CallbackRejected("missing X-Slack-Request-Timestamp or X-Slack-Signature")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise CallbackRejected("malformed X-Slack-Request-Timestamp")
    if abs(now - int(timestamp)) > SIGNATURE_WINDOW_SECONDS:
        raise CallbackRejected("X-Slack-Request-Timestamp outside the five-minute window")
    if not _SIGNATURE.fullmatch(signature):
        raise CallbackRejected("malformed X-Slack-Signature")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise CallbackRejected("body is not UTF-8") from None
    base = b"v0:" + timestamp.encode("ascii") + b":" + body
    expected = "v0=" + hmac.new(signing_secret.encode("utf-8"), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode("ascii"), signature.lower().encode("ascii")):
        raise CallbackRejected("signature mismatch")


def parse_payload(body: bytes) -> dict[str, Any]:
    """The JSON object of a verified callback.

    Interactivity posts a form whose ``payload`` field is JSON; Events API
    checks (``url_verification``) post JSON directly; ``ssl_check=1`` comes as a
    bare form. Anything else is a :class:`CallbackRejected` with status 400.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise CallbackRejected("body is not UTF-8", status_code=400) from None
    if text.lstrip().startswith("{"):
        data = _json(text)
    else:
        form = parse_qs(text, keep_blank_values=True)
        payload = form.get("payload")
        if payload is None:
            if form.get("ssl_check") == ["1"]:
                return {"type": "ssl_check"}
            raise CallbackRejected("form has no payload field", status_code=400)
        if len(payload) != 1:
            raise CallbackRejected("form has more than one payload field", status_code=400)
        data = _json(payload[0])
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise CallbackRejected("payload is not an object with a type", status_code=400)
    return data


def actions_of(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The objects among a ``block_actions`` payload's ``actions``: none when it is missing or
    not a list (a number or ``true`` is no press of any button)."""
    actions = payload.get("actions")
    if not isinstance(actions, list):
        return []
    return [action for action in actions if isinstance(action, Mapping)]


def _grant_press(value: str | None) -> tuple[str, GrantChoice]:
    """The request and the grant a grant button's ``value`` names; a value that does not name
    both is refused (400): it was not drawn by :func:`~signoff.channels.slack._blocks.grant_value`."""
    data = _json(value or "")
    if not isinstance(data, Mapping):
        raise CallbackRejected("grant button value is not an object", status_code=400)
    request_id = _str(data, "request_id")
    try:
        grant = GrantChoice.from_dict(data.get("grant"))
    except ValueError:
        grant = None
    if request_id is None or grant is None or set(data) != {"request_id", "grant"}:
        raise CallbackRejected("grant button value does not name a request and a grant", status_code=400)
    return request_id, grant


def click_from_block_actions(payload: Mapping[str, Any]) -> Click | None:
    """The Approve, grant or Reject press in a ``block_actions`` payload, or ``None`` if it holds none.

    A grant button (``signoff_grant.N``) is an approval that gives the grant its value names
    (the server checks that the gate offers it); a value that names no grant is refused.

    The clicker's user id, team, enterprise and ``action_ts`` (and the card's
    channel and message, when the button was on a message) go into
    :attr:`Click.identity`; ``event_id`` is ``action_ts:user_id``, which a
    redelivery repeats and a second click does not.
    """
    user = _obj(payload, "user")
    user_id = _str(user, "id")
    if user_id is None:
        return None
    for action in actions_of(payload):
        action_id = _str(action, "action_id") or ""
        verdict = _VERDICTS.get(action_id)
        request_id = _str(action, "value")
        grant = None
        if action_id.startswith(ACTION_GRANT + "."):
            verdict = Verdict.APPROVE
            request_id, grant = _grant_press(request_id)
        if verdict is None or request_id is None:
            continue
        action_ts = _str(action, "action_ts")
        container = _obj(payload, "container")
        identity = _identity(payload, user)
        _put(identity, "action_ts", action_ts)
        _put(identity, "channel_id", _str(_obj(payload, "channel"), "id") or _str(container, "channel_id"))
        _put(identity, "message_ts", _str(container, "message_ts"))
        return Click(
            request_id=request_id,
            verdict=verdict,
            user_id=user_id,
            user_name=_user_name(user),
            event_id=f"{action_ts}:{user_id}" if action_ts else None,
            identity=identity,
            conversation=identity.get("channel_id"),
            grant=grant,
            outsider=_outsider(payload, user),
        )
    return None


@dataclass(frozen=True, slots=True)
class EditPress:
    """A press of "Edit and approve": the modal to open, for whom, from which card."""

    request_id: str
    user_id: str
    trigger_id: str | None
    channel_id: str | None
    event_id: str | None


def edit_press(payload: Mapping[str, Any]) -> EditPress | None:
    """The "Edit and approve" press in a ``block_actions`` payload, or ``None``."""
    user_id = _str(_obj(payload, "user"), "id")
    if user_id is None:
        return None
    for action in actions_of(payload):
        if action.get("action_id") != ACTION_EDIT:
            continue
        request_id = _str(action, "value")
        if request_id is None:
            return None
        action_ts = _str(action, "action_ts")
        container = _obj(payload, "container")
        return EditPress(
            request_id=request_id,
            user_id=user_id,
            trigger_id=_str(payload, "trigger_id"),
            channel_id=_str(_obj(payload, "channel"), "id") or _str(container, "channel_id"),
            event_id=f"{action_ts}:{user_id}" if action_ts else None,
        )
    return None


@dataclass(frozen=True, slots=True)
class EditSubmission:
    """What the edit modal's ``view_submission`` holds: the approval with changes, or, when a
    value cannot be one, why (shown on the modal, nothing applied)."""

    click: Click | None
    problem: str | None = None


def _our_view(
    payload: Mapping[str, Any], callback_id: str
) -> tuple[Mapping[str, Any], str, Mapping[str, Any], str, Mapping[str, Any], str] | None:
    """A submission of our modal ``callback_id``: the user, their id, the view, its id, its
    private metadata and the request it names; ``None`` if it is not one."""
    user = _obj(payload, "user")
    user_id = _str(user, "id")
    view = _obj(payload, "view")
    view_id = _str(view, "id")
    if user_id is None or view_id is None or view.get("callback_id") != callback_id:
        return None
    try:
        metadata = json.loads(_str(view, "private_metadata") or "")
    except (ValueError, RecursionError):
        return None
    if not isinstance(metadata, Mapping):
        return None
    request_id = _str(metadata, "request_id")
    if request_id is None:
        return None
    return user, user_id, view, view_id, metadata, request_id


def edit_from_view_submission(payload: Mapping[str, Any]) -> EditSubmission | None:
    """The approval with changes submitted from the edit modal, or ``None`` if the view is
    not that modal. Each input is read back as :func:`~signoff.channels.parse_edit_value`
    reads it (a field that held text stays text); an empty input leaves its field as it was.
    ``event_id`` names the view and what was submitted."""
    submitted = _our_view(payload, EDIT_MODAL_CALLBACK_ID)
    if submitted is None:
        return None
    user, user_id, view, view_id, metadata, request_id = submitted
    fields = metadata.get("fields")
    if not isinstance(fields, list):
        return None
    values = _obj(_obj(view, "state"), "values")
    arguments: dict[str, Any] = {}
    for index, entry in enumerate(fields):
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            return None
        name, kind = entry
        typed = _obj(values.get(edit_block_id(index)), EDIT_ACTION_ID).get("value")
        if isinstance(typed, str) and typed != "":
            arguments[name] = parse_edit_value(typed, as_text=kind == "text")
    identity = _identity(payload, user)
    _put(identity, "view_id", view_id)
    _put(identity, "channel_id", _str(metadata, "channel_id"))
    if (problem := edit_problem(arguments)) is not None:
        return EditSubmission(None, problem)
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).hexdigest()[:16]
    click = Click(
        request_id=request_id,
        verdict=Verdict.APPROVE,
        user_id=user_id,
        user_name=_user_name(user),
        event_id=f"{view_id}:{digest}",
        identity=identity,
        conversation=identity.get("channel_id"),
        arguments=arguments,
        outsider=_outsider(payload, user),
    )
    return EditSubmission(click)


def click_from_view_submission(payload: Mapping[str, Any]) -> Click | None:
    """The rejection submitted from the reason modal, or ``None`` if the view is not ours.

    A blank reason is ``None``. ``event_id`` names the view and the reason, so
    a resubmission after a validation error is a new event but a redelivery is not.
    """
    submitted = _our_view(payload, REJECT_MODAL_CALLBACK_ID)
    if submitted is None:
        return None
    user, user_id, view, view_id, metadata, request_id = submitted
    values = _obj(_obj(view, "state"), "values")
    raw_reason = _obj(_obj(values, REASON_BLOCK_ID), REASON_ACTION_ID).get("value")
    reason = raw_reason.strip() if isinstance(raw_reason, str) and raw_reason.strip() else None
    identity = _identity(payload, user)
    _put(identity, "view_id", view_id)
    _put(identity, "channel_id", _str(metadata, "channel_id"))
    reason_digest = hashlib.sha256((reason or "").encode()).hexdigest()[:16]
    return Click(
        request_id=request_id,
        verdict=Verdict.REJECT,
        user_id=user_id,
        user_name=_user_name(user),
        reason=reason,
        event_id=f"{view_id}:{reason_digest}",
        identity=identity,
        # Set by this app when it opened the modal from the card's Reject button.
        conversation=identity.get("channel_id"),
        outsider=_outsider(payload, user),
    )


def _identity(payload: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, str]:
    team = _obj(payload, "team")
    enterprise = _obj(payload, "enterprise")
    identity: dict[str, str] = {}
    _put(identity, "user_id", _str(user, "id"))
    _put(identity, "username", _str(user, "username"))
    # Org-wide installs send ``team: null``; the user's own team is then the best we have.
    _put(identity, "team_id", _str(team, "id") or _str(user, "team_id"))
    _put(identity, "enterprise_id", _str(enterprise, "id") or _str(team, "enterprise_id"))
    if _outsider(payload, user):
        _put(identity, "user_team_id", _str(user, "team_id"))
    return identity


def _outsider(payload: Mapping[str, Any], user: Mapping[str, Any]) -> bool:
    """Whether the clicker's own workspace (``user.team_id``) is not the one the app is in
    (``team.id``): a member of another organisation in a shared channel (Slack Connect)."""
    own, here = _str(user, "team_id"), _str(_obj(payload, "team"), "id")
    return own is not None and here is not None and own != here


def _user_name(user: Mapping[str, Any]) -> str | None:
    return _str(user, "name") or _str(user, "username")


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise CallbackRejected("payload is not JSON", status_code=400) from None


def _obj(data: Any, key: str) -> Mapping[str, Any]:
    value = data.get(key) if isinstance(data, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _str(data: Any, key: str) -> str | None:
    value = data.get(key) if isinstance(data, Mapping) else None
    return value if isinstance(value, str) and value else None


def _put(target: dict[str, str], key: str, value: str | None) -> None:
    if value is not None:
        target[key] = value
