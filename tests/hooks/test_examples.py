"""The scripts in examples/ run as they are against a real Signoff serving examples/signoff.yaml.

Each runs as a subprocess with only SIGNOFF_URL / SIGNOFF_API_KEY (and the examples' own
SIGNOFF_DEADLINE) set: a small payment is allowed at once, a large one waits until the test
approves the request the script printed. SQLite only: what is under test is the agent side.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, load_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.models import ConfirmationRequest, Status
from signoff.app.operators import decide
from signoff.app.requests.eligibility import gates_of
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from tests.conftest import Server, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
HINT = re.compile(r"approve with: signoff requests approve (\w+) --as alice")

SCRIPTS = {
    # script: (invoice number prefix, the gated call's idempotency key, module the script needs)
    "python_client.py": ("INV-100", r"python:\w{8}:INV-1002:[0-9a-f]{16}", None),
    "pydantic_ai_agent.py": ("INV-200", r"pydantic-ai:\w{32}:pyd_ai_\w+", "pydantic_ai"),
    "langchain_agent.py": ("INV-300", r"langchain:\w{32}:call_2", "langchain"),
    "openai_agents_agent.py": ("INV-400", r"openai-agents:\w{32}:call_2", "agents"),
}


@pytest.fixture
def config() -> SignoffConfig:
    return load_config(EXAMPLES / "signoff.yaml")


@pytest.fixture
async def demo_key(runtime: Runtime) -> str:
    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, "demo-agent", actor=Actor("test"))
    return token


def example_env(url: str, key: str, *, deadline: float = 20) -> dict[str, str]:
    return {
        **os.environ,
        "SIGNOFF_URL": url,
        "SIGNOFF_API_KEY": key,
        "SIGNOFF_DEADLINE": str(deadline),
        "PYTHONPATH": str(REPO),
    }


Spawn = Callable[..., Awaitable[asyncio.subprocess.Process]]


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    """Start a process with pipes; one still running when the test ends is killed."""
    started: list[asyncio.subprocess.Process] = []

    async def start(*command: str, env: dict[str, str]) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def read_until_hint(proc: asyncio.subprocess.Process) -> tuple[str, str]:
    """Read the script's output up to its approval hint; return (output so far, request id)."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    seen = ""
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line:
            err = (await proc.stderr.read()).decode()
            raise AssertionError(f"exited without asking for approval:\n{seen}\n{err}")
        seen += line
        if found := HINT.search(line):
            return seen, found.group(1)


async def finish(proc: asyncio.subprocess.Process, stdin: bytes | None = None) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(stdin), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def vote(runtime: Runtime, request_id: str, verdict: Verdict, reason: str | None = None) -> None:
    async with transaction(runtime.sessions) as session:
        await decide(
            session, request_id, verdict=verdict, operator="alice", config=runtime.config, reason=reason
        )


async def stored_requests(runtime: Runtime) -> list[ConfirmationRequest]:
    async with runtime.sessions() as session:
        return list((await session.exec(select(ConfirmationRequest))).all())


