"""A Teams gate through ``signoff serve`` as an operator runs it, against the fake Bot Framework:
``config check`` knows the type, the card goes out, a verified click comes in, the waiting
agent is released, the card is redrawn, the audit names the Teams identity and the console
lists the Teams delivery like any other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.app.serving import environment, serve, signoff
from tests.channels.teams_fake import PASSWORD, FakeBotFramework
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG
from tests.console.conftest import CHEAP, PASSWORDS, SESSION_SECRET, Console
from tests.waiting import eventually

ALICE = "0a11ce00-0000-4000-8000-000000000001"


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotFramework]:
    fake = FakeBotFramework()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.close()


def write_config(path: Path, fake: FakeBotFramework, **teams: Any) -> None:
    raw: dict[str, Any] = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["channels"]["ops-teams"] = fake.config(app_password="${TEAMS_APP_PASSWORD}", **teams)
    raw["people"]["alice"]["teams"] = ALICE
    raw["people"]["bob"]["teams"] = "0b0b0000-0000-4000-8000-000000000002"
    raw["people"]["carol"]["teams"] = "0ca10100-0000-4000-8000-000000000003"
    for hook in raw["agents"]["finance-bot"]["hooks"]:
        hook["channel"] = "ops-teams"
    raw["operators"] = {"alice": {"password_hash": CHEAP.hash(PASSWORDS["alice"]), "person": "alice"}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")


async def test_config_check_knows_teams(fake: FakeBotFramework, tmp_path: Path) -> None:
    write_config(tmp_path / "signoff.yaml", fake)
    env = environment(tmp_path, f"sqlite:///{tmp_path / 's.db'}", TEAMS_APP_PASSWORD=PASSWORD)
    done = await asyncio.to_thread(signoff, env, "config", "check", str(tmp_path / "signoff.yaml"))
    assert done.returncode == 0, done.stderr
    assert "ok (3 channels" in done.stdout
    bad = tmp_path / "bad.yaml"
    write_config(bad, fake, tenant_id="contoso.onmicrosoft.com")
    done = await asyncio.to_thread(signoff, env, "config", "check", str(bad))
    assert done.returncode != 0
    assert f"{bad}: channels.ops-teams.tenant_id: must be a GUID" in done.stderr
    missing = {k: v for k, v in env.items() if k != "TEAMS_APP_PASSWORD"}
    done = await asyncio.to_thread(signoff, missing, "config", "check", str(tmp_path / "signoff.yaml"))
    assert "environment variable TEAMS_APP_PASSWORD is not set" in done.stderr


async def test_a_teams_gate_end_to_end_through_signoff_serve(fake: FakeBotFramework, tmp_path: Path) -> None:
    write_config(tmp_path / "signoff.yaml", fake)
    env = environment(
        tmp_path,
        f"sqlite:///{tmp_path / 's.db'}",
        TEAMS_APP_PASSWORD=PASSWORD,
        SIGNOFF_SESSION_SECRET=SESSION_SECRET,
        SIGNOFF_PUBLIC_URL="https://signoff.example.com",
    )
    assert (await asyncio.to_thread(signoff, env, "db", "upgrade")).returncode == 0
    created = await asyncio.to_thread(signoff, env, "keys", "create", "finance-bot")
    key = created.stdout.strip().splitlines()[-1]
    agent = {"Authorization": f"Bearer {key}"}
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with serve(env, tmp_path / "serve.log") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
            asked = await http.post(
                "/v1/hooks/pre-tool-use",
                json={"tool_name": "pay_invoice", "arguments": {"amount": 90000, "to": "ACME"}},
                headers=agent,
            )
            rid = asked.json()["request_id"]
            await eventually(lambda: fake.messages or None, timeout=30)
            [(_, card_id)] = list(fake.messages)
            card = fake.card(card_id)
            assert any(a.get("url", "").endswith(f"/ui/requests/{rid}") for a in card["actions"])

            waiter = asyncio.create_task(
                http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent)
            )
            body, headers = fake.invoke(
                fake.activity(rid, "approve", aad=ALICE, name="Alice Liu", reply_to=card_id)
            )
            answer = await http.post("/callbacks/teams/ops-teams", content=body, headers=headers)
            assert answer.status_code == 200
            assert answer.json()["type"] == "application/vnd.microsoft.card.adaptive"
            done = (await asyncio.wait_for(waiter, 30)).json()
            assert done["status"] == "approved"
            assert done["decided_by"] == {"channel": "ops-teams", "user_id": ALICE, "name": "Alice"}

            await eventually(lambda: fake.calls_to("PUT", card_id) or None, timeout=30)
            assert "Approved once by Alice" in json.dumps(fake.card(card_id))

            shown = (await http.get("/v1/admin/config", headers=admin)).text
            assert "ops-teams" in shown
            assert PASSWORD not in shown  # the client secret is masked
            events = (await http.get("/v1/admin/audit", params={"request_id": rid}, headers=admin)).json()
            [voted] = [e for e in events if e["action"] == "vote"]
            assert (voted["actor_channel"], voted["actor_id"], voted["actor_name"]) == (
                "ops-teams",
                ALICE,
                "Alice",
            )

        console = Console(served.url)
        try:
            assert (await console.sign_in("alice")).status_code == 303
            page = (await console.get(f"/ui/requests/{rid}")).text
        finally:
            await console.aclose()
        for expected in ("Cards sent", "ops-teams", "activity_id", card_id, "delivery-sent"):
            assert expected in page, expected
