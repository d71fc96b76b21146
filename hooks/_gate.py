"""The sans-I/O core of the Signoff gate client.

Nothing here opens a socket or sleeps. :func:`gate_flow` is a generator that
*yields* what it wants done (an :class:`HttpCall` to send or a :class:`Pause`)
and is *sent* what happened (an :class:`HttpReply`, a :class:`TransportFailure`,
or ``None`` after a pause). It returns the final :class:`GateDecision`. The
sync and async clients in :mod:`signoff.hooks.client` only drive it, so both share one
state machine: submit → (pending) long-poll ``/wait`` → decision, re-attaching
by request id after dropped connections and 5xx answers until the deadline. An
approval only tells the client to ask again: the call is sent once more under its
idempotency key, and Signoff's answer to it (the decision kernel's, over the grants
and gates in force then) is the decision.

Every path that is not an explicit allow from the server ends in a deny.

The Claude Code hook imports this module in a new process for every tool call, so it
imports little: its records are ``NamedTuple``s (not dataclasses, whose import costs
more than the rest of the module) made without importing ``typing``
(:mod:`signoff.hooks._records`), and what only some paths need is imported there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping
from enum import StrEnum
from types import MappingProxyType

from signoff.hooks._decision import Decision

TYPE_CHECKING = False  # ``typing`` is not imported at run time (see signoff.hooks._records)
if TYPE_CHECKING:
    from typing import Any, Literal, NamedTuple

    FailureKind = Literal["refused", "dns", "tls", "timeout", "other"]
else:
    from signoff.hooks._records import NamedTuple

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_POLL_TIMEOUT",
    "FlowSettings",
    "GateConfigError",
    "GateDecision",
    "GateDenied",
    "GateFailure",
    "GateTimeout",
    "GateUnavailable",
    "HttpCall",
    "HttpReply",
    "Pause",
    "ReportAnswer",
    "ToolCall",
    "TransportFailure",
    "approved_edits",
    "cancel_flow",
    "canonical_json",
    "describe_changes",
    "describe_request",
    "gate_flow",
    "interpret_request",
    "interpret_submit",
    "json_safe",
    "key_digest",
    "make_idempotency_key",
    "report_body",
    "report_flow",
    "seconds_text",
    "settle_request",
    "transport_failure",
    "unreachable_reason",
    "waiting_on",
]

DEFAULT_DEADLINE = 3600.0
"""Seconds a call may wait for a decision, all retries included."""
DEFAULT_POLL_TIMEOUT = 25.0
"""Seconds the server holds one ``/wait`` long-poll open."""
DEFAULT_SUBMIT_DEADLINE = 5.0
"""Seconds to keep retrying an unreachable Signoff before a request exists (then deny).

A restart with 100,000 pending requests serves again within about 1.3 s (``bench/``), so
5 s rides out a restart with room to spare, while a stopped server is reported before a
person watching the agent wonders why it hangs. ``SIGNOFF_SUBMIT_DEADLINE`` changes it."""
MAX_POLL_TIMEOUT = 60
SUBMIT_TIMEOUT = 30.0
"""Seconds to wait for the answer to one ``pre-tool-use`` POST."""
WAIT_MARGIN = 10.0
"""Extra seconds of read timeout beyond the server-side long-poll time."""
WAIT_SLACK = 0.5
"""Seconds (at most half of what is left) kept for a last long-poll's answer to travel."""
CONFIRM_SLACK = 1.0
"""Seconds more (within the same half) kept after a last long-poll, for an approved call to
be sent again and answered before the deadline."""
CANCEL_TIMEOUT = 5.0
CONNECT_TIMEOUT = 5.0
_FAST_PENDING = 1.0
"""A ``/wait`` that answers "pending" faster than this is treated as misbehaving (no hot loop)."""

_SUBMIT_PATH = "/v1/hooks/pre-tool-use"
_REPORT_PATH = "/v1/hooks/post-tool-use"
REPORT_DEADLINE = 5.0
"""Seconds to keep retrying the report of an executed call (then give up; the call already ran)."""
MAX_REPORTED_RESULT = 16 * 1024
"""Bytes of a tool result (as JSON) a report carries; a larger one is cut. With arguments of up
to 32 KiB, the report stays within the server's 64 KiB body limit."""
MAX_REPORTED_ERROR = 4000
"""Characters of an error a report carries (the server takes up to 10,000)."""
_TERMINAL = frozenset({"approved", "rejected", "expired", "cancelled"})
_STATUSES = _TERMINAL | {"pending"}
_RETRYABLE_4XX = frozenset({408, 425, 429})


# --------------------------------------------------------------------------- public types


class GateFailure(StrEnum):
    """Why a deny came from the client rather than from a policy or a person."""

    TIMEOUT = "timeout"
    """The client's own deadline passed while the request was still pending."""
    UNAVAILABLE = "unavailable"
    """Signoff could not be reached, refused the key, or answered something unusable."""


