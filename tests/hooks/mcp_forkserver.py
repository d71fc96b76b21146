"""The test upstream and the proxy started without paying for their imports.

The MCP SDK takes about a second to import, and the proxy tests start a proxy and an upstream
for nearly every test. One process per test worker imports both once and forks a copy for each
start; what the client (or the proxy) runs is a launcher of the standard library alone:

    python -m tests.hooks.mcp_forkserver SOCKET upstream [UPSTREAM ARGUMENTS...]
    python -m tests.hooks.mcp_forkserver SOCKET proxy [signoff-mcp-proxy ARGUMENTS...]

The launcher hands the server its stdin, stdout and stderr, its arguments, environment and
working directory; the copy runs the program's ``main()`` on them (``tests.hooks.mcp_upstream``,
``signoff.hooks.mcp_proxy``), so the client talks to it as to the process it started. The
launcher exits with the copy's exit code; a signal sent to the launcher is passed on to the
copy, and a copy whose launcher dies (killed) exits too.

Under coverage the launcher runs the proxy itself instead (:data:`MEASURED`). Tests about a
process as a process (its pid, a client killed, SIGTERM, start-up errors, the HTTP transport)
start the real command; the server runs as ``python -m tests.hooks.mcp_forkserver --serve SOCKET``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

PROGRAMS = {"upstream": "tests.hooks.mcp_upstream", "proxy": "signoff.hooks.mcp_proxy._cli"}
"""What a launcher may start: the module whose ``main()`` the copy runs."""
PRELOADED = [*PROGRAMS.values(), "signoff.hooks.mcp_proxy._proxy", "signoff.hooks.mcp_proxy._stdio"]
"""Imported by the server before it forks (the proxy imports the SDK as it starts)."""


MEASURED = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")
"""Set when coverage measures the processes a test starts: the launcher then runs the proxy
itself (``python -m``), since what coverage records in a forked copy is not reliably saved (the
upstream is the tests' own code, which coverage does not measure: it is still forked)."""


def launch(path: str, program: str, args: list[str]) -> int:
    """Start a copy of ``program`` with this process's stdio; its exit code."""
    if program == "proxy" and any(os.environ.get(name) for name in MEASURED):
        os.execv(sys.executable, [sys.executable, "-m", "signoff.hooks.mcp_proxy", *args])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [b"\0"], [0, 1, 2])
    request = {"program": program, "args": args, "env": dict(os.environ), "cwd": os.getcwd()}
    conn.sendall(json.dumps(request).encode() + b"\n")
    answers = conn.makefile("rb")
    pid = int(answers.readline())

    def pass_on(received: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, received)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)
    code = answers.readline()
    return int(code) if code.strip() else 1  # killed: no code was sent


def serve(path: str) -> None:
    """Fork a copy of a program for each launcher that connects, until killed."""
    import importlib
    import logging
    import threading
    import traceback

    for module in PRELOADED:
        importlib.import_module(module)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # exited copies are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped: exit as a process does
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        request = json.loads(conn.makefile("rb").readline())
        if os.fork() != 0:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        conn.sendall(f"{os.getpid()}\n".encode())
        threading.Thread(target=_exit_with_launcher, args=(conn,), daemon=True).start()
        code = 1
        try:
            if request["program"] != "upstream":
                # The upstream's import set up the root logger; a new process has none.
                logging.root.handlers.clear()
                logging.root.setLevel(logging.WARNING)
            module = PROGRAMS[request["program"]]
            sys.argv = [module, *request["args"]]
            importlib.import_module(module).main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            with contextlib.suppress(OSError):
                conn.sendall(f"{code}\n".encode())
            os._exit(code)


def _exit_with_launcher(conn: socket.socket) -> None:
    """A copy's launcher never writes again: its end closing means it is gone (killed), and the
    copy is stopped (SIGTERM: the proxy stops cleanly on it), or ended if it does not stop."""
    import time

    conn.recv(1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    os._exit(1)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(launch(sys.argv[1], sys.argv[2], sys.argv[3:]))
