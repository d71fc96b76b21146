"""What an operator meets starting Signoff, as the processes they run: ``make run`` and
``signoff serve``."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

from tests.app.serving import SIGNOFF, environment, serve

ROOT = Path(__file__).resolve().parents[2]


def _make_run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``make run`` from a copy of the Makefile, with ``signoff`` replaced by a script that
    prints what it was started with (the install step is taken as done)."""
    (tmp_path / "hooks").mkdir(exist_ok=True)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "hooks" / "pyproject.toml", tmp_path / "hooks" / "pyproject.toml")
    (tmp_path / "stamp").touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    fake = bin_dir / "signoff"
    fake.write_text('#!/bin/sh\necho "serve: port=$SIGNOFF_PORT config=$SIGNOFF_CONFIG"\n', encoding="utf-8")
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNOFF_", "MAKE"))}
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "run",
            f"BIN={bin_dir}",
            f"STAMP={tmp_path / 'stamp'}",
            f"RUN_STAMP={tmp_path / 'stamp'}",
        ],
        cwd=tmp_path,
        env={**clean, "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_make_run_keeps_the_admin_token_to_its_owner(tmp_path: Path) -> None:
    done = _make_run(tmp_path)
    assert done.returncode == 0, done.stderr
    token = tmp_path / ".signoff-admin-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text().strip()) >= 24
    # a token made world-readable by an earlier version is closed up
    token.chmod(0o644)
    again = _make_run(tmp_path)
    assert again.returncode == 0, again.stderr
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def test_the_make_run_banner_names_the_port_and_file_in_use(tmp_path: Path) -> None:
    default = _make_run(tmp_path).stdout.splitlines()
    assert default[0] == (
        "==> Signoff on http://127.0.0.1:8000 (SQLite: ./signoff.db, config: examples/signoff.yaml)"
    )
    moved = _make_run(
        tmp_path,
        SIGNOFF_PORT="9123",
        SIGNOFF_CONFIG="mine.yaml",
        SIGNOFF_DATABASE_URL="postgresql://u:secret@db/signoff",
    ).stdout.splitlines()
    assert moved[0] == (
        "==> Signoff on http://127.0.0.1:9123 (database: $SIGNOFF_DATABASE_URL, config: mine.yaml)"
    )
    assert moved[-1] == "serve: port=9123 config=mine.yaml"


def test_a_port_in_use_is_one_line_naming_signoff_port(tmp_path: Path) -> None:
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(SIGNOFF), "serve"],
            env={**env, "SIGNOFF_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 2
    assert done.stderr == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        f"stop what listens there or choose another port (SIGNOFF_PORT={port + 1})\n"
    )
    assert not (tmp_path / "signoff.db").exists(), "nothing started before the port was known free"


def test_serve_without_a_configuration_warns_that_every_agent_is_denied(tmp_path: Path) -> None:
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}")
    del env["SIGNOFF_CONFIG"]
    log = tmp_path / "serve.log"
    with serve(env, log) as served:
        assert served.output().splitlines()[0] == (
            "warning: SIGNOFF_CONFIG is not set, so no agent is configured and EVERY agent's call "
            "will be denied; set SIGNOFF_CONFIG=/path/to/signoff.yaml (examples/signoff.yaml to try)"
        )
    assert "warning: SIGNOFF_CONFIG" not in _first_line_with_config(tmp_path)


def _first_line_with_config(tmp_path: Path) -> str:
    """The first line a server with a configuration writes."""
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}")
    log = tmp_path / "configured.log"
    with serve(env, log) as served:
        return served.output().splitlines()[0]
