from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from signoff.hooks.adapters.claude_code import (
    DENIED_CONTEXT,
    HELP,
    REPORT_DEADLINE,
    build_output,
    internal_deadline,
    main,
)
from signoff.hooks.client import GateClient, GateDecision
from tests.hooks.signoff_fakes import KEY, URL, LiveSignoff, Scripted, pending, state, submitted

REPO = Path(__file__).resolve().parents[2]

HOOK_INPUT: dict[str, Any] = {
    "session_id": "abc123",
    "prompt_id": "550e8400-e29b-41d4-a716-446655440000",
    "transcript_path": "/home/u/.claude/projects/p/abc123.jsonl",
    "cwd": "/home/u/project",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "rm -rf build", "description": "clean", "timeout": 120000},
    "tool_use_id": "toolu_01ABC123",
}


def run_hook(
    fake: Scripted | None,
    hook_input: Any = HOOK_INPUT,
    *args: str,
    client: GateClient | None = None,
) -> tuple[int, str, str]:
    stdin = io.StringIO(hook_input if isinstance(hook_input, str) else json.dumps(hook_input))
    stdout, stderr = io.StringIO(), io.StringIO()
    if client is None and fake is not None:
        client = GateClient(
            URL, KEY, transport=httpx.MockTransport(fake), backoff_initial=0.01, backoff_max=0.05
        )
    code = main(list(args), stdin, stdout, stderr=stderr, client=client)
    return code, stdout.getvalue(), stderr.getvalue()


def answer(stdout: str) -> dict[str, Any]:
    assert stdout.startswith("{")
    data: dict[str, Any] = json.loads(stdout)
    return data


def test_approved_call_answers_allow_and_sends_the_runtime_ids() -> None:
    approved = state("req-1", "approved", decided_by={"channel": "slack", "user_id": "U1", "name": "Alice"})
    fake = Scripted().on("submit", pending("req-1")).on("wait", approved)
    code, out, err = run_hook(fake)
    assert code == 0, err
    assert answer(out) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": "Signoff: Approved by Alice (slack)",
        }
    }
    body, again = fake.bodies()
    assert again == body, "sent again as it was, once approved"
    assert body["tool_name"] == "Bash"
    assert body["arguments"] == HOOK_INPUT["tool_input"]
    assert body["idempotency_key"] == "claude-code:abc123:toolu_01ABC123"
    assert body["session_id"] == "abc123"
    assert body["tool_call_id"] == "toolu_01ABC123"
    assert body["metadata"] == {
        "runtime": "claude-code",
        "cwd": "/home/u/project",
        "permission_mode": "default",
        "prompt_id": HOOK_INPUT["prompt_id"],
    }


def test_denied_call_answers_deny_with_the_reason() -> None:
    rejected = state(
        "req-1", "rejected", reason="not on prod", decided_by={"channel": "slack", "name": "Bob"}
    )
    fake = Scripted().on("submit", pending("req-1")).on("wait", rejected)
    code, out, _ = run_hook(fake)
    assert code == 0
    assert answer(out)["hookSpecificOutput"] == {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "Signoff: Rejected by Bob (slack): not on prod",
        "additionalContext": DENIED_CONTEXT,
    }


def test_policy_deny_answers_deny() -> None:
    code, out, _ = run_hook(Scripted().on("submit", submitted("deny", reason="read-only mode")))
    assert code == 0
    assert answer(out)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_unmatched_allow_leaves_the_decision_to_claude_code() -> None:
    code, out, _ = run_hook(Scripted().on("submit", submitted("allow")))
    assert code == 0
    assert answer(out) == {}


def test_unmatched_allow_with_allow_unmatched_answers_allow() -> None:
    code, out, _ = run_hook(Scripted().on("submit", submitted("allow")), HOOK_INPUT, "--allow-unmatched")
    assert code == 0
    assert answer(out)["hookSpecificOutput"]["permissionDecision"] == "allow"


