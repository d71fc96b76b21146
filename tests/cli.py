"""The ``signoff`` command in this process: the console script's own entry point under click's
test runner, with the environment a process would get (its stdout, stderr and exit code)."""

from __future__ import annotations

import os
import subprocess
import sys
from unittest.mock import patch

import _signoff_hooks_entry
from typer.testing import CliRunner


def signoff(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``signoff ARGS`` as the installed executable would run it with ``env`` as its whole
    environment (this process's, less SIGNOFF_*, when ``env`` is None)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    isolated: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    isolated.update(env)
    with CliRunner().isolation(env=isolated) as (out, err, _), patch.object(sys, "argv", ["signoff", *args]):
        try:
            _signoff_hooks_entry.server()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    return subprocess.CompletedProcess(["signoff", *args], code, stdout, stderr)
