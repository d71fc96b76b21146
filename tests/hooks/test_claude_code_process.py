"""``signoff-hook claude-code`` as Claude Code runs it: a new process per call, against the real
server (or nothing at all), timed against its own deadlines."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from signoff.app.runtime import Runtime
from signoff.hooks.adapters import claude_code
from signoff.hooks.adapters.claude_code import REPORT_DEADLINE
from tests.conftest import Server, free_port
from tests.hooks.test_client_server import admin_client, pending_ids
from tests.waiting import eventually

HOOK = Path(sys.executable).with_name("signoff-hook")
MARGIN = 1.5
"""Seconds a refused call may take beyond its deadline (process start-up on a loaded machine)."""

UNGATED = {
    "session_id": "sess-1",
    "hook_event_name": "PreToolUse",
    "tool_name": "read_file",
    "tool_input": {"path": "/etc/hosts"},
    "tool_use_id": "toolu_ungated",
}
GATED = {
    **UNGATED,
    "tool_name": "pay_invoice",
    "tool_input": {"amount": 90_000},
    "tool_use_id": "toolu_gated",
}


def hook_env(url: str, key: str = "k", **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    return {**env, "SIGNOFF_URL": url, "SIGNOFF_API_KEY": key, **extra}


async def start_hook(
    env: dict[str, str], hook_input: dict[str, Any], *args: str, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        str(HOOK),
        "claude-code",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(hook_input).encode())
    proc.stdin.close()
    return proc


async def finish(proc: asyncio.subprocess.Process, timeout: float = 60) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def run_hook(
    env: dict[str, str], hook_input: dict[str, Any], *args: str
) -> tuple[int, str, str, float]:
    started = time.monotonic()
    code, out, err = await finish(await start_hook(env, hook_input, *args))
    return code, out, err, time.monotonic() - started


# --- Signoff unreachable: blocked fast, with a reason that says what to check -----------------------


@pytest.mark.parametrize(
    ("how", "deadline"), [("flag", 1.0), ("env", 2.0)], ids=["--submit-deadline", "SIGNOFF_SUBMIT_DEADLINE"]
)
async def test_nothing_listening_is_blocked_within_the_submit_deadline(how: str, deadline: float) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    if how == "flag":
        env, args = hook_env(url), ["--submit-deadline", f"{deadline:g}"]
    else:
        env, args = hook_env(url, SIGNOFF_SUBMIT_DEADLINE=f"{deadline:g}"), []
    code, out, err, took = await run_hook(env, GATED, *args)
    assert code == 2
    assert out == ""
    assert deadline * 0.8 <= took <= deadline + MARGIN, took
    assert err.count("\n") == 1
    assert err.startswith(f"Blocked by the Signoff approval hook: Signoff at {url} refused the connection")
    assert "`signoff serve` is running" in err
    assert "SIGNOFF_URL" in err


@pytest.mark.parametrize("event", ["PostToolUse", "PostToolUseFailure"])
async def test_a_report_with_nothing_listening_lets_the_agent_go_on_at_once(event: str) -> None:
    """After the tool ran there is nothing to block: exit 0 within the report's short deadline,
    whatever the hook's --timeout, with one line on stderr."""
    url = f"http://127.0.0.1:{free_port()}"
    post = {**GATED, "hook_event_name": event, "tool_response": "ok", "error": "Exit code 1"}
    code, out, err, took = await run_hook(hook_env(url), post, "--timeout", "3600")
    assert (code, out) == (0, "")
    assert took <= REPORT_DEADLINE + MARGIN, took
    assert err.count("\n") == 1
    assert err.startswith("Signoff did not get the report of this pay_invoice call:")


