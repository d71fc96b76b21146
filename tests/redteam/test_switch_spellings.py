"""An operator turns on read-only mode under another spelling of its switch (``READ_ONLY``,
``read-only``, ``Read_Only``): the switch was made and answered "on", yet no guard watched it,
and the agents went on writing. A switch no ``readonly_guard`` watches is refused (404 naming
the watched ones) by the operator API, the console and the command line, and nothing is set."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlmodel import select

from signoff.app.audit import Actor
from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import transaction
from signoff.app.models import AuditEvent, Switch
from signoff.app.runtime import Runtime
from signoff.app.switches import set_switch
from tests.app.test_cli import Cli, cli, migrated  # noqa: F401  (fixtures)
from tests.redteam.support import PRE, property_test

GUARDED = {"type": "readonly_guard", "tools": ["db_*"]}


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(
        {"channels": {"chat": {"type": "fake"}}, "agents": {"finance-bot": {"hooks": [GUARDED]}}},
        source="test.yaml",
    )


def _spellings() -> st.SearchStrategy[str]:
    letters = st.lists(st.booleans(), min_size=9, max_size=9)
    joiner = st.sampled_from(["_", "-", ".", "__", ""])
    return st.builds(
        lambda upper, sep, tail: (
            "".join(c.upper() if u else c for c, u in zip("readXonly", upper, strict=True)).replace("X", sep)
            + tail
        ),
        letters,
        joiner,
        st.sampled_from(["", ".", "_", "1"]),
    ).filter(lambda name: name != "read_only")


@property_test(40)
@given(name=_spellings())
async def test_another_spelling_of_the_read_only_switch_is_refused_and_sets_nothing(
    http: httpx.AsyncClient, admin_headers: dict[str, str], agent_key: str, runtime: Runtime, name: str
) -> None:
    answer = await http.put(
        f"/v1/admin/switches/{name}", json={"on": True, "operator": "alice"}, headers=admin_headers
    )
    assert answer.status_code == 404, answer.text
    assert "'read_only'" in answer.json()["detail"]  # names the switch that is watched
    async with runtime.sessions() as s:
        assert (await s.exec(select(Switch))).all() == []
        assert (await s.exec(select(AuditEvent).where(AuditEvent.action == "switch_changed"))).all() == []
    write = await http.post(
        PRE, json={"tool_name": "db_write", "arguments": {}}, headers={"Authorization": f"Bearer {agent_key}"}
    )
    assert write.json()["decision"] == "allow"  # nothing pretended to stop it


def test_the_command_line_refuses_a_switch_no_guard_watches(cli: Cli) -> None:  # noqa: F811
    done = cli("readonly", "on", "--switch", "READ_ONLY")
    assert done.returncode == 1
    assert "no readonly_guard watches a switch 'READ_ONLY'" in done.stderr
    assert cli.sql("SELECT name FROM switch") == []


async def test_a_switch_left_on_by_a_guard_since_removed_can_still_be_turned_off(
    http: httpx.AsyncClient, admin_headers: dict[str, str], runtime: Runtime
) -> None:
    async with transaction(runtime.sessions) as s:
        await set_switch(s, "maintenance", on=True, actor=Actor("web", "alice", "alice"))
    off = await http.put(
        "/v1/admin/switches/maintenance", json={"on": False, "operator": "alice"}, headers=admin_headers
    )
    assert off.status_code == 200, off.text
    assert off.json()["on"] is False
    again = await http.put(
        "/v1/admin/switches/maintenance", json={"on": True, "operator": "alice"}, headers=admin_headers
    )
    assert again.status_code == 404