class GateDecision(NamedTuple):
    """The outcome of one gated tool call. Only ``allowed=True`` lets the tool run."""

    allowed: bool
    reason: str | None = None
    """Why, in words the agent (or its model) can be shown."""
    request_id: str | None = None
    """The confirmation request, when a human was asked."""
    modified_arguments: dict[str, Any] | None = None
    """Arguments rewritten by the server's hooks; run the tool with these instead."""
    failure: GateFailure | None = None
    """Set when the deny is the client failing closed (not a decision by policy or a person)."""
    request: Mapping[str, Any] | None = None
    """The server's request record (status, ``decided_by``, votes…), when there is one."""
    pending: bool = False
    """Only with ``wait=False``: a person has been asked and has not decided yet (``allowed`` is False)."""

    def __repr__(self) -> str:  # the request record is long; its id is enough here
        shown = ("allowed", "reason", "request_id", "modified_arguments", "failure", "pending")
        return "GateDecision(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in shown) + ")"

    @property
    def receipt(self) -> dict[str, Any] | None:
        """The signed decision receipt of the request the decision rests on, if any
        (``{payload, key_id, signature}``; check it with :mod:`signoff.hooks.receipts`)."""
        found = (self.request or {}).get("receipt")
        return dict(found) if isinstance(found, Mapping) else None

    @property
    def expired(self) -> bool:
        """A person was asked and nobody decided before the request's deadline: a timeout,
        not a refusal (``raise_for_denial`` raises :class:`GateTimeout`)."""
        return not self.allowed and (self.request or {}).get("status") == "expired"

    @property
    def decision(self) -> Decision:
        """``ALLOW``, ``DENY``, or (``wait=False`` only) ``PENDING``."""
        if self.allowed:
            return Decision.ALLOW
        return Decision.PENDING if self.pending else Decision.DENY

    def arguments(self, original: Mapping[str, Any]) -> dict[str, Any]:
        """The arguments the tool should run with: the rewritten ones if any, else ``original``."""
        return dict(self.modified_arguments) if self.modified_arguments is not None else dict(original)

    def raise_for_denial(self) -> GateDecision:
        """Return ``self`` when allowed; otherwise raise the matching :class:`GateDenied` subclass."""
        if self.allowed:
            return self
        reason = self.reason or "denied by Signoff"
        if self.pending:
            raise GateDenied(f"awaiting approval: {reason}", decision=self)
        if self.failure is GateFailure.TIMEOUT or self.expired:
            raise GateTimeout(reason, decision=self)
        if self.failure is GateFailure.UNAVAILABLE:
            raise GateUnavailable(reason, decision=self)
        raise GateDenied(reason, decision=self)


