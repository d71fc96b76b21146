"""A short chaos run on each database: kill -9 three times and take the chat API down, lose nothing.

The full run is ``python -m bench.chaos`` (300 requests, 10 kills, both databases);
see ``bench/chaos.py`` for what is checked.
"""

from __future__ import annotations

import pytest

from bench.chaos import run

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
async def test_kill_9_and_a_chat_outage_lose_nothing(db: str) -> None:
    report = await run(db, requests=40, kills=3, verbose=False)
    assert report.ok, "\n".join([report.summary(), *report.problems[:30]])
    assert len(report.kills) == 3
    assert report.posts >= 40
