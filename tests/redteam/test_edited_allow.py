"""An allow for a call approved with changes runs the call as approved, or not at all.

Signoff answers a call approved with changes ``allow`` with ``modified_arguments``: the call's
own arguments with the approver's values. An answer whose request record says the approver
changed a field, but whose ``modified_arguments`` are missing or hold another value for it, is
not an approval of anything that would run: neither the Claude Code hook nor the MCP proxy
runs the call as proposed on it (the hook blocks, exit 2; the proxy forwards nothing).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.hooks.test_claude_code_process import GATED, hook_env, start_hook
from tests.hooks.test_mcp_proxy import (  # noqa: F401  (fixtures)
    calls,
    forkserver,
    proxied,
    text,
)
from tests.redteam.support import scripted_signoff

PRE = "/v1/hooks/pre-tool-use"
CHANGES = [{"field": "amount", "proposed": 90_000, "approved": 40_000, "proposed_absent": False}]


def record(status: str = "approved", **extra: Any) -> dict[str, Any]:
    return {"id": "r1", "status": status, "decided_by": {"channel": "slack", "name": "Alice"}, **extra}


ANSWERS: dict[str, dict[str, list[dict[str, Any]]]] = {
    # A replay of the key answered allow: the record names the change, no arguments come with it.
    "allow-without-arguments": {
        PRE: [{"decision": "allow", "request_id": "r1", "request": record(changes=CHANGES)}]
    },
    # ... or arguments that are the proposed call.
    "allow-with-the-proposed-arguments": {
        PRE: [
            {
                "decision": "allow",
                "request_id": "r1",
                "request": record(changes=CHANGES),
                "modified_arguments": {"invoice_id": "inv-1", "amount": 90_000},
            }
        ]
    },
    # Pending, approved with changes on /wait, then the call sent again is allowed as proposed.
    "approved-on-wait-then-allowed-as-proposed": {
        PRE: [
            {"decision": "pending", "request_id": "r1", "request": record("pending")},
            {"decision": "allow", "request_id": "r1", "request": record(changes=CHANGES)},
        ],
        "/v1/requests/": [record(changes=CHANGES)],
    },
}


async def _serve(answers: dict[str, list[dict[str, Any]]]) -> AsyncIterator[str]:
    """An HTTP/1.1 server answering each path prefix with its answers in turn (the last repeats);
    reports of executed calls are taken."""
    scripts = {prefix: list(replies) for prefix, replies in answers.items()}
    scripts["/v1/hooks/post-tool-use"] = [{"decision": "allow", "modified": False, "result": None}]

    def answer(path: str) -> bytes:
        script = next(s for prefix, s in scripts.items() if path.startswith(prefix))
        return json.dumps(script.pop(0) if len(script) > 1 else script[0]).encode()

    async with scripted_signoff(answer) as url:
        yield url


@pytest.fixture(params=list(ANSWERS), ids=list(ANSWERS))
async def signoff(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async for url in _serve(ANSWERS[request.param]):
        yield url


async def test_the_hook_never_runs_the_proposed_call_on_such_an_allow(signoff: str) -> None:
    call = {**GATED, "tool_input": {"invoice_id": "inv-1", "amount": 90_000}}
    proc = await start_hook(hook_env(signoff), call, "--timeout", "20")
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    if proc.returncode == 0:
        decided = json.loads(out)["hookSpecificOutput"]
        assert (
            decided["permissionDecision"] != "allow"
            or decided.get("updatedInput", {}).get("amount") == 40_000
        ), (
            out,
            err,
        )
    else:
        assert proc.returncode == 2, (out, err)


async def test_the_proxy_never_forwards_the_proposed_call_on_such_an_allow(
    signoff: str,
    tmp_path: Path,
    calls: Callable[[], list[dict[str, Any]]],  # noqa: F811
    forkserver: None,  # noqa: F811
) -> None:
    async with proxied(tmp_path, signoff, "k", "--hold", "10") as client:
        result = await client.call_tool("pay_invoice", {"invoice_id": "inv-1", "amount": 90_000})
    assert [c["arguments"]["amount"] for c in calls() if c["tool"] == "pay_invoice"] in ([], [40_000]), text(
        result
    )
