"""A database of each test's own, at no revision yet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import PG_URL, _drop_pg_database, _ensure_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database on SQLite and on PostgreSQL (dropped after the test)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'signoff.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_m_{uuid.uuid4().hex[:12]}").render_as_string(hide_password=False)
    _ensure_pg_database(url)
    yield url
    _drop_pg_database(url)