async def first_request(runtime: Runtime) -> ConfirmationRequest:
    for _ in range(200):
        if requests := await stored_requests(runtime):
            return requests[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no request appeared")


@pytest.mark.parametrize("script", list(SCRIPTS))
async def test_example_allows_a_small_payment_and_waits_for_approval_of_a_large_one(
    script: str, server: Server, demo_key: str, runtime: Runtime, spawn: Spawn
) -> None:
    invoice, key_pattern, needs = SCRIPTS[script]
    if needs is not None:
        pytest.importorskip(needs)
    proc = await spawn(sys.executable, str(EXAMPLES / script), env=example_env(server.url, demo_key))
    before, request_id = await read_until_hint(proc)
    assert f"pay_invoice(invoice_id='{invoice}1', amount=120): allowed (no approval needed)" in before
    assert (
        f"pay_invoice(invoice_id='{invoice}2', amount=90000): "
        f"waiting for approval (Signoff request {request_id})"
    ) in before

    (request,) = await stored_requests(runtime)  # one request: the wait re-attached to it
    assert request.id == request_id
    assert request.status == Status.PENDING
    assert request.agent_id == "demo-agent"
    assert [g.name for g in gates_of(request)] == ["large payments"]
    assert re.fullmatch(key_pattern, request.idempotency_key or ""), request.idempotency_key

    await vote(runtime, request_id, Verdict.APPROVE)
    code, after, err = await finish(proc)
    assert code == 0, err
    assert "Traceback" not in err
    assert f"pay_invoice(invoice_id='{invoice}2', amount=90000): allowed (" in after
    assert f"paid invoice {invoice}1 (120 EUR)" in before + after
    assert f"paid invoice {invoice}2 (90000 EUR)" in after
    assert len(await stored_requests(runtime)) == 1


async def test_python_client_example_reports_a_rejection(
    server: Server, demo_key: str, runtime: Runtime, spawn: Spawn
) -> None:
    proc = await spawn(
        sys.executable, str(EXAMPLES / "python_client.py"), env=example_env(server.url, demo_key)
    )
    _, request_id = await read_until_hint(proc)
    await vote(runtime, request_id, Verdict.REJECT, reason="not this quarter")
    code, after, err = await finish(proc)
    assert code == 0, err
    # The wording depends on whether the vote landed before the decorated call re-submitted
    # (the server's replay: "rejected by …") or while it waited ("Rejected by … (web)").
    denied = r"pay_invoice\(invoice_id='INV-1002', amount=90000\): denied \((?i:rejected) by Alice Example"
    assert re.search(denied + r".*: not this quarter\)", after), after
    assert "paid invoice INV-1002" not in after


async def test_python_client_example_fails_closed_when_signoff_is_down(spawn: Spawn) -> None:
    env = example_env(f"http://127.0.0.1:{free_port()}", "sk_unused", deadline=1)
    code, out, err = await finish(await spawn(sys.executable, str(EXAMPLES / "python_client.py"), env=env))
    assert code == 0, err
    assert out.count("not run, Signoff could not decide") == 2
    assert "paid invoice" not in out


CLAUDE_CODE_SETTINGS = EXAMPLES / "claude_code_settings.json"
PROJECT_HOOK = "$CLAUDE_PROJECT_DIR/.venv/bin/signoff-hook"
"""Where the example finds the hook: the agent project's own virtualenv, whatever the PATH."""


def claude_code_handler(event: str = "PreToolUse") -> tuple[str, dict[str, Any]]:
    settings = json.loads(CLAUDE_CODE_SETTINGS.read_text(encoding="utf-8"))
    (group,) = settings["hooks"][event]
    (handler,) = group["hooks"]
    return group["matcher"], handler


def hook_argv(handler: dict[str, Any]) -> list[str]:
    """The handler's command line as a shell splits it (variables left as written)."""
    assert "args" not in handler, "the string form: `args` would mean no shell, so no $CLAUDE_PROJECT_DIR"
    return shlex.split(handler["command"])


def test_claude_code_settings_snippet() -> None:
    matcher, handler = claude_code_handler()
    for name in ("Bash", "Write", "Edit", "NotebookEdit", "mcp__github__create_issue"):
        assert re.search(matcher, name), name
    for name in ("Read", "BashOutput", "MultiEditor", "Grep"):
        assert not re.search(matcher, name), name
    assert handler["type"] == "command"
    # Quoted, so that a project path with a space in it still names one file.
    assert handler["command"].startswith('"$CLAUDE_PROJECT_DIR"/.venv/bin/signoff-hook ')
    argv = hook_argv(handler)
    assert argv[:2] == [PROJECT_HOOK, "claude-code"]
    assert handler["onFailure"] == "block"
    # The hook must know Claude Code's timeout, to give up (exit 2) before Claude Code does.
    assert float(argv[argv.index("--timeout") + 1]) == handler["timeout"] >= 600


@pytest.mark.parametrize("document", ["README.md", "docs/agents.md"])
def test_the_documents_show_the_example_settings(document: str) -> None:
    """The Claude Code settings a document shows are the example file's, as they are."""
    text = (REPO / document).read_text(encoding="utf-8")
    blocks = re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)
    shown = [json.loads(b) for b in blocks if '"PreToolUse"' in b]
    assert shown == [json.loads(CLAUDE_CODE_SETTINGS.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("event", ["PostToolUse", "PostToolUseFailure"])
def test_claude_code_settings_report_every_call_the_gate_sees(event: str) -> None:
    """The same command reports the calls the PreToolUse hook gated, succeeded or failed."""
    matcher, _ = claude_code_handler()
    post_matcher, post = claude_code_handler(event)
    assert post_matcher == matcher
    argv = hook_argv(post)
    assert (post["type"], argv[:2]) == ("command", [PROJECT_HOOK, "claude-code"])
    # Claude Code waits for it, but never long: the report gives up after 2 s and exits 0.
    assert float(argv[argv.index("--timeout") + 1]) == post["timeout"] <= 30
    assert "onFailure" not in post, "a report that fails must not block anything"
    assert "async" not in post, "claude -p ends async hooks with the run: the report would be lost"


async def test_claude_code_settings_command_against_the_server(
    server: Server, demo_key: str, runtime: Runtime, spawn: Spawn, tmp_path: Path
) -> None:
    """Each handler's command, run by a shell as Claude Code runs it, in a project whose own
    virtualenv holds the hook (the end-to-end suite runs the same file under the real CLI)."""
    _, handler = claude_code_handler()
    hook = Path(sys.executable).with_name("signoff-hook")
    assert hook.exists(), "the signoff-hook console script is not installed"
    project = tmp_path / "agent project"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "signoff-hook").symlink_to(hook)
    env = {**example_env(server.url, demo_key), "CLAUDE_PROJECT_DIR": str(project)}
    shell = shutil.which("sh")
    assert shell is not None

    def hook_input(tool_name: str, tool_input: dict[str, Any], tool_use_id: str) -> bytes:
        data = {
            "session_id": "sess-1",
            "hook_event_name": "PreToolUse",
            "tool_name": tool_name,
            "tool_input": tool_input,
            "tool_use_id": tool_use_id,
            "cwd": str(REPO),
            "permission_mode": "default",
        }
        return json.dumps(data).encode()

    # No gate of examples/signoff.yaml matches Write: no opinion, Claude Code's own rules apply.
    proc = await spawn(shell, "-c", handler["command"], env=env)
    code, out, err = await finish(proc, hook_input("Write", {"file_path": "/tmp/x", "content": "x"}, "t1"))
    assert (code, json.loads(out)) == (0, {}), err

    # Bash matches the "shell" gate: the hook waits for a person, then answers allow.
    proc = await spawn(shell, "-c", handler["command"], env=env)
    assert proc.stdin is not None
    proc.stdin.write(hook_input("Bash", {"command": "make test"}, "t2"))
    await proc.stdin.drain()
    proc.stdin.close()
    request = await first_request(runtime)
    assert request.idempotency_key == "claude-code:sess-1:t2"
    await vote(runtime, request.id, Verdict.APPROVE)
    code, out, err = await finish(proc)
    assert code == 0, err
    assert json.loads(out)["hookSpecificOutput"] == {
        "hookEventName": "PreToolUse",
        "permissionDecision": "allow",
        "permissionDecisionReason": "Signoff: Approved by Alice Example (web)",
    }

    # Once the command ran, the PostToolUse handler reports it and lets Claude Code go on.
    _, post = claude_code_handler("PostToolUse")
    report = {
        **json.loads(hook_input("Bash", {"command": "make test"}, "t2")),
        "hook_event_name": "PostToolUse",
        "tool_response": {"stdout": "ok", "stderr": "", "interrupted": False},
    }
    code, out, err = await finish(
        await spawn(shell, "-c", post["command"], env=env), json.dumps(report).encode()
    )
    assert (code, out, err) == (0, "", "")
