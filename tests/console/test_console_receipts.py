"""The console shows a decided request's signed receipt, and the history's JSON Lines export
carries it: each verifies offline with the published keys."""

from __future__ import annotations

import html
import json

from signoff.hooks.receipts import verify_receipt
from tests.console.conftest import Agent, Console


async def test_the_request_page_and_the_export_carry_the_signed_receipt(alice: Console, agent: Agent) -> None:
    rid = await agent.ask(arguments={"amount": 90000, "memo": "invoice 7"})
    pending = await alice.get(f"/ui/requests/{rid}")
    assert "Signed receipt" not in pending.text
    await alice.decide(rid, "approve", "checked")
    keys = (await alice.get("/v1/receipts/keys")).json()

    page = await alice.get(f"/ui/requests/{rid}")
    assert page.status_code == 200
    assert "Signed receipt" in page.text
    assert "signoff-verify receipt.json --keys keys.json" in page.text

    lines = [json.loads(line) for line in (await alice.get("/ui/history/export.jsonl")).text.splitlines()]
    (mine,) = [line for line in lines if line["id"] == rid]
    payload = verify_receipt(mine["receipt"], keys)
    assert (payload["request_id"], payload["verdict"]) == (rid, "approved")
    assert mine["receipt"]["key_id"] in page.text
    assert html.escape(payload["action_digest"]) in page.text
