"""Claude Code command hook: ``signoff-hook claude-code``, for ``PreToolUse`` and ``PostToolUse``.

Reads the hook's JSON on stdin. For ``PreToolUse`` it asks Signoff (waiting for a
person when a gate matches) and answers on stdout with
``hookSpecificOutput.permissionDecision``. For ``PostToolUse`` and
``PostToolUseFailure`` (the same command, told apart by ``hook_event_name``) it
reports the executed call to Signoff — under the same idempotency key, with the
input the tool actually ran with — which uses up the approval; reporting never
blocks or fails the agent (a few seconds at most, exit 0 whatever happens).

Claude Code lets a tool call through when a command hook times out, crashes or
exits with any code but 0 or 2 (CLI 2.1.332 honours ``onFailure: "block"``;
2.1.197 ignores it silently), so this hook never relies on Claude Code: it keeps
an internal deadline below the configured hook ``timeout`` and **exits 2 on every
error** (Signoff unreachable, deadline reached, bad configuration, malformed
stdin, a bug, a broken install): exit 2 blocks the call and shows stderr to Claude.

========================================  =====================================
Signoff says                              the hook answers
========================================  =====================================
approved by a person                      ``allow`` (exit 0)
denied (policy or person)                 ``deny`` with the reason (exit 0), and a context
                                          line saying it is a decision, not a failure
allowed without asking anyone             no decision — Claude Code's own permission rules
                                          apply (``{}``, exit 0); ``allow`` with
                                          ``--allow-unmatched``; ``ask`` with the rewritten
                                          input when Signoff rewrote it
timeout / unavailable / any error         exit 2, reason on stderr
========================================  =====================================

Settings (``.claude/settings.json``; ``examples/claude_code_settings.json`` is the whole file)::

    {"hooks": {"PreToolUse": [{"matcher": "^(Bash|Write|Edit|NotebookEdit)$|^mcp__",
      "hooks": [{"type": "command",
                 "command": "\\"$CLAUDE_PROJECT_DIR\\"/.venv/bin/signoff-hook claude-code --timeout 3600",
                 "timeout": 3600, "onFailure": "block"}]}],
     "PostToolUse": …the same command with --timeout 10 and "timeout": 10…,
     "PostToolUseFailure": …the same as PostToolUse…}}

``--timeout`` must repeat the handler's ``timeout`` (or set ``SIGNOFF_HOOK_TIMEOUT``;
default 600, Claude Code's default). ``SIGNOFF_URL`` and ``SIGNOFF_API_KEY`` come
from the environment; ``--submit-deadline`` (or ``SIGNOFF_SUBMIT_DEADLINE``, default
5 s) bounds how long an unreachable Signoff is retried before the call is blocked.
The idempotency key is ``claude-code:<session_id>:<tool_use_id>``, so a re-fired hook
for the same call (``defer`` + ``--resume``) re-attaches to the same request, which is
why the hook does not cancel it on its own deadline; ``PostToolUse`` carries the same two
ids, so the report names the same key. When Claude Code kills the hook
(``SIGTERM`` at its ``timeout``, or the user interrupting), the hook cancels the
request it was waiting on, so no card stays open for a call that will not run.

For ``http://`` URLs the hook talks through the standard library (it starts in a few
milliseconds, see ``bench/``); ``https://`` goes through httpx.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import SimpleNamespace

from signoff.hooks._base import ENV_API_KEY, ENV_SUBMIT_DEADLINE, ENV_URL, SyncGateClient
from signoff.hooks._gate import (
    CANCEL_TIMEOUT,
    GateDecision,
    GateDenied,
    HttpCall,
    HttpReply,
    TransportFailure,
    make_idempotency_key,
    seconds_text,
    waiting_on,
)

TYPE_CHECKING = False  # ``typing`` is not imported at run time (see signoff.hooks._records)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType, TracebackType
    from typing import Any, NoReturn, TextIO

__all__ = [
    "DEFAULT_HOOK_TIMEOUT",
    "ENV_HOOK_TIMEOUT",
    "HELP",
    "RUNTIME",
    "build_output",
    "internal_deadline",
    "main",
]

RUNTIME = "claude-code"
ENV_HOOK_TIMEOUT = "SIGNOFF_HOOK_TIMEOUT"
DEFAULT_HOOK_TIMEOUT = 600.0
"""Claude Code's default ``timeout`` for command hooks, in seconds."""
MAX_INPUT = 8 * 1024 * 1024
EXIT_BLOCK = 2
REPORT_DEADLINE = 2.0
"""Seconds a ``PostToolUse`` report may take, retries included: Claude Code waits for it."""
PRE_TOOL_USE = "PreToolUse"
POST_EVENTS = frozenset({"PostToolUse", "PostToolUseFailure"})
"""The events after a tool ran: ``PostToolUseFailure`` when it failed (the call still ran)."""