def test_rewritten_input_is_passed_on() -> None:
    rewritten = {"command": "rm -rf ./build"}
    code, out, _ = run_hook(Scripted().on("submit", submitted("allow", modified_arguments=rewritten)))
    assert code == 0
    output = answer(out)["hookSpecificOutput"]
    assert output["permissionDecision"] == "ask", "nobody approved: show the rewrite, never skip the prompt"
    assert output["updatedInput"] == rewritten

    fake = (
        Scripted()
        .on("submit", pending("req-1", modified_arguments=rewritten))
        .on("wait", state("req-1", "approved"))
    )
    code, out, _ = run_hook(fake)
    output = answer(out)["hookSpecificOutput"]
    assert output["permissionDecision"] == "allow"
    assert output["updatedInput"] == rewritten


def test_server_down_exits_2() -> None:
    fake = Scripted().on("submit", httpx.ConnectError("[Errno 111] Connection refused"))
    code, out, err = run_hook(fake, HOOK_INPUT, "--deadline", "0.3")
    assert code == 2
    assert out == ""
    assert "Blocked by the Signoff approval hook" in err
    assert "Connection refused" in err


def test_internal_deadline_exits_2_while_pending() -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1"))
    code, out, err = run_hook(fake, HOOK_INPUT, "--timeout", "600", "--deadline", "0.3")
    assert code == 2
    assert out == ""
    assert "still pending" in err


def test_401_exits_2() -> None:
    code, out, err = run_hook(Scripted().on("submit", httpx.Response(401, json={"detail": "bad key"})))
    assert code == 2
    assert out == ""
    assert "401" in err


