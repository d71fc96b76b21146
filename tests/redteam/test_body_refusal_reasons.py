"""A body the server cannot read is refused with 422 saying why: a byte order mark, UTF-16 or
nesting past the parser's limit is not called "NaN and Infinity" (which it does not hold), on
every JSON endpoint of the agent and operator APIs."""

from __future__ import annotations

import httpx
import pytest

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import ADMIN, POST, PRE, agent, attack_config, request_count

CALL = '{"tool_name":"send_payment","arguments":{"to":"acme","amount":90000}}'
BODIES = {
    "byte order mark": b"\xef\xbb\xbf" + CALL.encode(),
    "utf-16": CALL.encode("utf-16"),
    "nested past the limit": b'{"tool_name":"send_payment","arguments":{"a":'
    + b"[" * 300
    + b"]" * 300
    + b"}}",
}


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


@pytest.mark.parametrize("kind", list(BODIES))
async def test_an_unreadable_body_is_refused_for_what_it_is(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, kind: str
) -> None:
    json_type = {"content-type": "application/json"}
    for method, path, headers in [
        ("POST", PRE, agent(agent_key)),
        ("POST", POST, agent(agent_key)),
        ("POST", "/v1/hooks/session-start", agent(agent_key)),
        ("POST", "/v1/admin/requests/r1/decision", ADMIN),
        ("PUT", "/v1/admin/switches/read_only", ADMIN),
    ]:
        r = await http.request(method, path, content=BODIES[kind], headers={**headers, **json_type})
        assert r.status_code == 422, (path, r.status_code, r.text[:200])
        assert "NaN" not in r.json()["detail"], (path, kind, r.json()["detail"])
    assert await request_count(runtime) == 0