DENIED_CONTEXT = (
    "Signoff denied this tool call: a decision (by a person or a policy), not a failure of the "
    "approval hook. Its reason is the tool result."
)
"""Sent with every deny as ``additionalContext``: Claude Code 2.1.332 shows Claude a hook's
deliberate deny as "PreToolUse:<tool> hook error: <reason>", which reads like a malfunction."""

_METADATA_FIELDS = ("cwd", "permission_mode", "prompt_id", "agent_id", "agent_type")

HELP = f"""\
signoff-hook claude-code: the Signoff approval hook for Claude Code

Claude Code runs it with each tool call as JSON on stdin. As the PreToolUse hook it asks
Signoff whether the call may run and, when a gate needs a person, waits for the decision;
as the PostToolUse and PostToolUseFailure hook it reports the call that ran. Install it in
.claude/settings.json: examples/claude_code_settings.json in Signoff's repository is a
complete file, docs/agents.md explains it.

Options:
  --timeout S          the handler's "timeout" in settings.json, repeated here so that
                       the hook gives up before Claude Code does
                       (default: ${ENV_HOOK_TIMEOUT}, else 600)
  --deadline S         wait at most S seconds for a decision (default: a margin below
                       --timeout: 3600 waits 3300)
  --url URL            Signoff's address (default: ${ENV_URL})
  --submit-deadline S  how long to retry an unreachable Signoff before blocking the
                       call (default: ${ENV_SUBMIT_DEADLINE}, else 5)
  --user-id ID         who runs Claude Code: approvers cannot approve their own calls
  --allow-unmatched    answer "allow" when no gate matched, which skips Claude Code's
                       own permission prompt
  -h, --help           show this text

Environment: {ENV_URL} and {ENV_API_KEY} (an agent key from `signoff keys create
AGENT`), set where Claude Code starts.

Answers: allow or deny with the reason on stdout (exit 0); nothing to say when no gate
matched ({{}}, exit 0); exit 2 with the reason on stderr when no decision can be had
(Signoff unreachable, the deadline, a bad key or configuration), which blocks the call.
"""


class _Refused(Exception):
    """Any reason to block the call with exit 2."""


class _Stopped(BaseException):
    """Claude Code stopped the hook (a signal), or the hook's own deadline passed mid-read."""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(f"stopped by {signal.Signals(signum).name}")


