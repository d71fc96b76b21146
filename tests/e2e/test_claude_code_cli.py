"""The real Claude Code CLI, gated by Signoff's command hook, against a fake Anthropic API.

Each test builds a throwaway project whose ``.claude/settings.json`` sends Bash (and Write,
Edit, NotebookEdit, MCP tools) through ``signoff-hook claude-code`` — before each call
(PreToolUse) and after it (PostToolUse, PostToolUseFailure: the report) — points the CLI at
:mod:`tests.e2e.fake_anthropic` on loopback, and runs ``claude -p`` once. The scripted model
asks for one Bash command that writes a marker file; Signoff (a real server, SQLite) holds
it under a gate on ``Bash`` until the test votes as a person would.

The CLI runs with ``--allowedTools Bash``, so Claude Code's own permission check would let
the command run: when it does not, the hook blocked it. A PreToolUse ``deny`` and a hook's
exit 2 are both evaluated before allow rules and override them (``test_hook_blocks_*`` and
``test_signoff_stopped_*`` show it; ``test_on_failure_block_*`` shows the same allow rule
letting the command through when a hook merely fails).
``--dangerously-skip-permissions`` is no choice here: the CLI refuses it when run as root.

The CLI is the pinned one ``scripts/ensure-claude-code.sh`` installs into
``<venv>/claude-code`` (``SIGNOFF_TEST_CLAUDE`` names another binary). Without it these tests
skip, or fail when ``CI`` is set.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.keys import create_key
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.channels import Verdict
from signoff.hooks.adapters.claude_code import DENIED_CONTEXT
from tests.conftest import Server, free_port
from tests.e2e.fake_anthropic import FakeAnthropic, Script

pytestmark = pytest.mark.e2e

VENV_BIN = Path(sys.executable).parent
EXAMPLE_SETTINGS = Path(__file__).resolve().parents[2] / "examples" / "claude_code_settings.json"
CLAUDE = Path(
    os.environ.get("SIGNOFF_TEST_CLAUDE", Path(sys.prefix) / "claude-code/node_modules/.bin/claude")
)
AGENT = "coding-agent"
HOOK_TIMEOUT = 3600
CLI_DENY_LABEL = "PreToolUse:Bash hook error: "
"""How the CLI starts the tool result of any PreToolUse deny, a hook's deliberate one included."""
CLI_CONTEXT_LABEL = "PreToolUse:Bash hook additional context: "
RUN_TIMEOUT = 60.0
"""Seconds one ``claude -p`` run may take before the test kills it."""

CONFIG: dict[str, Any] = {
    "channels": {"chat": {"type": "fake"}},
    "people": {
        "alice": {"name": "Alice", "web": "alice", "fake": "U_ALICE"},
        "bob": {"name": "Bob", "web": "bob", "fake": "U_BOB"},
    },
    "agents": {
        AGENT: {
            "hooks": [
                {
                    "type": "confirmation_gate",
                    "name": "shell",
                    "tools": ["Bash"],
                    "channel": "chat",
                    "approvers": ["alice", "bob"],
                    "quorum": 1,
                    "timeout": "10m",
                },
                {"type": "audit_log", "tools": ["*"]},
            ]
        }
    },
}


def hook_handler() -> dict[str, Any]:
    """The command handler for ``signoff-hook`` (or ``signoff hook`` where that script is absent)."""
    hook = VENV_BIN / "signoff-hook"
    timeout_args = ["claude-code", "--timeout", str(HOOK_TIMEOUT)]
    if hook.exists():
        return {"type": "command", "command": str(hook), "args": timeout_args, "timeout": HOOK_TIMEOUT}
    command = str(VENV_BIN / "signoff")
    return {"type": "command", "command": command, "args": ["hook", *timeout_args], "timeout": HOOK_TIMEOUT}


def project_hook_command() -> str:
    """The command line the CLI names when the PreToolUse handler of :func:`hook_handler` fails."""
    handler = hook_handler()
    return " ".join([handler["command"], *handler["args"]])


