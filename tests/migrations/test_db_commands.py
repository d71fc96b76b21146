"""``signoff db upgrade`` and ``signoff db downgrade`` as processes: each reports the
revision it actually left the database at, and each refusal is one line that leaves the
database as it was."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from signoff.app.db import head_revision
from tests.migrations import released

SIGNOFF = Path(sys.executable).with_name("signoff")


def _signoff(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    env["SIGNOFF_DATABASE_URL"] = f"sqlite:///{db}"
    return subprocess.run(
        [str(SIGNOFF), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (found,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    conn.close()
    return str(found)


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_the_first_release_database_upgrades_and_says_where_it_is(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    released.make_database(f"sqlite:///{db}", "0001@3502eac", tmp_path)
    released.write_rows(f"sqlite:///{db}")
    done = _signoff(db, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"is at head ({head_revision()})")
    with sqlite3.connect(db) as conn:
        digests = conn.execute("SELECT call_digest FROM confirmation_request").fetchall()
    conn.close()
    assert len(digests) == 2
    assert all(len(d) == 64 for (d,) in digests)


def test_upgrade_to_an_older_revision_is_refused_and_points_at_downgrade(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    assert _signoff(db, "db", "upgrade").returncode == 0
    line = _refused(_signoff(db, "db", "upgrade", "0001"))
    assert f"is at {head_revision()}, past 0001" in line
    assert "`signoff db downgrade 0001`" in line
    assert _revision(db) == head_revision()
    assert "there is no revision '0099'" in _refused(_signoff(db, "db", "upgrade", "0099"))


def test_downgrade_reports_where_it_left_the_database_and_refuses_to_lose_data(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    released.make_database(f"sqlite:///{db}", "0005", tmp_path)
    released.write_rows(f"sqlite:///{db}")
    assert _signoff(db, "db", "upgrade").returncode == 0

    done = _signoff(db, "db", "downgrade", "0004")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("is at 0004")
    assert _revision(db) == "0004"

    line = _refused(_signoff(db, "db", "downgrade", "base"))
    assert "refused to downgrade to base" in line
    assert "confirmation_request (2 rows, revision 0001)" in line
    assert "nothing was changed" in line
    assert _revision(db) == "0004"


def test_a_database_from_a_newer_release_is_named_not_touched(tmp_path: Path) -> None:
    db = tmp_path / "signoff.db"
    assert _signoff(db, "db", "upgrade").returncode == 0
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.close()
    line = _refused(_signoff(db, "db", "upgrade"))
    assert "is at revision 9999, which this release does not know" in line
    assert _revision(db) == "9999"