class _Signals:
    """Turn SIGTERM and SIGINT into :class:`_Stopped`; and stop at the deadline whatever the
    server does (a server trickling one byte a second defeats per-read socket timeouts)."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.handlers: dict[signal.Signals, object] = {}

    def __enter__(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            self.handlers[sig] = signal.signal(sig, _stop)
        signal.setitimer(signal.ITIMER_REAL, self.budget)

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned


def _client(args: SimpleNamespace) -> SyncGateClient:
    url = args.url if args.url is not None else os.environ.get(ENV_URL, "")
    if not url.strip():
        raise _Refused(
            f"Signoff's address is not set: export {ENV_URL}=https://… where Claude Code starts, "
            "or add --url URL to the hook's command in settings.json"
        )
    if not os.environ.get(ENV_API_KEY, "").strip():
        raise _Refused(
            f"no agent key: export {ENV_API_KEY} (from `signoff keys create AGENT`) where Claude Code starts"
        )
    if url.strip().startswith("http://"):
        from signoff.hooks._plain import PlainGateClient

        return PlainGateClient(url=args.url, runtime=RUNTIME, submit_deadline=args.submit_deadline)
    from signoff.hooks.client import GateClient

    return GateClient(url=args.url, runtime=RUNTIME, submit_deadline=args.submit_deadline)


def internal_deadline(hook_timeout: float) -> float:
    """Seconds the hook may wait for Signoff, safely below Claude Code's ``timeout``.

    Keeps 10 % of the timeout in reserve (at least 5 s, at most 300 s, never more
    than half): 3600 → 3300, 600 → 540, 60 → 54, 8 → 4.
    """
    margin = min(300.0, max(5.0, hook_timeout * 0.1))
    return max(hook_timeout - margin, hook_timeout * 0.5)


def _load_input(raw: str) -> dict[str, Any]:
    if len(raw) > MAX_INPUT:
        raise _Refused("hook input is too large")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise _Refused(f"hook input is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _Refused("hook input is not a JSON object")
    return data


def _event(data: dict[str, Any]) -> str:
    event = data.setdefault("hook_event_name", PRE_TOOL_USE)
    if event != PRE_TOOL_USE and event not in POST_EVENTS:
        raise _Refused(f"this hook handles PreToolUse and PostToolUse, not {event!r}")
    return str(event)


def _check_call(data: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data.get("tool_name"), str) or not data["tool_name"]:
        raise _Refused("hook input has no tool_name")
    if not isinstance(data.get("tool_input"), dict):
        raise _Refused("hook input has no tool_input object")
    for name in ("session_id", "tool_use_id"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise _Refused(f"hook input field {name} is not a string")
    return data


def build_output(decision: GateDecision, *, allow_unmatched: bool = False) -> dict[str, Any] | None:
    """The JSON to print for a decision, or ``None`` when the hook must exit 2 instead."""
    if decision.failure is not None or decision.pending:
        return None
    output: dict[str, Any] = {"hookEventName": "PreToolUse"}
    if not decision.allowed:
        output["permissionDecision"] = "deny"
        output["permissionDecisionReason"] = f"Signoff: {decision.reason or 'denied'}"
        output["additionalContext"] = DENIED_CONTEXT
        return {"hookSpecificOutput": output}
    if decision.modified_arguments is not None:
        output["updatedInput"] = decision.modified_arguments
    if decision.request_id is not None or allow_unmatched:
        output["permissionDecision"] = "allow"
        output["permissionDecisionReason"] = f"Signoff: {decision.reason or 'allowed'}"
    elif decision.modified_arguments is not None:
        # Rewritten but nobody approved: show the new input instead of skipping the prompt.
        output["permissionDecision"] = "ask"
        output["permissionDecisionReason"] = "Signoff rewrote this tool call's input"
    else:
        return {}
    return {"hookSpecificOutput": output}


_SECONDS = ("--timeout", "--deadline", "--submit-deadline")
_TEXT = ("--url", "--user-id")
_FLAGS = {"-h": "help", "--help": "help", "--allow-unmatched": "allow_unmatched"}
"""The options: seconds, text, and flags (by the attribute they set)."""


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _arguments(argv: Sequence[str] | None) -> SimpleNamespace:
    """The options. The command lines hooks are configured with (each option given as
    ``--name value`` or ``--name=value``) are read here; any other is read by argparse, so
    that its message names the mistake — a usage error is one line that blocks the call
    (``--help`` prints :data:`HELP`). Importing argparse (and the gettext, locale and shutil
    it brings) is a good part of what a hook's start-up would cost."""
    given = list(sys.argv[1:] if argv is None else argv)
    got: dict[str, Any] = {"help": False, "allow_unmatched": False}
    got.update(dict.fromkeys(map(_dest, _SECONDS + _TEXT)))
    rest = iter(given)
    for arg in rest:
        if arg in _FLAGS:
            got[_FLAGS[arg]] = True
            continue
        name, eq, value = arg.partition("=")
        if name not in _SECONDS and name not in _TEXT:
            return _parsed(given)
        if not eq:
            value = next(rest, "-")
            if value.startswith("-"):  # a missing value, or one argparse may read otherwise
                return _parsed(given)
        if name in _SECONDS:
            try:
                got[_dest(name)] = float(value)
            except ValueError:
                return _parsed(given)
        else:
            got[_dest(name)] = value
    return SimpleNamespace(**got)


