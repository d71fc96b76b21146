"""The proxy's decisions about one ``tools/call``, without I/O: names, keys and the words sent back.

Nothing here imports the MCP SDK, so it is tested on its own.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

from signoff.hooks._gate import canonical_json, seconds_text

__all__ = [
    "NAME_PATTERN",
    "CallLedger",
    "Claim",
    "denied_text",
    "expired_text",
    "gated_tool_name",
    "unavailable_text",
    "waiting_text",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What ``--name`` may be: the ``<NAME>`` of ``mcp__<NAME>__<tool>``, as Claude Code spells servers."""


def gated_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``: the name Signoff's gates see (Claude Code's own naming)."""
    return f"mcp__{server}__{tool}"


class Claim(NamedTuple):
    """The idempotency key one ``tools/call`` asks Signoff under."""

    call: str
    """The call's identity: a hash of server, tool, canonical arguments and session."""
    key: str


class CallLedger:
    """Which idempotency key each ``tools/call`` uses, so that a retry re-attaches and a new call asks anew.

    One ledger serves one proxy process, under a random id of its own (:attr:`run`). A
    call's identity is a hash of the proxy's name, the tool, its canonical arguments and
    the session it is made in (:meth:`session`: the process's, and the client's when it
    has one); each new call's key is that identity and a number the ledger never hands
    out twice. A call left undecided (still pending after ``--hold``, Signoff unreachable,
    the client gave up) is *parked*: the next call with the same identity takes over its
    key, so Signoff answers about the same request instead of asking the approvers again.
    A call that ran, or that Signoff refused, is simply not parked: the next identical call
    gets a new key, which needs its own approval. Concurrent identical calls each get a key
    of their own.

    Keys never outlive the process: a new proxy process (a client's new session, a
    restart) shares no key with an earlier one, so a call refused, run or left waiting
    there is asked anew, never answered from the earlier run's request.
    """

    def __init__(self, server: str, *, limit: int = 10_000) -> None:
        self.server = server
        self.limit = limit
        self.run = uuid.uuid4().hex
        """This process's id: in every session, so in every key."""
        self._parked: OrderedDict[str, list[str]] = OrderedDict()
        self._numbers = itertools.count(1)

    def session(self, client: str | None) -> str:
        """The session id Signoff is given for a call of ``client`` (its session, if it has one)."""
        return f"mcp:{self.server}:{self.run}" + (f":{client}" if client else "")

    def identity(self, tool: str, arguments: Mapping[str, Any], session: str) -> str:
        material = json.dumps([self.server, tool, canonical_json(arguments), session])
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    def claim(self, tool: str, arguments: Mapping[str, Any], session: str) -> Claim:
        """The key for this call in ``session`` (from :meth:`session`): a parked one of the
        same identity, else a new one."""
        call = self.identity(tool, arguments, session)
        parked = self._parked.get(call)
        if parked:
            key = parked.pop(0)
            if not parked:
                del self._parked[call]
            return Claim(call, key)
        return self.renew(call)

    def renew(self, call: str) -> Claim:
        """A new key for ``call``: for a new call, or for one whose key's approval allows nothing
        more (it lapsed while the call was parked)."""
        return Claim(call, f"mcp:{self.server}:{call}:{next(self._numbers)}")

    def park(self, claim: Claim) -> None:
        """The call ended undecided: its retry re-attaches to the same request."""
        self._parked.setdefault(claim.call, []).append(claim.key)
        self._parked.move_to_end(claim.call)
        while len(self._parked) > self.limit:
            self._parked.popitem(last=False)

    @property
    def parked(self) -> int:
        return sum(len(keys) for keys in self._parked.values())


def denied_text(tool: str, reason: str | None) -> str:
    return f"Signoff denied {tool}: {reason or 'denied by policy'}. The tool was not run."


def expired_text(tool: str, reason: str | None) -> str:
    return f"{tool} was not run: {reason or 'nobody decided on it in time'}."


def waiting_text(tool: str, request_id: str | None, held: float) -> str:
    request = f"Signoff request {request_id}" if request_id else "a Signoff request"
    return (
        f"{tool} is waiting for approval ({request}); no one has decided within {seconds_text(held)} "
        "and the tool has not run. Call it again with the same arguments to keep waiting: the retry "
        "re-attaches to the same request instead of asking again."
    )


def unavailable_text(tool: str, reason: str | None) -> str:
    return (
        f"{tool} was not run: Signoff could not confirm it ({reason or 'no answer'}). "
        "The call was not forwarded to the server."
    )
