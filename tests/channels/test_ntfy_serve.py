"""An ntfy gate end to end through a real ``signoff serve`` process: the notification goes out
to the fake ntfy server, the phone's tap (the http action exactly as published, to the
server's own public URL) comes back, the waiting agent is released, and the audit names the
ntfy identity."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from bench._server import signoff_database
from tests.channels.fake_ntfy import FakeNtfy, Published

TOKEN = "tk_serve0123456789abcdefghijklmn"
ALICE = "alice-Pq7Zr2Kx9Lm4"

CONFIG = f"""
channels:
  phone:
    type: ntfy
    server: "{{server}}"
    token: "{TOKEN}"
people:
  alice: {{{{name: Alice, ntfy: {ALICE}}}}}
agents:
  bench-agent:
    hooks:
      - type: confirmation_gate
        name: payments
        tools: ["pay_*"]
        channel: phone
        approvers: [alice]
        timeout: 30m
"""


@pytest.fixture
async def ntfy() -> AsyncIterator[FakeNtfy]:
    fake = FakeNtfy(tokens={TOKEN: {ALICE}})
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


async def test_an_ntfy_gate_through_signoff_serve(ntfy: FakeNtfy) -> None:
    config = CONFIG.replace("{server}", ntfy.url).replace("{{", "{").replace("}}", "}")
    env = {"SIGNOFF_SESSION_SECRET": "a-long-random-secret-for-signoff-serve"}
    with signoff_database("sqlite", config=config, name="signoff_ntfy_serve", extra_env=env) as s:
        s.env["SIGNOFF_PUBLIC_URL"] = s.url
        await asyncio.to_thread(s.start, migrate=True)
        async with httpx.AsyncClient(base_url=s.url, timeout=30) as http:
            asked = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "pay_invoice", "arguments": {"amount": 1200, "to": "acme"}},
                headers=s.agent_headers,
            )
            assert asked.json()["decision"] == "pending", asked.text
            rid = asked.json()["request_id"]
            published: Published | None = None
            for _ in range(200):
                found = [p for p in ntfy.to(ALICE) if rid in p.message["message"]]
                if found:
                    published = found[0]
                    break
                await asyncio.sleep(0.05)
            assert published is not None, "no notification published"
            waiting = asyncio.create_task(
                http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=s.agent_headers)
            )
            # The phone app: the http action's method, URL, headers and body, as published.
            action = published.action("Approve")
            async with httpx.AsyncClient(timeout=30) as phone:
                tapped = await phone.request(
                    action["method"],
                    action["url"],
                    headers=action["headers"],
                    content=action["body"].encode(),
                )
                assert tapped.status_code == 200, tapped.text
                assert tapped.json()["answer"] == "recorded"
                again = await phone.request(
                    action["method"],
                    action["url"],
                    headers=action["headers"],
                    content=action["body"].encode(),
                )
                assert (again.status_code, again.json()["answer"]) == (200, "repeated")
            done = (await waiting).json()
            assert done["status"] == "approved"
            # Her topic is her secret: the agent's answer names her by her directory key.
            assert done["decided_by"] == {"channel": "phone", "user_id": "alice", "name": "Alice"}
            assert ALICE not in str(done)
            view = (await http.get(f"/v1/admin/requests/{rid}", headers=s.admin_headers)).json()
            [vote] = [e for e in view["audit"] if e["action"] == "vote"]
            assert vote["actor_channel"] == "phone"
            assert vote["detail"]["identity"] == {"via": "ntfy_link", "link": "approve"}
            assert [v["assurance"] for v in view["votes"]] == ["ntfy_link"]
            assert json.dumps(view).count("vote_refused") == 1  # the repeat, audited
