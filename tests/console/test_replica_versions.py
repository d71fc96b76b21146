"""Replicas on one database, each with its own file: the console and the API show when they differ."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest
import yaml

from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server
from tests.console.conftest import Console

pytestmark = pytest.mark.postgres

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_replicas_running_different_configurations_are_shown_as_such(
    runtime: Runtime, console_server: Server, alice: Console, db_url: str, tmp_path: Path
) -> None:
    other = copy.deepcopy(DEFAULT_CONFIG)
    other["agents"]["finance-bot"]["hooks"][0]["approvers"] = ["carol"]
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other), encoding="utf-8")
    second = Runtime.create(
        Settings(database_url=db_url, admin_token=ADMIN_TOKEN, config=path),
        channels={"chat": FakeChannel("chat")},
    )
    second.replica = "replica-b:2"
    try:
        runtime.replica = "replica-a:1"
        await runtime.report_replica()
        await second.report_replica()
        assert second.version != runtime.version

        async with httpx.AsyncClient(base_url=console_server.url, timeout=30) as http:
            shown = (await http.get("/v1/admin/config", headers=ADMIN)).json()
        assert shown["replicas_agree"] is False
        assert {(r["id"], r["version"]) for r in shown["replicas"]} == {
            ("replica-a:1", runtime.version),
            ("replica-b:2", second.version),
        }
        page = (await alice.get("/ui/config")).text
        assert f"This replica runs configuration <strong><code>{runtime.version}</code>" in page
        assert "Replicas run different configurations" in page
        assert runtime.version in page
        assert second.version in page

        # The first replica loads the same file: they agree again.
        runtime.settings = runtime.settings.model_copy(update={"config": path})
        done = await runtime.reload()
        assert done.ok
        assert runtime.version == second.version
        async with httpx.AsyncClient(base_url=console_server.url, timeout=30) as http:
            shown = (await http.get("/v1/admin/config", headers=ADMIN)).json()
        assert shown["replicas_agree"] is True
    finally:
        await second.aclose()