def _parsed(argv: list[str]) -> SimpleNamespace:
    """``argv`` read by argparse, with the same options as :func:`_arguments`."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise _Refused(f"{message} (signoff-hook claude-code --help lists the options)")

    parser = Parser(prog="signoff-hook claude-code", add_help=False, allow_abbrev=False)
    for flag in _FLAGS:
        parser.add_argument(flag, dest=_FLAGS[flag], action="store_true")
    for seconds in _SECONDS:
        parser.add_argument(seconds, type=_seconds, default=None)
    for text in _TEXT:
        parser.add_argument(text, default=None)
    return SimpleNamespace(**vars(parser.parse_args(argv)))


def _budget(args: SimpleNamespace) -> float:
    timeout = args.timeout
    if timeout is None:
        raw = os.environ.get(ENV_HOOK_TIMEOUT)
        try:
            timeout = float(raw) if raw else DEFAULT_HOOK_TIMEOUT
        except ValueError:
            raise _Refused(f"{ENV_HOOK_TIMEOUT} is not a number: {raw!r}") from None
    if not timeout > 0:
        raise _Refused("the hook timeout must be positive")
    limit = internal_deadline(timeout)
    if args.deadline is None:
        return limit
    if not 0 < args.deadline <= limit:
        most, hook = seconds_text(limit), seconds_text(timeout)
        raise _Refused(f"--deadline must be > 0 and at most {most} for a {hook} hook timeout")
    return float(args.deadline)


class _Watch:
    """Sends through the client and remembers the request being waited on."""

    def __init__(self, client: SyncGateClient) -> None:
        self.client = client
        self.request_id: str | None = None

    def __call__(self, call: HttpCall) -> HttpReply | TransportFailure:
        self.request_id = waiting_on(call) or self.request_id
        return self.client._exchange(call)

    def cancel(self, stderr: TextIO) -> None:
        """Withdraw the request when the hook is stopped while waiting (best effort, bounded)."""
        if self.request_id is None:
            return
        signal.setitimer(signal.ITIMER_REAL, CANCEL_TIMEOUT)
        try:
            outcome = self.client.cancel(self.request_id)
            stderr.write(f"Signoff request {self.request_id}: {outcome.reason}\n")
        except BaseException:
            pass  # a second signal or the bound: the request expires on the server instead
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _call(data: dict[str, Any], user_id: str | None) -> dict[str, Any]:
    """What both events send: the ids, the key derived from them, the metadata."""
    session_id, tool_use_id = data.get("session_id"), data.get("tool_use_id")
    metadata: dict[str, Any] = {"runtime": RUNTIME}
    metadata.update({k: data[k] for k in _METADATA_FIELDS if isinstance(data.get(k), str)})
    return {
        "session_id": session_id,
        "tool_call_id": tool_use_id,
        "user_id": user_id,
        "metadata": metadata,
        "idempotency_key": make_idempotency_key(RUNTIME, session_id, tool_use_id),
    }


def _ask(data: dict[str, Any], watch: _Watch, deadline: float, user_id: str | None) -> GateDecision:
    return watch.client.pre_tool_use(
        data["tool_name"], data["tool_input"], **_call(data, user_id), deadline=deadline, exchange=watch
    )


def _report(data: dict[str, Any], client: SyncGateClient, deadline: float, user_id: str | None) -> str | None:
    """Report the executed call (its ``tool_input`` is the input it ran with); why it was lost, if it was."""
    failed = data["hook_event_name"] == "PostToolUseFailure"
    error = data.get("error") if failed else None
    answer = client.post_tool_use(
        data["tool_name"],
        data["tool_input"],
        None if failed else data.get("tool_response"),
        error=(error if isinstance(error, str) and error else "the tool failed") if failed else None,
        **_call(data, user_id),
        deadline=deadline,
    )
    return None if answer.delivered else answer.reason


def main(
    argv: Sequence[str] | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    *,
    stderr: TextIO | None = None,
    client: SyncGateClient | None = None,
) -> int:
    """Run the hook once. Returns the exit code: 0 with a JSON answer, or 2 to block; after
    the tool ran (``PostToolUse``, ``PostToolUseFailure``) always 0.

    ``client`` replaces the one built from the environment (tests); it is not closed.
    """
    started = time.monotonic()
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    owned: SyncGateClient | None = None
    watch: _Watch | None = None
    event = PRE_TOOL_USE
    try:
        args = _arguments(argv)
        if args.help:
            stdout.write(HELP)
            return 0
        budget = _budget(args)
        with _Signals(budget + 1.0):
            try:
                data = _load_input(stdin.read(MAX_INPUT + 1))
                event = _event(data)
                _check_call(data)
                if client is None:
                    client = owned = _client(args)
                if event in POST_EVENTS:
                    deadline = min(REPORT_DEADLINE, budget - (time.monotonic() - started))
                    signal.setitimer(signal.ITIMER_REAL, max(deadline, 0.0) + 1.0)
                    lost = _report(data, client, deadline, args.user_id) if deadline > 0 else "no time left"
                    if lost is not None:
                        stderr.write(
                            f"Signoff did not get the report of this {data['tool_name']} call: {lost}\n"
                        )
                    return 0
                watch = _Watch(client)
                remaining = budget - (time.monotonic() - started)
                if remaining <= 0:
                    raise _Refused("no time left to ask Signoff")
                decision = _ask(data, watch, remaining, args.user_id)
            except _Stopped:
                if watch is not None:
                    watch.cancel(stderr)
                raise
        output = build_output(decision, allow_unmatched=args.allow_unmatched)
        if output is None:
            raise _Refused(decision.reason or "Signoff gave no decision")
        stdout.write(json.dumps(output) + "\n")
        stdout.flush()
        return 0
    except BaseException as exc:  # every failure, even Ctrl-C, must block the call
        known = isinstance(exc, _Refused | GateDenied | _Stopped)
        reason = str(exc) if known else f"{type(exc).__name__}: {exc}"
        reported = event in POST_EVENTS  # the call already ran: nothing to block, never fail it
        try:
            prefix = (
                "Signoff could not report this call" if reported else "Blocked by the Signoff approval hook"
            )
            stderr.write(f"{prefix}: {reason}\n")
            stderr.flush()
        except BaseException:
            pass  # nothing left to report to; the exit code still blocks
        return 0 if reported else EXIT_BLOCK
    finally:
        if owned is not None:
            owned.close()


if __name__ == "__main__":
    sys.exit(main())