def test_the_default_submit_deadline_is_five_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither ``--submit-deadline`` nor ``SIGNOFF_SUBMIT_DEADLINE``: the hook's client retries
    an unreachable Signoff for 5 s. That a process keeps to the deadline it is given is
    tested above; waiting out the default here would test the clock, not the default."""
    monkeypatch.delenv("SIGNOFF_SUBMIT_DEADLINE", raising=False)
    monkeypatch.setenv("SIGNOFF_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SIGNOFF_API_KEY", "sk-test")
    for url in ("http://127.0.0.1:9", "https://signoff.example"):  # the plain and the httpx client
        monkeypatch.setenv("SIGNOFF_URL", url)
        client = claude_code._client(claude_code._arguments([]))
        assert client.settings.submit_deadline == 5.0


async def test_tls_to_a_plain_http_server_is_told_apart(server: Server) -> None:
    https = server.url.replace("http://", "https://")
    code, _, err, _ = await run_hook(hook_env(https), GATED, "--submit-deadline", "1")
    assert code == 2
    assert f"TLS with Signoff at {https} failed" in err
    assert "http:// vs https://" in err


async def test_an_unresolvable_host_is_told_apart() -> None:
    url = "http://signoff.invalid:8000"
    code, _, err, _ = await run_hook(hook_env(url), GATED, "--submit-deadline", "1")
    assert code == 2
    assert "the host in http://signoff.invalid:8000 could not be resolved" in err
    assert "check SIGNOFF_URL" in err


async def test_a_bad_submit_deadline_blocks() -> None:
    env = hook_env("http://127.0.0.1:9", SIGNOFF_SUBMIT_DEADLINE="soon")
    code, _, err, _ = await run_hook(env, UNGATED)
    assert code == 2
    assert "SIGNOFF_SUBMIT_DEADLINE must be a number of seconds, got 'soon'" in err


async def test_a_restart_within_the_submit_deadline_goes_through(runtime: Runtime, agent_key: str) -> None:
    server = Server(runtime)  # its port is chosen, nothing listens yet
    proc = await start_hook(hook_env(server.url, agent_key), UNGATED, "--submit-deadline", "6")
    await asyncio.sleep(1.0)
    async with server:
        code, out, err = await finish(proc)
    assert code == 0, err
    assert json.loads(out) == {}


# --- a server that never finishes its answer ---------------------------------------------------------


async def test_a_server_trickling_bytes_is_given_up_at_the_deadline() -> None:
    handlers: list[asyncio.Task[None]] = []

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            await reader.read(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(trickle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        code, out, err, took = await run_hook(
            hook_env(f"http://127.0.0.1:{port}"), GATED, "--timeout", "60", "--deadline", "2"
        )
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
    assert code == 2
    assert out == ""
    assert took <= 2 + 1 + MARGIN, took  # the deadline, the backstop's second, start-up
    assert "Blocked by the Signoff approval hook" in err


# --- stopped by Claude Code while waiting: the request is withdrawn ---------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_stopped_hook_cancels_the_request_it_waited_on(
    server: Server, agent_key: str, runtime: Runtime, admin_headers: dict[str, str], sig: signal.Signals
) -> None:
    async with admin_client(server.url, admin_headers) as admin:
        proc = await start_hook(hook_env(server.url, agent_key), GATED, "--timeout", "60")
        (rid,) = await pending_ids(runtime, admin)
        await eventually(lambda: runtime.hub.waiting == 1)  # the hook is in its long-poll
        proc.send_signal(sig)
        code, out, err = await finish(proc, 15)
        request = (await admin.get(f"/v1/admin/requests/{rid}")).json()
    assert code == 2
    assert out == ""
    assert f"stopped by {sig.name}" in err
    assert request["status"] == "cancelled"


# --- an agent project whose own packages share the server's folder names ----------------------------


async def test_a_project_with_its_own_app_hooks_and_channels_packages(
    tmp_path: Path, server: Server, agent_key: str
) -> None:
    for name in ("app", "hooks", "channels", "migrations"):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(f"raise ImportError('the project own {name} package')\n")
        (package / "entry.py").write_text("raise SystemExit(0)\n")
    env = hook_env(server.url, agent_key, PYTHONPATH=str(tmp_path))
    code, out, err = await finish(await start_hook(env, UNGATED, cwd=tmp_path))
    assert code == 0, err
    assert json.loads(out) == {}

    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from signoff.hooks.client import GateClient\n"
        "print(GateClient(deadline=10).pre_tool_use('read_file', {'path': 'x'}).allowed)",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    printed, errors = await asyncio.wait_for(client.communicate(), 60)
    assert printed.decode().strip() == "True", errors.decode()


async def test_a_broken_dependency_blocks_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "httpx").mkdir()
    (tmp_path / "httpx" / "__init__.py").write_text("raise ImportError('httpx is broken')\n")
    env = hook_env("https://signoff.example.com", PYTHONPATH=str(tmp_path))
    code, out, err, _ = await run_hook(env, GATED)
    assert code == 2
    assert out == ""
    assert "httpx is broken" in err


async def test_a_signoff_of_the_projects_own_blocks_with_exit_2(tmp_path: Path) -> None:
    """The console script starts outside the ``signoff`` namespace, so a project's own
    ``signoff`` found first (here one that breaks on import) blocks the call with one line
    naming it and the fix, rather than dying with exit 1, which runs the tool."""
    (tmp_path / "signoff").mkdir()
    (tmp_path / "signoff" / "__init__.py").write_text("raise RuntimeError('not signoff-hooks')\n")
    env = hook_env("https://signoff.example.com", PYTHONPATH=".")
    code, out, err = await finish(await start_hook(env, GATED, cwd=tmp_path))
    assert (code, out) == (2, "")
    assert err == (
        f"Blocked by the Signoff approval hook: a package named 'signoff' at {tmp_path}/signoff shadows "
        f"signoff-hooks; rename it, or take {tmp_path} (the current directory) off the Python path "
        "(PYTHONPATH)\n"
    )


def test_an_import_failure_of_the_hook_itself_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from signoff.hooks._entry import run_claude_code

    monkeypatch.setitem(sys.modules, "signoff.hooks.adapters.claude_code", None)
    assert run_claude_code([]) == 2


def test_signoff_hook_without_a_runtime_exits_2() -> None:
    import subprocess

    done = subprocess.run([str(HOOK)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr == (
        "signoff-hook: name the runtime: signoff-hook claude-code [OPTIONS] "
        "(signoff-hook --help lists them)\n"
    )


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["claude-code", "--help"]])
def test_signoff_hook_help(args: list[str]) -> None:
    import subprocess

    from signoff.hooks.adapters.claude_code import HELP

    done = subprocess.run([str(HOOK), *args], capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, HELP, "")


async def test_the_server_command_runs_the_same_hook(server: Server, agent_key: str) -> None:
    signoff = Path(sys.executable).with_name("signoff")
    for key, expected in ((agent_key, 0), ("wrong", 2)):
        proc = await asyncio.create_subprocess_exec(
            str(signoff),
            "hook",
            "claude-code",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=hook_env(server.url, key),
        )
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(UNGATED).encode()), 60)
        assert proc.returncode == expected, err
        if expected == 0:
            assert json.loads(out) == {}


async def test_the_allow_path_over_plain_http_sends_the_key(server: Server, agent_key: str) -> None:
    code, out, err, _ = await run_hook(hook_env(server.url, agent_key), UNGATED)
    assert code == 0, err
    assert json.loads(out) == {}
    code, _, err, _ = await run_hook(hook_env(server.url, "wrong"), UNGATED)
    assert code == 2
    assert "401" in err


LIGHT = (
    "typing",
    "contextlib",
    "importlib",
    "argparse",
    "urllib.parse",
    "httpx",
    "asyncio",
    "random",
    "uuid",
)
"""What an allowed call over plain HTTP starts without: each costs the hook's every start."""


async def test_an_allowed_call_imports_only_what_it_needs(server: Server, agent_key: str) -> None:
    env = hook_env(server.url, agent_key, PYTHONPROFILEIMPORTTIME="1")
    code, out, err, _ = await run_hook(env, UNGATED)
    assert code == 0, err
    assert json.loads(out) == {}
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("| _signoff_hooks_entry"))
    imported = {line.rsplit("|", 1)[1].strip() for line in lines[start:] if line.startswith("import time:")}
    assert "signoff.hooks._gate" in imported  # the import log is read
    assert imported.isdisjoint(LIGHT), sorted(imported & set(LIGHT))