@pytest.mark.parametrize(
    ("hook_input", "message"),
    [
        ("", "not JSON"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ({**HOOK_INPUT, "tool_name": None}, "tool_name"),
        ({**HOOK_INPUT, "tool_input": "ls"}, "tool_input"),
        ({**HOOK_INPUT, "tool_use_id": 7}, "tool_use_id"),
        ({**HOOK_INPUT, "hook_event_name": "UserPromptSubmit"}, "UserPromptSubmit"),
    ],
)
def test_malformed_stdin_exits_2(hook_input: Any, message: str) -> None:
    fake = Scripted()
    code, out, err = run_hook(fake, hook_input)
    assert code == 2
    assert out == ""
    assert message in err
    assert fake.requests == [], "nothing is sent for bad input"


def test_missing_configuration_exits_2_saying_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook user cannot pass ``url=...``: the line names the variable to export, or the flag."""
    monkeypatch.delenv("SIGNOFF_URL", raising=False)
    monkeypatch.delenv("SIGNOFF_API_KEY", raising=False)
    assert run_hook(None) == (
        2,
        "",
        "Blocked by the Signoff approval hook: Signoff's address is not set: export "
        "SIGNOFF_URL=https://… where Claude Code starts, or add --url URL to the hook's command in "
        "settings.json\n",
    )
    code, out, err = run_hook(None, HOOK_INPUT, "--url", "http://127.0.0.1:9")
    assert (code, out) == (2, "")
    assert err == (
        "Blocked by the Signoff approval hook: no agent key: export SIGNOFF_API_KEY (from "
        "`signoff keys create AGENT`) where Claude Code starts\n"
    )
    assert "pass" not in err


def test_help_is_written_for_a_hook_user() -> None:
    code, out, err = run_hook(None, HOOK_INPUT, "--help")
    assert (code, out, err) == (0, HELP, "")
    assert "usage:" not in out, "not argparse's own"
    assert "--timeout TIMEOUT" not in out
    for option in ("--timeout S", "--deadline S", "--url URL", "--submit-deadline S", "--user-id ID"):
        assert option in out
    assert "SIGNOFF_URL" in out
    assert "SIGNOFF_API_KEY" in out
    assert max(len(line) for line in out.splitlines()) <= 90


@pytest.mark.parametrize(
    "args", [["--deadline", "700"], ["--timeout", "0"], ["--timeout", "soon"], ["--bogus"]]
)
def test_bad_arguments_exit_2(args: list[str]) -> None:
    fake = Scripted().on("submit", submitted("allow"))
    code, out, err = run_hook(fake, HOOK_INPUT, *args)
    assert code == 2
    assert out == ""
    assert fake.requests == []
    assert err.count("\n") == 1, err
    assert err.startswith("Blocked by the Signoff approval hook: ")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--timeout", "soon"], "argument --timeout: not a number of seconds: 'soon'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_usage_error_is_one_line_pointing_at_the_help(args: list[str], says: str) -> None:
    _, _, err = run_hook(Scripted(), HOOK_INPUT, *args)
    assert err == (
        f"Blocked by the Signoff approval hook: {says} (signoff-hook claude-code --help lists the options)\n"
    )


def test_hook_timeout_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNOFF_HOOK_TIMEOUT", "10")
    fake = Scripted().on("submit", submitted("allow"))
    code, _, err = run_hook(fake, HOOK_INPUT, "--deadline", "6")
    assert code == 2, "10 s hook timeout allows at most 5 s"
    assert "at most 5s" in err
    monkeypatch.setenv("SIGNOFF_HOOK_TIMEOUT", "ten")
    assert run_hook(fake)[0] == 2


def test_any_bug_exits_2() -> None:
    class Broken(GateClient):
        def pre_tool_use(self, *args: Any, **kwargs: Any) -> GateDecision:
            raise RuntimeError("bug")

    code, out, err = run_hook(None, HOOK_INPUT, client=Broken(URL, KEY))
    assert code == 2
    assert out == ""
    assert "RuntimeError: bug" in err


def test_an_unwritable_stdout_exits_2() -> None:
    class Closed(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError("closed")

    fake = Scripted().on("submit", submitted("deny", reason="no"))
    client = GateClient(URL, KEY, transport=httpx.MockTransport(fake))
    code = main([], io.StringIO(json.dumps(HOOK_INPUT)), Closed(), stderr=io.StringIO(), client=client)
    assert code == 2


# --------------------------------------------------------------------------- PostToolUse: the report

# As Claude Code 2.1.332 sends them (captured from the real CLI): the same session and tool use
# ids as the PreToolUse event, and the input the tool ran with (the updatedInput, if any).
POST_INPUT: dict[str, Any] = {
    **{k: v for k, v in HOOK_INPUT.items() if k != "tool_input"},
    "effort": {"level": "medium"},
    "hook_event_name": "PostToolUse",
    "tool_input": {"command": "rm -rf ./build", "description": "clean"},
    "tool_response": {"stdout": "", "stderr": "", "interrupted": False, "isImage": False},
    "duration_ms": 128,
}
FAILURE_INPUT: dict[str, Any] = {
    **{k: v for k, v in POST_INPUT.items() if k not in ("tool_response",)},
    "hook_event_name": "PostToolUseFailure",
    "error": "Exit code 3\noops",
    "is_interrupt": False,
}


def test_post_tool_use_reports_the_call_under_the_pre_tool_use_key() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    assert run_hook(fake)[0] == 0
    code, out, err = run_hook(fake, POST_INPUT)
    assert (code, out, err) == (0, "", "")
    (asked,) = fake.bodies()
    (report,) = fake.bodies("report")
    assert report["idempotency_key"] == asked["idempotency_key"] == "claude-code:abc123:toolu_01ABC123"
    assert report["tool_name"] == "Bash"
    assert report["arguments"] == POST_INPUT["tool_input"], "the input it ran with"
    assert report["result"] == POST_INPUT["tool_response"]
    assert (report["session_id"], report["tool_call_id"]) == ("abc123", "toolu_01ABC123")
    assert report["metadata"] == asked["metadata"]
    assert "error" not in report


def test_post_tool_use_failure_reports_the_error() -> None:
    fake = Scripted()
    code, out, _ = run_hook(fake, FAILURE_INPUT, "--user-id", "dev-1")
    assert (code, out) == (0, "")
    (report,) = fake.bodies("report")
    assert report["error"] == "Exit code 3\noops"
    assert report["result"] is None
    assert report["user_id"] == "dev-1"
    assert report["idempotency_key"] == "claude-code:abc123:toolu_01ABC123"


def test_a_report_never_blocks_the_agent_when_signoff_is_down() -> None:
    fake = Scripted().on("report", httpx.ConnectError("[Errno 111] Connection refused"))
    started = time.monotonic()
    code, out, err = run_hook(fake, POST_INPUT, "--timeout", "3600")
    assert (code, out) == (0, ""), "exit 0: the call already ran, nothing to block"
    assert time.monotonic() - started < REPORT_DEADLINE + 1, "a short deadline, whatever --timeout says"
    assert "did not get the report" in err
    assert len(fake.sent("report")) >= 2, "retried within its deadline"


@pytest.mark.parametrize(
    "hook_input",
    [
        {**POST_INPUT, "tool_input": "ls"},
        {**POST_INPUT, "tool_name": None},
        {**POST_INPUT, "session_id": 7},
    ],
    ids=["tool_input", "tool_name", "session_id"],
)
def test_a_malformed_post_tool_use_input_exits_0(hook_input: dict[str, Any]) -> None:
    fake = Scripted()
    code, out, err = run_hook(fake, hook_input)
    assert (code, out) == (0, "")
    assert "could not report" in err
    assert fake.requests == []


def test_a_bug_while_reporting_exits_0() -> None:
    class Broken(GateClient):
        def post_tool_use(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("bug")

    code, out, err = run_hook(None, POST_INPUT, client=Broken(URL, KEY))
    assert (code, out) == (0, "")
    assert "RuntimeError: bug" in err


def test_a_large_tool_response_is_cut_to_fit_the_report() -> None:
    fake = Scripted()
    big = {**POST_INPUT, "tool_response": {"stdout": "x" * 200_000}}
    assert run_hook(fake, big)[0] == 0
    (report,) = fake.bodies("report")
    assert report["result"]["truncated"] is True
    assert report["result"]["bytes"] > 200_000
    assert len(fake.sent("report")[0].content) < 32 * 1024


def test_build_output_never_allows_a_failure_or_pending() -> None:
    from signoff.hooks.client import GateFailure

    for failure in GateFailure:
        assert build_output(GateDecision(False, "x", failure=failure)) is None
    assert build_output(GateDecision(False, "x", "req", pending=True)) is None


@pytest.mark.parametrize(("timeout", "deadline"), [(3600, 3300), (600, 540), (60, 54), (20, 15), (8, 4)])
def test_internal_deadline_stays_below_the_hook_timeout(timeout: float, deadline: float) -> None:
    assert internal_deadline(timeout) == deadline


# --------------------------------------------------------------------------- real process, real HTTP


def spawn_hook(
    url: str, *args: str, hook_input: dict[str, Any] = HOOK_INPUT
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SIGNOFF_URL": url, "SIGNOFF_API_KEY": KEY, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "signoff.hooks.adapters.claude_code", "--timeout", "60", *args],
        input=json.dumps(hook_input),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_piped_hook_json_approved_through_a_real_server(live: LiveSignoff) -> None:
    def approve() -> None:
        live.decide(live.wait_for_request(timeout=30), "approved", name="Alice")

    approver = threading.Thread(target=approve)
    approver.start()
    done = spawn_hook(live.url)
    approver.join()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert live.submissions[0]["idempotency_key"] == "claude-code:abc123:toolu_01ABC123"


def test_piped_hook_json_with_the_server_down_exits_2() -> None:
    server = LiveSignoff().start()
    url = server.url
    server.stop()
    done = spawn_hook(url, "--deadline", "1")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Blocked by the Signoff approval hook" in done.stderr
