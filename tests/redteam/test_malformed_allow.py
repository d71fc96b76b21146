"""The Claude Code hook trusts only a well-formed approval.

An answer that says ``approved`` without naming the request it is about (a ``/wait`` record
with no ``id``), or an ``allow`` carrying a request record without a status, is not an
approval: the hook blocks the call (exit 2) as it does for every other malformed answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.hooks.test_claude_code_process import GATED, hook_env, start_hook
from tests.redteam.support import scripted_signoff


async def _serve(answers: dict[str, Any]) -> AsyncIterator[str]:
    """A stand-in for Signoff answering each path prefix with a fixed JSON body."""

    def answer(path: str) -> bytes:
        return next(json.dumps(b) for prefix, b in answers.items() if path.startswith(prefix)).encode()

    async with scripted_signoff(answer) as url:
        yield url


@pytest.fixture(
    params=[
        # /wait says "approved" without saying which request it is.
        {
            "/v1/hooks/pre-tool-use": {"decision": "pending", "request_id": "r1"},
            "/v1/requests/": {"status": "approved"},
        },
        # An allow whose own request record has no status.
        {"/v1/hooks/pre-tool-use": {"decision": "allow", "request_id": "r1", "request": {"id": "r1"}}},
    ],
    ids=["wait-without-id", "allow-record-without-status"],
)
async def malformed(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async for url in _serve(request.param):
        yield url


async def test_a_malformed_approval_blocks_the_call(malformed: str) -> None:
    proc = await start_hook(hook_env(malformed), GATED, "--timeout", "20")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, (out, err)
    assert b'"allow"' not in out
