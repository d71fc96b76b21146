"""A grant given on a gate, and a reload that changes that gate (its approvers, its quorum, the
level it needs, or the grant it offers): does the grant still let calls through that the
reloaded gate would not grant? And does it hold across a reload the gate would still grant by?"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from signoff.app.config import SignoffConfig
from signoff.app.db import transaction
from signoff.app.models import Grant
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


async def _reload(runtime: Runtime, tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    changed = copy.deepcopy(CONFIG)
    change(_sends(changed))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(changed), encoding="utf-8")
    assert (await runtime.reload(tmp_path / "c.yaml")).ok


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda g: g.update(approvers=["carol"]), id="grantor-removed"),
        pytest.param(
            lambda g: g.update(approvers=["alice", "carol"], quorum=2, editable=[]), id="quorum-raised"
        ),
        pytest.param(lambda g: g.update(min_assurance="oidc"), id="level-raised"),
        pytest.param(
            lambda g: g.update(
                approvers=["carol"], escalate=[{"after": "10m", "channel": "chat", "approvers": ["bob"]}]
            ),
            id="grantor-removed-escalation-kept-others",
        ),
    ],
)
async def test_grant_the_reloaded_gate_would_not_give_ends(
    http: httpx.AsyncClient,
    agent_key: str,
    runtime: Runtime,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], object],
) -> None:
    await _grant(http, agent_key)
    await _reload(runtime, tmp_path, change)
    answer = await ask(http, agent_key, send())
    assert answer["decision"] != "allow", answer


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda g: g.update(timeout="45m"), id="unrelated-field"),
        pytest.param(lambda g: g.update(approvers=["carol", "alice"]), id="another-approver-added"),
        pytest.param(
            lambda g: g.update(
                approvers=["carol"], escalate=[{"after": "10m", "channel": "chat", "approvers": ["alice"]}]
            ),
            id="grantor-moved-to-an-escalation",
        ),
        pytest.param(lambda g: g.update(min_assurance="admin_token"), id="level-the-grantor-had"),
    ],
)
async def test_grant_the_reloaded_gate_would_still_give_holds(
    http: httpx.AsyncClient,
    agent_key: str,
    runtime: Runtime,
    tmp_path: Path,
    change: Callable[[dict[str, Any]], object],
) -> None:
    await _grant(http, agent_key)
    await _reload(runtime, tmp_path, change)
    answer = await ask(http, agent_key, send())
    assert answer["decision"] == "allow", answer


async def test_grant_whose_offer_the_reload_shortened(
    http: httpx.AsyncClient, agent_key: str, runtime: Runtime, tmp_path: Path
) -> None:
    """A grant of an hour, given 40 minutes ago, under an offer reloaded to 30 minutes: over."""
    await _grant(http, agent_key)
    table = Grant.__table__  # type: ignore[attr-defined]
    async with transaction(runtime.sessions) as session:
        for gid, created in (await session.exec(sa.select(table.c.id, table.c.created_at))).all():
            await session.exec(
                sa.update(table).where(table.c.id == gid).values(created_at=created - timedelta(minutes=40))
            )
    assert (await ask(http, agent_key, send()))["decision"] == "allow"
    await _reload(
        runtime, tmp_path, lambda g: g.update(grants=[{"scope": "session", "for": "30m", "same": ["to"]}])
    )
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
