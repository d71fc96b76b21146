"""One SQLite file, one server: a second ``signoff serve`` on the same file refuses to start
with one line naming the first; once the first is gone (even by ``kill -9``) the file is free."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.app.serving import SIGNOFF, environment, serve
from tests.conftest import free_port


def _second(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SIGNOFF), "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_second_server_on_one_sqlite_file_refuses_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    env = environment(tmp_path, f"sqlite:///{db}")
    with serve(env, tmp_path / "first.log") as first:
        refused = _second(env)
        assert refused.returncode == 1, refused.stderr
        assert refused.stdout == ""
        assert refused.stderr.strip().splitlines() == [
            f"error: another `signoff serve` (pid {first.process.pid}) is serving the SQLite database "
            f"{db}: one SQLite file takes one server; stop that one first, or run several servers on "
            "PostgreSQL (SIGNOFF_DATABASE_URL=postgresql://…)"
        ]
        # The first one serves on, undisturbed.
        assert first.process.poll() is None
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(60)
    # Killed, it holds nothing: the next server starts on the same file.
    with serve(env, tmp_path / "next.log") as served:
        assert (tmp_path / "signoff.db.lock").read_text().strip() == str(served.process.pid)


def test_servers_on_different_files_both_start(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env_a = environment(tmp_path, f"sqlite:///{tmp_path / 'a' / 'signoff.db'}")
    env_b = environment(tmp_path, f"sqlite:///{tmp_path / 'b' / 'signoff.db'}")
    with serve(env_a, tmp_path / "a.log") as a, serve(env_b, tmp_path / "b.log") as b:
        assert a.process.poll() is None
        assert b.process.poll() is None
