"""Schemathesis against the OpenAPI schema of a running server: no 5xx, answers as documented.

A real ``signoff serve`` process (SQLite, then PostgreSQL) with gates, a rate
limit and a read-only guard; every agent, operator and ops operation in its
schema gets generated calls, valid and invalid (``GenerationMode.all``), with
the right credentials (agent key or admin token). Path ids are drawn partly
from real requests, so decisions, cancels and reads also hit existing rows.
Checks: not a server error, the response matches the documented schema, the
content type is the documented one. The number of examples is bounded so both
databases take well under a minute. Callbacks are fuzzed in ``test_callbacks.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from bench._server import Signoff, signoff_database

EXAMPLES = int(os.environ.get("SIGNOFF_FUZZ_EXAMPLES", "30"))
"""Examples per operation and database; CI's run is deterministic (``derandomize``); set
SIGNOFF_FUZZ_EXAMPLES (e.g. 500) and SIGNOFF_FUZZ_RANDOM=1 for a longer, random exploration."""
RANDOM = os.environ.get("SIGNOFF_FUZZ_RANDOM") == "1"

pytestmark = pytest.mark.postgres

CONFIG = """
people:
  alice: {name: Alice, web: alice}
  bob: {name: Bob, web: bob}
agents:
  bench-agent:
    redact: [secret]
    hooks:
      - type: readonly_guard
        tools: ["drop_*"]
      - type: rate_limit
        tools: ["send_*"]
        limit: 1000
      - type: confirmation_gate
        name: payments
        tools: ["pay_*"]
        when: "has(args.amount) && args.amount >= 50000"
        channel: web
        approvers: [alice, bob]
        timeout: 30m
      - type: confirmation_gate
        name: two-person
        tools: ["*"]
        channel: web
        approvers: [alice, bob]
        quorum: 2
        require_reject_reason: true
        timeout: 30m
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest) -> Iterator[tuple[Signoff, list[str]]]:
    """A running server and the ids of some of its requests (pending and decided)."""
    db: str = request.param
    with signoff_database(db, config=CONFIG, name="signoff_fuzz_pg") as s:
        s.start()
        ids: list[str] = []
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for n in range(6):
                r = c.post(
                    "/v1/hooks/pre-tool-use",
                    json={"tool_name": f"pay_seed_{n}", "arguments": {"amount": 10**6}},
                    headers=s.agent_headers,
                )
                ids.append(r.json()["request_id"])
            c.post(
                f"/v1/admin/requests/{ids[0]}/decision",
                json={"verdict": "approve", "operator": "alice"},
                headers=s.admin_headers,
            ).raise_for_status()
        yield s, ids


def operations(schema: Any) -> list[Any]:
    ops = [result.ok() for result in schema.get_all_operations()]
    return [op for op in ops if not op.path.startswith("/callbacks/")]


def fuzz(op: Any, url: str, headers: dict[str, str], ids: list[str]) -> tuple[int, list[str]]:
    """Run one operation's examples; return how many ran and the failures."""
    failures: list[str] = []
    tried = 0
    strategy = op.as_strategy(generation_mode=GenerationMode.POSITIVE) | op.as_strategy(
        generation_mode=GenerationMode.NEGATIVE
    )

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not RANDOM,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, known=st.sampled_from([None, *ids]))
    def run(case: Any, known: str | None) -> None:
        nonlocal tried
        params = case.path_parameters
        if known is not None and isinstance(params, dict) and "request_id" in params:
            params["request_id"] = known
        if case.path.endswith("/wait") and isinstance(case.query, dict):
            case.query["timeout"] = 0.05  # a pending request would hold the call for the whole timeout
        tried += 1
        response = case.call(base_url=url, headers=headers, timeout=30)
        try:
            case.validate_response(
                response, checks=[not_a_server_error, response_schema_conformance, content_type_conformance]
            )
        except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
            failures.append(f"{op.method.upper()} {op.path} -> {response.status_code}: {exc}"[:2000])

    run()
    return tried, failures


def test_no_server_errors_and_answers_as_documented(live: tuple[Signoff, list[str]]) -> None:
    server, ids = live
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    failures: list[str] = []
    tried = 0
    ops = operations(schema)
    for op in ops:
        headers = server.admin_headers if op.path.startswith("/v1/admin/") else server.agent_headers
        n, failed = fuzz(op, server.url, headers, ids)
        tried += n
        failures += failed
    assert tried > 10 * len(ops)
    assert not failures, "\n\n".join(failures[:10])


def test_the_schema_documents_every_agent_and_operator_operation(live: tuple[Signoff, list[str]]) -> None:
    server, _ = live
    paths = json.loads(httpx.get(f"{server.url}/openapi.json").text)["paths"]
    for path in (
        "/v1/hooks/pre-tool-use",
        "/v1/requests/{request_id}/wait",
        "/v1/admin/requests/{request_id}/decision",
    ):
        assert path in paths
