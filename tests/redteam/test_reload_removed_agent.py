"""An agent taken out of the configuration by a reload (``POST /v1/admin/config/reload``,
``signoff config reload``, SIGHUP) and put back: its key lives on, so what it reported while
it was out still counts. An approved call that ran and was reported in that window is used:
once the agent is back, a replay of its key is denied (one call, once), and the execution is
on record."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest
import yaml

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import CONFIG, POST, actions, agent, ask, attack_config, decide, pending, send


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


async def test_a_call_reported_while_its_agent_was_out_of_the_configuration_stays_used(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    call = send()
    rid = await pending(http, agent_key, call)
    assert (await decide(http, rid)).status_code == 200
    assert (await ask(http, agent_key, call))["decision"] == "allow"

    without = copy.deepcopy(CONFIG)
    del without["agents"]["finance-bot"]
    (tmp_path / "without.yaml").write_text(yaml.safe_dump(without), encoding="utf-8")
    (tmp_path / "with.yaml").write_text(yaml.safe_dump(CONFIG), encoding="utf-8")

    assert (await runtime.reload(tmp_path / "without.yaml")).ok
    # The approved call runs now, and the agent reports it.
    report = await http.post(POST, json={**call, "result": "paid"}, headers=agent(agent_key))
    assert report.status_code == 200, report.text
    assert (await runtime.reload(tmp_path / "with.yaml")).ok

    replay = await ask(http, agent_key, call)
    assert replay["decision"] == "deny", f"the payment that ran runs again: {replay}"
    assert "executed" in await actions(runtime, rid)
