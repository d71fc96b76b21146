"""A request pending across a reload: does an approver the reload removed, a level it raised or
a gate it took away still approve it? And does a reload widen who may?"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from signoff.app.config import SignoffConfig
from signoff.app.runtime import Runtime
from tests.redteam.support import CONFIG, actions, attack_config, decide, pending, send, status


@pytest.fixture
def config() -> SignoffConfig:
    return attack_config()


def _sends(cfg: dict[str, Any]) -> dict[str, Any]:
    return next(h for h in cfg["agents"]["finance-bot"]["hooks"] if h.get("name") == "sends")


async def _reload(runtime: Runtime, tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    changed = copy.deepcopy(CONFIG)
    change(changed)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert (await runtime.reload(tmp_path / "c.yaml")).ok


def _gate_change(**fields: Any) -> Callable[[dict[str, Any]], object]:
    return lambda cfg: _sends(cfg).update(fields)


def _without_sends(cfg: dict[str, Any]) -> None:
    hooks = cfg["agents"]["finance-bot"]["hooks"]
    hooks.remove(_sends(cfg))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        pytest.param(_gate_change(approvers=["carol"]), "not an approver", id="approver-removed"),
        pytest.param(_gate_change(min_assurance="oidc"), "oidc or stronger", id="level-raised"),
        pytest.param(_without_sends, "no longer configured", id="gate-removed"),
    ],
)
async def test_an_approval_the_reloaded_gate_would_not_take_is_refused(
    http: httpx.AsyncClient,
    agent_key: str,
    runtime: Runtime,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], object],
    why: str,
) -> None:
    rid = await pending(http, agent_key, send())
    await _reload(runtime, tmp_path, change)
    r = await decide(http, rid)
    assert r.status_code == 409, r.text
    assert why in r.text
    assert await status(runtime, rid) == "pending"
    assert "vote" not in await actions(runtime, rid)
    # Rejecting stays open to whoever was asked: it lets nothing through.
    r = await decide(http, rid, verdict="reject", reason="no longer mine to approve")
    assert r.status_code == 200, r.text
    assert await status(runtime, rid) == "rejected"


async def test_self_approval_a_reload_forbids_is_refused(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    def allowing(cfg: dict[str, Any]) -> None:
        _sends(cfg)["allow_self_approval"] = True

    await _reload(runtime, tmp_path, allowing)
    rid = await pending(http, agent_key, send(user_id="alice"))
    await _reload(runtime, tmp_path, lambda cfg: None)
    r = await decide(http, rid)
    assert r.status_code == 409, r.text
    assert "your own behalf" in r.text
    assert await status(runtime, rid) == "pending"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_gate_change(timeout="45m"), id="unrelated-field"),
        pytest.param(_gate_change(approvers=["carol", "alice"]), id="another-approver-added"),
        pytest.param(_gate_change(min_assurance="admin_token"), id="level-the-approver-has"),
    ],
)
async def test_an_approval_the_reloaded_gate_would_take_counts(
    http: httpx.AsyncClient,
    agent_key: str,
    runtime: Runtime,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], object],
) -> None:
    rid = await pending(http, agent_key, send())
    await _reload(runtime, tmp_path, change)
    r = await decide(http, rid)
    assert r.status_code == 200, r.text
    assert await status(runtime, rid) == "approved"


async def test_a_reload_never_widens_who_decides_a_pending_request(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    rid = await pending(http, agent_key, send())
    await _reload(runtime, tmp_path, _gate_change(approvers=["carol"]))
    r = await decide(http, rid, operator="carol")
    assert r.status_code == 409, r.text
    assert await status(runtime, rid) == "pending"