def gated_settings(handler: dict[str, Any], report: dict[str, Any] | None = None) -> dict[str, Any]:
    """PreToolUse through ``handler``; PostToolUse and PostToolUseFailure through ``report``."""
    matcher = "^(Bash|Write|Edit|NotebookEdit)$|^mcp__"
    hooks = {"PreToolUse": [{"matcher": matcher, "hooks": [handler]}]}
    if report is not None:
        for event in ("PostToolUse", "PostToolUseFailure"):
            hooks[event] = [{"matcher": matcher, "hooks": [report]}]
    return {"hooks": hooks}


def report_handler() -> dict[str, Any]:
    handler = hook_handler()
    args = [*handler["args"][: handler["args"].index("--timeout")], "--timeout", "10"]
    return {**handler, "args": args, "timeout": 10}


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(CONFIG, source="e2e.yaml")


@pytest.fixture
async def agent_key(runtime: Runtime) -> str:
    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, AGENT, actor=Actor("test"))
    return token


@pytest.fixture
def claude_binary() -> Path:
    if not (CLAUDE.is_file() and os.access(CLAUDE, os.X_OK)):
        message = f"{CLAUDE} is missing: `bash scripts/ensure-claude-code.sh` installs the Claude Code CLI"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CLAUDE


@dataclass
class Project:
    root: Path
    home: Path
    tmp: Path

    @property
    def marker(self) -> Path:
        return self.root / "marker.txt"

    @property
    def command(self) -> str:
        return f"echo signoff-ran > {shlex.quote(str(self.marker))}"

    def script(self) -> Script:
        return Script("Bash", {"command": self.command, "description": "Write the marker file"})

    def configure(self, settings: dict[str, Any]) -> None:
        (self.root / ".claude").mkdir(exist_ok=True)
        (self.root / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2))


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A project directory gated through Signoff, and an empty home and temporary directory for the CLI."""
    p = Project(root=tmp_path / "project", home=tmp_path / "home", tmp=tmp_path / "tmp")
    for directory in (p.root, p.home, p.tmp):
        directory.mkdir()
    p.configure(gated_settings(hook_handler(), report_handler()))
    return p


@dataclass
class Run:
    returncode: int
    output: dict[str, Any]
    """The ``--output-format json`` result object."""
    stderr: str


class Claude:
    """Runs ``claude -p`` in a project; a run still going when the test ends is killed."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self._procs: list[asyncio.subprocess.Process] = []

    async def run(self, project: Project, fake: FakeAnthropic, signoff_url: str, signoff_key: str) -> Run:
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep)
        env = {
            # Never this virtualenv's bin: every hook is found by its settings alone.
            "PATH": os.pathsep.join(p for p in path if Path(p) != VENV_BIN),
            "HOME": str(project.home),
            "TMPDIR": str(project.tmp),  # the CLI keeps per-project scratch files there
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "test",
            # Nothing but the Messages API: no telemetry, error reports, update checks.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # The hook is a child of the CLI and reads these from the environment it inherits.
            "SIGNOFF_URL": signoff_url,
            "SIGNOFF_API_KEY": signoff_key,
        }
        proc = await asyncio.create_subprocess_exec(
            str(self.binary),
            "-p",
            "Write the marker file.",
            "--output-format",
            "json",
            "--allowedTools",
            "Bash",
            "--max-turns",
            "4",
            cwd=project.root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._procs.append(proc)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
        except TimeoutError:
            await self._kill(proc)
            raise AssertionError(f"claude -p did not finish within {RUN_TIMEOUT:g}s") from None
        assert proc.returncode is not None
        try:
            output = json.loads(out)
        except ValueError:
            raise AssertionError(f"claude -p printed no JSON result: {out!r} {err!r}") from None
        return Run(proc.returncode, output, err.decode(errors="replace"))

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        """SIGTERM first: the CLI then ends its running hooks (each runs in a session of its own,
        out of reach of a signal to the CLI's process group); SIGKILL if it lingers."""
        if proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def aclose(self) -> None:
        for proc in self._procs:
            await self._kill(proc)


@pytest.fixture
async def claude(claude_binary: Path) -> AsyncIterator[Claude]:
    c = Claude(claude_binary)
    try:
        yield c
    finally:
        await c.aclose()


@asynccontextmanager
async def admin_client(url: str, admin_headers: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, headers=admin_headers, timeout=10) as client:
        yield client


async def pending_request(admin: httpx.AsyncClient, run: asyncio.Task[Run]) -> dict[str, Any]:
    """The one request the hook is waiting on, as the operator API lists it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if run.done():
            result = run.result()
            raise AssertionError(f"claude -p finished without waiting for Signoff: {result}")
        listed = (await admin.get("/v1/admin/requests", params={"status": "pending"})).json()
        if listed:
            (request,) = listed
            assert isinstance(request, dict)
            return request
        await asyncio.sleep(0.05)
    raise AssertionError("no pending request appeared")


async def vote(
    runtime: Runtime, request_id: str, verdict: Verdict, who: str, reason: str | None = None
) -> None:
    async with transaction(runtime.sessions) as session:
        await decide(session, request_id, verdict=verdict, operator=who, config=runtime.config, reason=reason)


async def decide_while_claude_waits(
    claude: Claude,
    project: Project,
    fake: FakeAnthropic,
    server: Server,
    agent_key: str,
    admin_headers: dict[str, str],
    verdict: Verdict,
    who: str,
    reason: str | None = None,
) -> tuple[dict[str, Any], Run]:
    async with admin_client(server.url, admin_headers) as admin:
        run = asyncio.create_task(claude.run(project, fake, server.url, agent_key))
        try:
            request = await pending_request(admin, run)
            assert not project.marker.exists(), "the command ran before anyone decided"
            await vote(server.runtime, request["id"], verdict, who, reason)
            return request, await run
        finally:
            if not run.done():  # the test failed first; Claude.aclose kills the process
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)


def denial_ids(run: Run) -> list[str]:
    return [d.get("tool_use_id") for d in run.output.get("permission_denials", [])]


async def reported_calls(server: Server, admin_headers: dict[str, str]) -> list[dict[str, Any]]:
    """The executed calls the server was told of (the ``audit_log`` hook records each report)."""
    async with admin_client(server.url, admin_headers) as admin:
        events = (await admin.get("/v1/admin/audit")).json()
    return [e["detail"] for e in events if e["action"] == "tool_call"]


async def test_approved_command_runs(
    claude: Claude, project: Project, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    script = project.script()
    async with FakeAnthropic(script) as fake:
        request, run = await decide_while_claude_waits(
            claude, project, fake, server, agent_key, admin_headers, Verdict.APPROVE, "alice"
        )

    assert request["agent_id"] == AGENT
    assert request["gate"] == "shell"
    assert request["tool_name"] == "Bash"
    assert request["arguments"]["command"] == project.command
    assert request["tool_call_id"] == script.tool_use_id
    assert request["session_id"] == run.output["session_id"]

    assert run.returncode == 0, run.stderr
    assert project.marker.read_text() == "signoff-ran\n"
    assert run.output["result"] == script.final_text
    assert denial_ids(run) == []
    assert len(fake.model_requests) == 2, "the tool call, then the answer to its result"
    (result,) = fake.tool_results()
    assert not result.get("is_error")
    assert "Signoff" not in fake.tool_result_text()

    # The PostToolUse hook reported the call that ran: same session and tool use, so same key.
    (reported,) = await reported_calls(server, admin_headers)
    assert (reported["tool"], reported["arguments"]["command"]) == ("Bash", project.command)
    assert (reported["session_id"], reported["tool_call_id"]) == (request["session_id"], script.tool_use_id)
    assert reported["error"] is None


async def test_the_example_settings_work_in_a_project_with_its_own_virtualenv(
    claude: Claude, tmp_path: Path, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """``examples/claude_code_settings.json`` as it is, in an agent project (a space in its path)
    whose own ``.venv`` holds ``signoff-hook``, with no ``signoff-hook`` on the PATH: the CLI
    finds the hook through ``"$CLAUDE_PROJECT_DIR"``, for PreToolUse and for the report."""
    project = Project(root=tmp_path / "agent project", home=tmp_path / "home", tmp=tmp_path / "tmp")
    for directory in (project.root / ".venv" / "bin", project.home, project.tmp):
        directory.mkdir(parents=True)
    # The console script, as `pip install` of signoff-hooks into the project's venv leaves it.
    (project.root / ".venv" / "bin" / "signoff-hook").symlink_to(VENV_BIN / "signoff-hook")
    project.configure(json.loads(EXAMPLE_SETTINGS.read_text(encoding="utf-8")))
    script = project.script()
    async with FakeAnthropic(script) as fake:
        request, run = await decide_while_claude_waits(
            claude, project, fake, server, agent_key, admin_headers, Verdict.APPROVE, "alice"
        )

    assert run.returncode == 0, run.stderr
    assert request["arguments"]["command"] == project.command
    assert project.marker.read_text() == "signoff-ran\n"
    assert denial_ids(run) == []
    (reported,) = await reported_calls(server, admin_headers)
    assert (reported["tool_call_id"], reported["arguments"]["command"]) == (
        script.tool_use_id,
        project.command,
    )


async def test_an_edited_command_runs_as_edited_and_is_reported_under_the_same_key(
    claude: Claude, project: Project, runtime: Runtime, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """Signoff answers ``allow`` with ``modified_arguments`` (here from a server-side rewrite,
    as an approver's edit would): Claude Code runs the ``updatedInput``, and the PostToolUse
    report carries that input under the PreToolUse call's key."""
    from signoff.hooks import HookContext, HookRegistry, HookResult
    from tests.hooks.test_edits_server import POST, PRE, Recorder

    edited = project.root / "edited.txt"

    class EditCommand:
        name = "edit command"
        priority = 50

        def matches(self, ctx: HookContext) -> bool:
            return ctx.tool_name == "Bash"

        async def before_tool_use(self, ctx: HookContext) -> HookResult:
            command = str(ctx.arguments["command"]).replace(str(project.marker), str(edited))
            return HookResult.allow(modified_arguments={**ctx.arguments, "command": command})

    configured = runtime.registries[AGENT]
    runtime.registries[AGENT] = HookRegistry(
        pre_tool_use=[EditCommand(), *configured.pre_tool_use], post_tool_use=configured.post_tool_use
    )
    server = Server(runtime)
    recorder = Recorder(server._server.config.app)
    server._server.config.app = recorder
    async with server, FakeAnthropic(project.script()) as fake:
        request, run = await decide_while_claude_waits(
            claude, project, fake, server, agent_key, admin_headers, Verdict.APPROVE, "alice"
        )
        reported = await reported_calls(server, admin_headers)

    assert run.returncode == 0, run.stderr
    assert not project.marker.exists(), "the original command never ran"
    assert edited.read_text() == "signoff-ran\n", "Claude Code ran the approved (edited) input"
    assert request["arguments"]["command"] == f"echo signoff-ran > {edited}"
    (report,) = recorder.bodies[POST]
    assert report["arguments"]["command"] == f"echo signoff-ran > {edited}", "the input it ran with"
    assert (
        report["idempotency_key"] == f"claude-code:{run.output['session_id']}:{project.script().tool_use_id}"
    )
    assert {b["idempotency_key"] for b in recorder.bodies[PRE]} == {report["idempotency_key"]}
    assert [r["arguments"]["command"] for r in reported] == [f"echo signoff-ran > {edited}"]


async def test_a_failed_command_is_reported_with_its_error(
    claude: Claude, project: Project, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    """A tool that fails fires PostToolUseFailure, not PostToolUse: it ran, so it is reported."""
    script = Script("Bash", {"command": "echo oops >&2; exit 3", "description": "Fail"})
    async with FakeAnthropic(script) as fake:
        _, run = await decide_while_claude_waits(
            claude, project, fake, server, agent_key, admin_headers, Verdict.APPROVE, "alice"
        )
    assert run.returncode == 0, run.stderr
    (reported,) = await reported_calls(server, admin_headers)
    assert reported["arguments"]["command"] == "echo oops >&2; exit 3"
    assert reported["error"].startswith("Exit code 3")
    assert reported["tool_call_id"] == script.tool_use_id


async def test_hook_blocks_a_rejected_command_and_the_model_reads_the_reason(
    claude: Claude, project: Project, server: Server, agent_key: str, admin_headers: dict[str, str]
) -> None:
    script = project.script()
    async with FakeAnthropic(script) as fake:
        _, run = await decide_while_claude_waits(
            claude,
            project,
            fake,
            server,
            agent_key,
            admin_headers,
            Verdict.REJECT,
            "bob",
            reason="not on a Friday",
        )

    assert run.returncode == 0, run.stderr
    assert not project.marker.exists()
    (result,) = fake.tool_results()
    assert result.get("is_error") is True
    # The hook answers a deny as Claude Code documents a deliberate one (JSON, exit 0). The CLI
    # labels every PreToolUse deny "hook error"; a deliberate one is followed by the reason
    # alone, where a failure (exit 2) carries the command that failed (see the next test).
    assert fake.tool_result_text() == (f"{CLI_DENY_LABEL}Signoff: Rejected by Bob (web): not on a Friday")
    assert f"{CLI_CONTEXT_LABEL}{DENIED_CONTEXT}" in fake.texts_sent(), "and Claude is told it is a decision"
    assert denial_ids(run) == [script.tool_use_id]
    assert run.output["result"] == script.final_text, "the model was asked again, with the reason"


async def test_signoff_stopped_blocks_the_command(claude: Claude, project: Project) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    script = project.script()
    async with FakeAnthropic(script) as fake:
        run = await claude.run(project, fake, url, "signoff-agent-key")

    assert run.returncode == 0, run.stderr
    assert not project.marker.exists()
    (result,) = fake.tool_results()
    assert result.get("is_error") is True
    text = fake.tool_result_text()
    # A failure exits 2: blocked, and shown as the failure it is, the command then its stderr.
    assert text.startswith(
        f"{CLI_DENY_LABEL}[{project_hook_command()}]: Blocked by the Signoff approval hook: "
    )
    assert url in text
    assert not any(DENIED_CONTEXT in t for t in fake.texts_sent()), "no decision was made"
    assert denial_ids(run) == [script.tool_use_id]


@pytest.mark.parametrize("on_failure", [None, "block"])
async def test_on_failure_block_is_honoured_by_the_cli(
    claude: Claude, project: Project, tmp_path: Path, on_failure: str | None
) -> None:
    """A hook that cannot start is a non-blocking error unless ``onFailure`` is ``"block"``.

    Signoff's hook exits 2 on its own errors, which blocks either way; ``onFailure`` covers
    the hook that never runs (a wrong path, a broken install) or exceeds its ``timeout``.
    """
    handler: dict[str, Any] = {"type": "command", "command": str(tmp_path / "no-such-hook"), "timeout": 30}
    if on_failure is not None:
        handler["onFailure"] = on_failure
    project.configure(gated_settings(handler))
    script = project.script()
    async with FakeAnthropic(script) as fake:
        run = await claude.run(project, fake, f"http://127.0.0.1:{free_port()}", "unused")

    assert run.returncode == 0, run.stderr
    if on_failure == "block":
        assert not project.marker.exists()
        assert 'onFailure is "block"' in fake.tool_result_text()
        assert denial_ids(run) == [script.tool_use_id]
    else:
        assert project.marker.read_text() == "signoff-ran\n", "fails open: the reason for exit 2"
        assert denial_ids(run) == []
