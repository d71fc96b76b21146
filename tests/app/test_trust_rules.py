"""The trust rules over real HTTP, on SQLite and PostgreSQL: tool-name spellings, bodies
that cannot be stored or read two ways, redaction by key and by value."""

from __future__ import annotations

import httpx

from signoff.app.runtime import Runtime
from tests.conftest import ADMIN_TOKEN

PRE = "/v1/hooks/pre-tool-use"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- tool names that dodge a glob -------------------------------------------------------------

DODGES = [
    "Pay_invoice",
    "PAY_INVOICE",
    " pay_invoice",
    "\u0440ay_invoice",  # Cyrillic er
    "\uff50\uff41\uff59\uff3f\uff49\uff4e\uff56\uff4f\uff49\uff43\uff45",  # full width
    "pay\u200b_invoice",  # zero-width space
]


async def test_no_spelling_of_a_gated_tool_slips_past_its_gate(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime
) -> None:
    for name in DODGES:
        r = await http.post(
            PRE, json={"tool_name": name, "arguments": {"amount": 90000}}, headers=auth(agent_key)
        )
        assert r.status_code == 200, r.text
        assert r.json()["decision"] == "pending", (name, r.json())
        assert r.json()["request"]["gate"] == "payments"
        stored = await http.get(f"/v1/requests/{r.json()['request_id']}", headers=auth(agent_key))
        assert stored.json()["tool_name"] == name, "the request keeps the name as sent"
    small = await http.post(
        PRE, json={"tool_name": "PAY_INVOICE", "arguments": {"amount": 5}}, headers=auth(agent_key)
    )
    assert small.json()["decision"] == "allow", "the gate's condition still applies"
    other = await http.post(PRE, json={"tool_name": "read_file", "arguments": {}}, headers=auth(agent_key))
    assert other.json()["decision"] == "allow"
