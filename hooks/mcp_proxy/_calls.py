"""The proxy's decisions about one ``tools/call``, without I/O: names, keys and the words sent back.

Nothing here imports the MCP SDK, so it is tested on its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = [
    "NAME_PATTERN",
    "CallLedger",
    "Claim",
    "canonical_arguments",
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


def canonical_arguments(arguments: Mapping[str, Any]) -> str:
    """The arguments as sorted-key compact JSON, the form a call's identity is computed from."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class Claim(NamedTuple):
    """The idempotency key one ``tools/call`` asks Signoff under."""

    call: str
    """The call's identity: a hash of server, tool, canonical arguments and client session."""
    key: str


class CallLedger:
    """Which idempotency key each ``tools/call`` uses, so that a retry re-attaches and a new call asks anew.

    A call's identity is a hash of the proxy's name, the tool, its canonical arguments
    and the client's session; its keys are that identity and a generation. A call left
    undecided (still pending after ``--hold``, Signoff unreachable, the client gave up)
    is *parked*: the next call with the same identity takes over its key, so Signoff
    answers about the same request instead of asking the approvers again. A call that ran,
    or that Signoff refused, is simply not parked: the next identical call takes the next
    generation, a new key that needs its own approval. Concurrent identical calls each get
    a key of their own.

    Keys do not depend on the proxy process: after a restart, a retry of a call still
    waiting re-attaches to its request, and a call whose approval an earlier run used up
    (Signoff says so: the request is approved yet the answer is deny) moves on with
    :meth:`spent` to the next generation.
    """

    def __init__(self, server: str, *, limit: int = 10_000) -> None:
        self.server = server
        self.limit = limit
        self._parked: OrderedDict[str, list[str]] = OrderedDict()
        self._next: OrderedDict[str, int] = OrderedDict()

    def identity(self, tool: str, arguments: Mapping[str, Any], session: str | None) -> str:
        material = json.dumps([self.server, tool, canonical_arguments(arguments), session])
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    def claim(self, tool: str, arguments: Mapping[str, Any], session: str | None) -> Claim:
        """The key for this call: a parked one of the same identity, else a new one."""
        call = self.identity(tool, arguments, session)
        parked = self._parked.get(call)
        if parked:
            key = parked.pop(0)
            if not parked:
                del self._parked[call]
            return Claim(call, key)
        return self._fresh(call)

    def spent(self, claim: Claim) -> Claim:
        """``claim``'s key belongs to a call that already ran: the key of the next generation."""
        return self._fresh(claim.call)

    def _fresh(self, call: str) -> Claim:
        generation = self._next.pop(call, 1)
        self._next[call] = generation + 1
        while len(self._next) > self.limit:
            self._next.popitem(last=False)
        return Claim(call, f"mcp:{self.server}:{call}:{generation}")

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
        f"{tool} is waiting for approval ({request}); no one has decided within {held:g}s and the tool "
        "has not run. Call it again with the same arguments to keep waiting: the retry re-attaches to "
        "the same request instead of asking again."
    )


def unavailable_text(tool: str, reason: str | None) -> str:
    return (
        f"{tool} was not run: Signoff could not confirm it ({reason or 'no answer'}). "
        "The call was not forwarded to the server."
    )