class GateDenied(Exception):
    """The gated call must not run. Base class of every gate error, so catching it fails closed."""

    def __init__(self, reason: str, *, decision: GateDecision | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.decision = decision

    @property
    def request_id(self) -> str | None:
        """The confirmation request, when one was created."""
        return self.decision.request_id if self.decision else None


class GateTimeout(GateDenied):
    """No decision arrived before a deadline: the client's own (the request may still be
    pending), or the request's (it expired: nobody decided, nobody refused)."""


class GateUnavailable(GateDenied):
    """Signoff was unreachable, refused the key, or answered something the client cannot trust."""


class GateConfigError(GateUnavailable):
    """The client is not configured (no ``SIGNOFF_URL`` / ``SIGNOFF_API_KEY``, or a bad URL)."""


def make_idempotency_key(runtime: str, session: str | None, tool_call_id: str | None) -> str | None:
    """``<runtime>:<session>:<tool_call_id>``, or ``None`` unless both ids are known.

    Both parts are required: tool call ids alone repeat across runs (test models
    number them deterministically), and a repeated key returns an *old* decision.
    """
    if not session or not tool_call_id:
        return None
    return f"{runtime}:{session}:{tool_call_id}"


def key_digest(tool_name: str, arguments: Mapping[str, Any]) -> str:
    """A short digest of the call (tool name and canonical arguments), to put in a key so that
    the key can only ever stand for this one call."""
    import hashlib

    canonical = json.dumps(
        [tool_name, arguments],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=_json_default,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


_ABSENT = object()


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=_json_default)
    return text if len(text) <= 80 else text[:79] + "…"


def describe_changes(original: Mapping[str, Any], approved: Mapping[str, Any]) -> str:
    """The approved arguments as changes to the original ones: ``amount: 90000 → 40000``."""
    changes = [
        f"{name}: {_shown(original[name]) if name in original else '(none)'} → "
        f"{_shown(approved[name]) if name in approved else '(removed)'}"
        for name in dict.fromkeys([*original, *approved])
        if original.get(name, _ABSENT) != approved.get(name, _ABSENT)
    ]
    return ", ".join(changes) or "no change"


# --------------------------------------------------------------------------- I/O vocabulary


class HttpCall(NamedTuple):
    """One HTTP exchange the driver must perform. ``timeout`` bounds the whole exchange."""

    method: Literal["GET", "POST"]
    path: str
    timeout: float
    params: Mapping[str, str] = MappingProxyType({})
    body: bytes | None = None


class HttpReply(NamedTuple):
    """A complete HTTP response."""

    status: int
    body: bytes
    retry_after: float | None = None


class TransportFailure(NamedTuple):
    """The exchange failed below HTTP: refused, reset, timed out, protocol error."""

    error: str
    kind: FailureKind = "other"


def _kind(exc: BaseException) -> FailureKind:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        module = type(current).__module__
        if isinstance(current, ConnectionRefusedError):
            return "refused"
        if name == "gaierror" or "Name or service not known" in str(current):
            return "dns"
        if module == "ssl" or name.startswith("SSL") or "CERTIFICATE_VERIFY_FAILED" in str(current):
            return "tls"
        if isinstance(current, TimeoutError) or "Timeout" in name:
            return "timeout"
        current = current.__cause__ or current.__context__
    return "other"


def transport_failure(exc: BaseException) -> TransportFailure:
    """Describe a failed exchange, telling a refused connection, DNS and TLS from a slow server."""
    text = str(exc)
    return TransportFailure(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, _kind(exc))


def seconds_text(seconds: float) -> str:
    """A duration as a message shows it: ``3.93929`` → ``3.9s``, ``539.6`` → ``540s``, ``0.25`` → ``0.25s``.

    Deadlines are worked out from what is left of a budget, so they are rarely round.
    """
    if seconds >= 10:
        return f"{round(seconds)}s"
    return f"{round(seconds, 1 if seconds >= 1 else 2):g}s"


def unreachable_reason(url: str, window: float, failure: TransportFailure | None, http_error: str) -> str:
    """One line for a deny before any request exists: what failed, where, and what to check."""
    where = f"Signoff at {url}" if url else "Signoff"
    within = seconds_text(window)
    check = "check that `signoff serve` is running there and that SIGNOFF_URL is right"
    if failure is None:
        what = f"{where} kept answering {http_error}" if http_error else f"{where} gave no answer"
        return f"{what} for {within}; denied (check the server's log and /readyz)"
    if failure.kind == "refused":
        return (
            f"{where} refused the connection (nothing is listening there; retried for {within}); "
            f"denied — {check}"
        )
    if failure.kind == "dns":
        return f"the host in {url} could not be resolved ({failure.error}); denied — check SIGNOFF_URL"
    if failure.kind == "tls":
        return (
            f"TLS with {where} failed ({failure.error}); denied — check http:// vs https:// in "
            "SIGNOFF_URL and the server's certificate"
        )
    if failure.kind == "timeout":
        return f"{where} did not answer within {within} (slow or overloaded); denied — check /readyz"
    return f"{where} could not be reached within {within} ({failure.error}); denied — {check}"


class Pause(NamedTuple):
    """Sleep this many seconds, then send ``None``."""

    seconds: float


Step = HttpCall | Pause
Outcome = HttpReply | TransportFailure | None


class ToolCall(NamedTuple):
    """What the agent wants to run, as sent to ``POST /v1/hooks/pre-tool-use``."""

    tool_name: str
    arguments: Mapping[str, Any]
    idempotency_key: str
    session_id: str | None = None
    tool_call_id: str | None = None
    user_id: str | None = None
    metadata: Mapping[str, Any] | None = None

    @classmethod
    def build(
        cls,
        tool_name: str,
        arguments: Mapping[str, Any] | None,
        *,
        runtime: str,
        session_id: str | None = None,
        tool_call_id: str | None = None,
        user_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> ToolCall:
        """Fill in the idempotency key: explicit, else from the runtime ids, else a fresh one.

        A fresh key still makes this call's own retries idempotent.
        """
        key = (
            idempotency_key
            or make_idempotency_key(runtime, session_id, tool_call_id)
            or f"{runtime}:auto:{_fresh_id()}"
        )
        return cls(
            tool_name=tool_name,
            arguments=dict(arguments or {}),
            idempotency_key=key,
            session_id=session_id,
            tool_call_id=tool_call_id,
            user_id=user_id,
            metadata=metadata,
        )

    def body(self) -> bytes:
        """The JSON request body (raises ``ValueError``/``TypeError`` if unencodable)."""
        payload: dict[str, Any] = {
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "idempotency_key": self.idempotency_key,
        }
        for name in ("session_id", "tool_call_id", "user_id", "metadata"):
            value = getattr(self, name)
            if value is not None:
                payload[name] = value
        return json.dumps(payload, default=_json_default, allow_nan=False, ensure_ascii=False).encode()


def _fresh_id() -> str:
    import uuid

    return uuid.uuid4().hex


def _json_default(value: Any) -> Any:
    """Best-effort JSON for tool arguments that are not plain JSON types."""
    import dataclasses

    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def json_safe(arguments: Mapping[str, Any]) -> dict[str, Any] | None:
    """``arguments`` as Signoff receives them (through JSON, as a request body carries them),
    or None when they cannot be sent as JSON (NaN, a value that encodes as no object)."""
    try:
        plain = json.loads(json.dumps(dict(arguments), default=_json_default, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return None
    return plain if isinstance(plain, dict) else None


# --------------------------------------------------------------------------- interpretation


class _Final(NamedTuple):
    decision: GateDecision


class _Pending(NamedTuple):
    request_id: str
    request: Mapping[str, Any] | None


class _Retry(NamedTuple):
    error: str
    after: float | None = None


_Verdict = _Final | _Pending | _Retry


def _unavailable(reason: str, request_id: str | None = None) -> GateDecision:
    return GateDecision(allowed=False, reason=reason, request_id=request_id, failure=GateFailure.UNAVAILABLE)


def _detail(body: bytes) -> str:
    """A short, printable error detail from an error response body."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:200]
    if isinstance(data, dict):
        detail = data.get("detail", data.get("error", data.get("message")))
        if detail is not None:
            text = detail if isinstance(detail, str) else json.dumps(detail)
            return text[:200]
    return json.dumps(data)[:200]


def _http_error(reply: HttpReply, *, what: str) -> _Verdict:
    """Non-200 statuses: retry what a restart or overload explains, deny the rest."""
    status = reply.status
    if status >= 500 or status in _RETRYABLE_4XX:
        return _Retry(f"HTTP {status} from Signoff", reply.retry_after)
    detail = _detail(reply.body)
    suffix = f": {detail}" if detail else ""
    if status in (401, 403):
        return _Final(_unavailable(f"Signoff refused the API key (HTTP {status}){suffix}"))
    if status == 404:
        return _Final(_unavailable(f"Signoff does not know {what} (HTTP 404){suffix}"))
    return _Final(_unavailable(f"Signoff rejected {what} (HTTP {status}){suffix}"))


def _load_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _opt_str(data: Mapping[str, Any], key: str) -> tuple[bool, str | None]:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return True, value
    return False, None


def _opt_obj(data: Mapping[str, Any], key: str) -> tuple[bool, dict[str, Any] | None]:
    value = data.get(key)
    if value is None or isinstance(value, dict):
        return True, value
    return False, None


def _who(request: Mapping[str, Any]) -> str:
    by = request.get("decided_by")
    if not isinstance(by, dict):
        return ""
    name = by.get("name") or by.get("user_id")
    channel = by.get("channel")
    if not isinstance(name, str) or not name:
        return ""
    return f" by {name} ({channel})" if isinstance(channel, str) and channel else f" by {name}"


def approved_edits(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The argument fields an approver changed, with their approved values, from a request
    record's ``changes`` (None: approved as asked, or not a list of changes)."""
    changes = request.get("changes")
    if not isinstance(changes, list) or not changes:
        return None
    edits: dict[str, Any] = {}
    for change in changes:
        if (
            not isinstance(change, dict)
            or not isinstance(change.get("field"), str)
            or "approved" not in change
        ):
            return None
        edits[change["field"]] = change["approved"]
    return edits


def _malformed_changes(request: Mapping[str, Any]) -> bool:
    changes = request.get("changes")
    return changes not in (None, []) and approved_edits(request) is None


def canonical_json(value: Any) -> str:
    """``value`` as sorted-key compact JSON: two values are the same call's when these are equal
    (``1``, ``1.0`` and ``true`` are not)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _carries_edits(request: Mapping[str, Any], modified: Mapping[str, Any] | None) -> bool:
    """Whether an allow's ``modified`` arguments hold every change its request record names, at
    its approved value (type included: ``1`` is not ``1.0`` nor ``true``)."""
    if _malformed_changes(request):
        return False
    edits = approved_edits(request)
    if not edits:
        return True
    return modified is not None and all(
        name in modified and canonical_json(modified[name]) == canonical_json(value)
        for name, value in edits.items()
    )


def _approved(
    data: Mapping[str, Any], request_id: str, base: Mapping[str, Any] | None, modified: dict[str, Any] | None
) -> GateDecision:
    """The decision for an approved request record: with the approver's changes applied to the
    call's arguments (``base``); approved with changes and no arguments to apply them to is a
    deny naming the approved values (the original call is never run)."""
    edits = approved_edits(data)
    reason = describe_request(data)
    if edits is None:
        return GateDecision(True, reason, request_id, modified_arguments=modified, request=data)
    if base is None:
        return GateDecision(
            False,
            f"{reason}; the call's own arguments are not known here, so it is not run "
            "(ask again with the same call to run it as approved)",
            request_id,
            request=data,
        )
    return GateDecision(True, reason, request_id, modified_arguments={**base, **edits}, request=data)


def describe_request(request: Mapping[str, Any]) -> str:
    """A one-line account of a terminal request, for the agent to show."""
    status = request.get("status")
    reason = request.get("reason")
    note = f": {reason}" if isinstance(reason, str) and reason else ""
    rid = request.get("id")
    if status == "approved":
        edits = approved_edits(request)
        changed = ""
        if edits:
            shown = ", ".join(
                f"{k} → {json.dumps(v, ensure_ascii=False, default=str)[:80]}" for k, v in edits.items()
            )
            changed = f" with changes: {shown}"
        return f"Approved{_who(request)}{changed}{note}"
    if status == "rejected":
        return f"Rejected{_who(request)}{note}"
    if status == "expired":
        # A timeout is not a refusal: say that nobody decided, and let the model ask again.
        why = f" ({reason})" if isinstance(reason, str) and reason else ""
        return (
            f"Not decided in time: approval request {rid} expired{why}. "
            "Nobody refused this call; ask again if it is still needed"
        )
    if status == "cancelled":
        return f"The approval request {rid} was cancelled{note}"
    return f"The approval request {rid} is {status}"


def interpret_request(
    reply: HttpReply | TransportFailure,
    *,
    request_id: str,
    modified_arguments: dict[str, Any] | None,
    base: Mapping[str, Any] | None = None,
) -> _Verdict:
    """Interpret a ``<Request>`` answer (from ``/wait``, ``GET`` or ``/cancel``). ``base``: the
    arguments the call would run with (approved with changes, it runs with those applied)."""
    if isinstance(reply, TransportFailure):
        return _Retry(reply.error)
    if reply.status != 200:
        return _http_error(reply, what=f"request {request_id}")
    data = _load_object(reply.body)
    status = data.get("status") if data is not None else None
    if data is None or status not in _STATUSES:
        return _Final(_unavailable(f"malformed answer from Signoff for request {request_id}", request_id))
    if data.get("id") != request_id:
        # A request record always names itself: one that does not is about some other request.
        return _Final(_unavailable(f"Signoff answered about another request than {request_id}", request_id))
    if status == "pending":
        return _Pending(request_id, data)
    if _malformed_changes(data):
        return _Final(
            _unavailable(f"malformed changes in Signoff's answer for request {request_id}", request_id)
        )
    if status == "approved":
        if isinstance(why := data.get("spent"), str):
            # Used or lapsed, as the server judged it answering (its clock, not this one's).
            return _Final(GateDecision(allowed=False, reason=why, request_id=request_id, request=data))
        if data.get("executed_at") is not None:
            # Its call was reported executed: the approval allows nothing more (one call, once).
            return _Final(
                GateDecision(
                    allowed=False,
                    reason=(
                        f"the approval of request {request_id} was used: the call was reported "
                        f"executed at {data['executed_at']}; a new call needs a new idempotency key "
                        "(and a new approval)"
                    ),
                    request_id=request_id,
                    request=data,
                )
            )
        return _Final(_approved(data, request_id, base, modified_arguments))
    return _Final(
        GateDecision(allowed=False, reason=describe_request(data), request_id=request_id, request=data)
    )


def settle_request(
    reply: HttpReply | TransportFailure, *, request_id: str, base: Mapping[str, Any] | None = None
) -> GateDecision:
    """One-shot interpretation of a ``<Request>`` answer (no retries): pending → a pending deny."""
    verdict = interpret_request(reply, request_id=request_id, modified_arguments=None, base=base)
    if isinstance(verdict, _Final):
        return verdict.decision
    if isinstance(verdict, _Pending):
        return GateDecision(
            False, f"request {request_id} is still pending", request_id, request=verdict.request, pending=True
        )
    return _unavailable(f"Signoff unreachable for request {request_id} ({verdict.error})", request_id)


def interpret_submit(reply: HttpReply | TransportFailure) -> tuple[_Verdict, dict[str, Any] | None]:
    """Interpret the ``pre-tool-use`` answer; also return the rewritten arguments, if any."""
    if isinstance(reply, TransportFailure):
        return _Retry(reply.error), None
    if reply.status != 200:
        return _http_error(reply, what="the tool call"), None
    malformed = _Final(_unavailable("malformed answer from Signoff"))
    data = _load_object(reply.body)
    if data is None:
        return malformed, None
    ok_reason, reason = _opt_str(data, "reason")
    ok_id, request_id = _opt_str(data, "request_id")
    ok_req, request = _opt_obj(data, "request")
    ok_args, modified = _opt_obj(data, "modified_arguments")
    if not (ok_reason and ok_id and ok_req and ok_args):
        return malformed, None
    if request_id is None and request is not None and isinstance(request.get("id"), str):
        request_id = request["id"]
    status = request.get("status") if request is not None else None
    decision = data.get("decision")
    if decision == Decision.ALLOW:
        # An allow that contradicts its own request record is not trusted: a status other than
        # approved, or changes the approver made that its arguments do not carry (the call
        # would run as proposed).
        if status not in (None, "approved") or (request is not None and status is None):
            return malformed, None
        if request is not None and not _carries_edits(request, modified):
            return malformed, None
        return _Final(GateDecision(True, reason, request_id, modified, request=request)), modified
    if decision == Decision.DENY:
        reason = reason or (describe_request(request) if request else "denied by Signoff")
        return _Final(GateDecision(False, reason, request_id, request=request)), modified
    if decision == Decision.PENDING and request_id:
        return _Pending(request_id, request), modified
    return malformed, None


# --------------------------------------------------------------------------- the flow


class FlowSettings(NamedTuple):
    """Timing knobs of one gated call (seconds)."""

    deadline: float = DEFAULT_DEADLINE
    poll_timeout: float = DEFAULT_POLL_TIMEOUT
    cancel_on_deadline: bool = False
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    submit_deadline: float = DEFAULT_SUBMIT_DEADLINE
    """How long to keep trying to reach Signoff before any request exists. Once a request
    is pending, only ``deadline`` ends the wait (re-attaching across restarts)."""


def _backoff(settings: FlowSettings, attempt: int, retry_after: float | None) -> float:
    """Exponential backoff with jitter (attempt ≥ 1), at least ``Retry-After`` when given."""
    ceiling = min(settings.backoff_max, settings.backoff_initial * 2.0 ** min(attempt - 1, 30))
    import random

    delay = ceiling * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, settings.backoff_max * 6))
    return delay


# urllib.parse is imported where a request id is put in a path: an allowed call (a hook's
# common case) never does, and the import (with ipaddress) is a share of a hook's start-up.


def _quoted(request_id: str) -> str:
    from urllib.parse import quote

    return quote(request_id, safe="")


def wait_path(request_id: str) -> str:
    return f"/v1/requests/{_quoted(request_id)}/wait"


def waiting_on(call: HttpCall) -> str | None:
    """The request id a ``/wait`` long-poll is for (``None`` for any other call)."""
    if call.method == "GET" and call.path.startswith("/v1/requests/") and call.path.endswith("/wait"):
        from urllib.parse import unquote

        return unquote(call.path[len("/v1/requests/") : -len("/wait")])
    return None


def cancel_path(request_id: str) -> str:
    return f"/v1/requests/{_quoted(request_id)}/cancel"


def request_path(request_id: str) -> str:
    return f"/v1/requests/{_quoted(request_id)}"


def cancel_flow(
    request_id: str, base: Mapping[str, Any] | None = None
) -> Generator[Step, Outcome, GateDecision]:
    """Cancel a request once; if that fails (409: already decided), read its final state.

    Returns the request's outcome as a decision: a cancelled request denies, one
    approved before the cancel landed allows (with its changes applied to ``base``; without
    ``base``, one approved with changes denies naming them).
    """
    reply = yield HttpCall("POST", cancel_path(request_id), CANCEL_TIMEOUT)
    assert reply is not None
    decision = settle_request(reply, request_id=request_id, base=base)
    if decision.failure is None and not decision.pending:
        return decision
    reply = yield HttpCall("GET", request_path(request_id), CANCEL_TIMEOUT)
    assert reply is not None
    after = settle_request(reply, request_id=request_id, base=base)
    return after if after.failure is None else decision


class ReportAnswer(NamedTuple):
    """Signoff's answer to the report of an executed call (``POST /v1/hooks/post-tool-use``)."""

    delivered: bool
    """Signoff received the report."""
    reason: str | None = None
    """Why it was not delivered, or the reason the server's hooks gave."""
    modified: bool = False
    """The server's post-tool-use hooks rewrote the result (``result`` is the rewritten one)."""
    result: Any = None


def report_body(
    tool_name: str,
    arguments: Mapping[str, Any],
    result: Any,
    *,
    error: str | None = None,
    session_id: str | None = None,
    tool_call_id: str | None = None,
    user_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> bytes:
    """The JSON body of ``POST /v1/hooks/post-tool-use`` (raises ``ValueError``/``TypeError``).

    A result larger than :data:`MAX_REPORTED_RESULT` is replaced by ``{"truncated": true,
    "bytes": N, "head": "<its first characters>"}`` and a long error is cut, so that the report
    is never refused for its size (which would leave the approval it closes open).
    """
    payload: dict[str, Any] = {
        "tool_name": tool_name,
        "arguments": dict(arguments),
        "result": _bounded(result),
    }
    optional = {
        "error": error[:MAX_REPORTED_ERROR] if error is not None else None,
        "session_id": session_id,
        "tool_call_id": tool_call_id,
        "user_id": user_id,
        "metadata": metadata,
        "idempotency_key": idempotency_key,
    }
    payload.update({name: value for name, value in optional.items() if value is not None})
    return json.dumps(payload, default=_json_default, allow_nan=False, ensure_ascii=False).encode()


def _bounded(result: Any) -> Any:
    text = (
        result if isinstance(result, str) else json.dumps(result, default=_json_default, ensure_ascii=False)
    )
    size = len(text.encode())
    if size <= MAX_REPORTED_RESULT:
        return result
    return {"truncated": True, "bytes": size, "head": text[: MAX_REPORTED_RESULT // 8]}


def _report_answer(reply: HttpReply) -> ReportAnswer:
    data = _load_object(reply.body)
    if data is None or data.get("decision") not in ("allow", "deny"):
        return ReportAnswer(False, "malformed answer from Signoff to the report")
    reason = data.get("reason")
    return ReportAnswer(
        True, reason if isinstance(reason, str) else None, data.get("modified") is True, data.get("result")
    )


def report_flow(
    body: bytes, settings: FlowSettings, clock: Callable[[], float], *, deadline: float | None = None
) -> Generator[Step, Outcome, ReportAnswer]:
    """Report an executed call, retrying what a restart explains for up to ``deadline`` seconds."""
    deadline = REPORT_DEADLINE if deadline is None else deadline
    end = clock() + deadline
    attempt = 0
    error = "no attempt"
    while (remaining := end - clock()) > 0:
        reply = yield HttpCall("POST", _REPORT_PATH, min(SUBMIT_TIMEOUT, remaining), body=body)
        if isinstance(reply, HttpReply) and reply.status == 200:
            return _report_answer(reply)
        after = None
        if isinstance(reply, HttpReply):
            verdict = _http_error(reply, what="the report")
            if isinstance(verdict, _Final):
                return ReportAnswer(False, verdict.decision.reason)
            assert isinstance(verdict, _Retry)
            error, after = verdict.error, verdict.after
        elif isinstance(reply, TransportFailure):
            error = reply.error
        attempt += 1
        yield Pause(min(_backoff(settings, attempt, after), max(0.0, end - clock())))
    return ReportAnswer(False, f"Signoff did not take the report within {seconds_text(deadline)} ({error})")


def _submitting(
    body: bytes, end: float, settings: FlowSettings, clock: Callable[[], float]
) -> Generator[
    Step, Outcome, tuple[_Final | _Pending | None, dict[str, Any] | None, TransportFailure | None, str]
]:
    """Send the call until Signoff answers it (final or pending) or ``end`` passes, retrying
    with backoff (the same idempotency key, so never a second request): the answer (None when
    the time ran out), the arguments Signoff's hooks rewrote, the last transport failure and
    the last HTTP error (an attempt the deadline cut short timing out does not hide what an
    earlier one met)."""
    attempt = 0
    last_failure: TransportFailure | None = None
    last_http = ""
    while True:
        remaining = end - clock()
        if remaining <= 0:
            return None, None, last_failure, last_http
        cut_short = remaining < SUBMIT_TIMEOUT
        reply = yield HttpCall("POST", _SUBMIT_PATH, min(SUBMIT_TIMEOUT, remaining), body=body)
        assert reply is not None
        verdict, modified = interpret_submit(reply)
        if isinstance(verdict, _Final | _Pending):
            return verdict, modified, last_failure, last_http
        attempt += 1
        if isinstance(reply, TransportFailure) and reply.kind == "timeout" and cut_short:
            # The deadline cut this attempt short: what an earlier one met says more.
            if last_failure is None and not last_http:
                last_failure = reply
        else:
            last_failure, last_http = (
                (reply, "") if isinstance(reply, TransportFailure) else (None, verdict.error)
            )
        yield Pause(min(_backoff(settings, attempt, verdict.after), max(0.0, end - clock())))


def _confirmed(
    body: bytes,
    request_id: str,
    end: float,
    settings: FlowSettings,
    clock: Callable[[], float],
    url: str,
) -> Generator[Step, Outcome, GateDecision]:
    """The answer to the call once its request was approved: the call sent again under its
    idempotency key, so that Signoff's decision kernel answers it as it does every call (a
    grant the call also rested on that ended while it waited, or a gate configured since,
    denies) and counts what the allow uses. Retried until ``end``; anything but Signoff's allow
    (for this request, or for the call as it stands once no gate asks about it) denies."""
    started = clock()
    if end <= started:
        return GateDecision(
            allowed=False,
            reason=(
                f"Signoff request {request_id} was approved as the deadline ran out, too late to "
                "ask for the call to run within it; call again with the same idempotency key to run it"
            ),
            request_id=request_id,
            failure=GateFailure.TIMEOUT,
        )
    verdict, _, last_failure, last_http = yield from _submitting(body, end, settings, clock)
    if verdict is None:
        return _unavailable(
            f"request {request_id} was approved, but asked again to run it, "
            + unreachable_reason(url, max(0.0, end - started), last_failure, last_http),
            request_id,
        )
    if isinstance(verdict, _Pending):
        return _unavailable(f"Signoff answered request {request_id} pending after approving it", request_id)
    decision = verdict.decision
    if decision.allowed and decision.request_id not in (request_id, None):
        # (None: no gate asks about the call any more, and Signoff allows it as it stands)
        return _unavailable(f"Signoff allowed the call under another request than {request_id}", request_id)
    return decision


def gate_flow(
    call: ToolCall,
    settings: FlowSettings,
    clock: Callable[[], float],
    *,
    wait: bool = True,
    url: str = "",
) -> Generator[Step, Outcome, GateDecision]:
    """Drive one gated call to a decision. See the module docstring for the protocol.

    With ``wait=False`` a pending answer ends the flow with ``GateDecision(pending=True)``.
    """
    end = clock() + settings.deadline
    try:
        body = call.body()
    except (TypeError, ValueError) as exc:
        return _unavailable(f"the arguments of {call.tool_name} cannot be sent as JSON: {exc}")

    # Phase 1: submit (retried with the same idempotency key, so never duplicated).
    submit_window = min(settings.deadline, settings.submit_deadline)
    verdict, modified, last_failure, last_http = yield from _submitting(
        body, clock() + submit_window, settings, clock
    )
    if verdict is None:
        return _unavailable(unreachable_reason(url, submit_window, last_failure, last_http))
    if isinstance(verdict, _Final):
        return verdict.decision
    pending = verdict

    # Phase 2: long-poll the request by id; re-attach after drops, 5xx and restarts.
    request_id = pending.request_id
    if not wait:
        return GateDecision(
            allowed=False,
            reason=f"Waiting for approval (Signoff request {request_id})",
            request_id=request_id,
            modified_arguments=modified,
            request=pending.request,
            pending=True,
        )
    attempt = 0
    last_error = ""
    while True:
        remaining = end - clock()
        if remaining <= 0:
            break
        # Near the deadline the server is asked to answer early enough for the answer to
        # arrive in time (rather than the read timing out on a poll that outlives it).
        budget = remaining - min(WAIT_SLACK + CONFIRM_SLACK, remaining / 2)
        server_wait = min(float(settings.poll_timeout), float(MAX_POLL_TIMEOUT), budget)
        started = clock()
        reply = yield HttpCall(
            "GET",
            wait_path(request_id),
            min(server_wait + WAIT_MARGIN, remaining),
            params={"timeout": f"{server_wait:g}" if server_wait >= 1 else f"{server_wait:.3f}"},
        )
        assert reply is not None
        wait_verdict = interpret_request(
            reply,
            request_id=request_id,
            modified_arguments=modified,
            base=modified if modified is not None else call.arguments,
        )
        if isinstance(wait_verdict, _Final):
            if not wait_verdict.decision.allowed:
                return wait_verdict.decision
            return (yield from _confirmed(body, request_id, end, settings, clock, url))
        if isinstance(wait_verdict, _Pending):
            attempt = 0
            last_error = ""
            if clock() - started < min(_FAST_PENDING, server_wait / 2):
                yield Pause(min(settings.backoff_initial, max(0.0, end - clock())))
            continue
        attempt += 1
        last_error = f" (last error: {wait_verdict.error})"
        yield Pause(min(_backoff(settings, attempt, wait_verdict.after), max(0.0, end - clock())))

    note = "is still pending"
    if settings.cancel_on_deadline:
        # Best effort, past the deadline by at most three times CANCEL_TIMEOUT (the cancel, its
        # outcome, and an approval that won the race against it sent again, then honoured).
        outcome = yield from cancel_flow(request_id, modified if modified is not None else call.arguments)
        note = "is still pending (cancelling it failed)"
        if outcome.failure is None and not outcome.pending:
            if outcome.allowed:
                confirm_end = clock() + CANCEL_TIMEOUT
                return (yield from _confirmed(body, request_id, confirm_end, settings, clock, url))
            if (outcome.request or {}).get("status") != "cancelled":
                return outcome
            note = "was cancelled"
    return GateDecision(
        allowed=False,
        reason=(
            f"No decision on {call.tool_name} within {seconds_text(settings.deadline)}; "
            f"Signoff request {request_id} {note}{last_error}"
        ),
        request_id=request_id,
        failure=GateFailure.TIMEOUT,
    )
