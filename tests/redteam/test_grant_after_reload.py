"""A grant given on a gate, and a reload that changes that gate (its approvers, or the grant it
offers): does the grant still let calls through that the reloaded gate would not grant?"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import CONFIG, ask, attack_config, decide, pending, send


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


def _sends(cfg: dict[str, Any]) -> dict[str, Any]:
    return next(h for h in cfg["agents"]["finance-bot"]["hooks"] if h.get("name") == "sends")


async def _grant(http: httpx.AsyncClient, key: str) -> None:
    rid = await pending(http, key, send())
    r = await decide(http, rid, grant={"scope": "session", "for": "1h", "same": ["to"]})
    assert r.status_code == 200, r.text
    assert (await ask(http, key, send()))["decision"] == "allow"


@pytest.mark.xfail(strict=True, reason="a grant's grantors are not checked against the reloaded approvers")
async def test_grant_from_an_approver_the_reload_removed(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    await _grant(http, agent_key)
    changed = copy.deepcopy(CONFIG)
    _sends(changed)["approvers"] = ["carol"]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert (await runtime.reload(tmp_path / "c.yaml")).ok
    answer = await ask(http, agent_key, send())
    assert answer["decision"] != "allow", answer


async def test_grant_whose_offer_the_reload_narrowed(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    await _grant(http, agent_key)
    changed = copy.deepcopy(CONFIG)
    _sends(changed)["grants"] = [{"scope": "session", "for": "1h", "same": ["to", "memo"]}]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert (await runtime.reload(tmp_path / "c.yaml")).ok
    answer = await ask(http, agent_key, send(memo="other"))
    assert answer["decision"] != "allow", answer
