"""Changing gates without a restart: reload by API, by the CLI and by SIGHUP, on a live server."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from signoff.app.config import config_version
from signoff.app.db import transaction
from signoff.app.operators import decide
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels import Verdict
from signoff.channels.fake import FakeChannel
from tests.channels.fake_slack import APP_TOKEN, BOT_TOKEN, CHANNEL, FakeSlack
from tests.channels.feishu_fake import (
    MESSAGES_PATH,
    WS_ENDPOINT_PATH,
    FakeFeishu,
    FakeLongConnection,
    ack_data,
    serve,
)
from tests.channels.feishu_support import CHAT, card_action
from tests.conftest import ADMIN_TOKEN, DEFAULT_CONFIG, Server, free_port
from tests.waiting import eventually

BIG = {"invoice_id": "inv-1", "amount": 90_000}
SIGNOFF = Path(sys.executable).with_name("signoff")


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def with_refund_gate(data: dict[str, Any], approvers: list[str] | None = None) -> dict[str, Any]:
    data = copy.deepcopy(data)
    hooks = data["agents"]["finance-bot"]["hooks"]
    hooks.append(
        {
            "type": "confirmation_gate",
            "name": "refunds",
            "tools": ["refund_*"],
            "channel": "chat",
            "approvers": ["carol"],
        }
    )
    if approvers is not None:
        hooks[0]["approvers"] = approvers
    return data


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "signoff.yaml"
    write(path, DEFAULT_CONFIG)
    return path


@pytest.fixture
async def live(db_url: str, config_file: Path) -> AsyncIterator[tuple[Runtime, Server]]:
    settings = Settings(database_url=db_url, admin_token=ADMIN_TOKEN, config=config_file)
    runtime = Runtime.create(settings, channels={"chat": FakeChannel("chat")})
    async with Server(runtime) as server:
        yield runtime, server
    await runtime.aclose()


async def key_for(runtime: Runtime, agent: str = "finance-bot") -> str:
    from signoff.app.audit import Actor
    from signoff.app.keys import create_key

    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, agent, actor=Actor("test"))
    return token


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_a_reload_applies_to_the_next_call_and_pending_requests_keep_their_gate(
    live: tuple[Runtime, Server], config_file: Path
) -> None:
    runtime, server = live
    key = await key_for(runtime)
    agent = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        before = (await http.get("/v1/admin/config", headers=admin())).json()
        pending = await http.post(
            "/v1/hooks/pre-tool-use", json={"tool_name": "pay_invoice", "arguments": BIG}, headers=agent
        )
        rid = pending.json()["request_id"]
        assert (
            await http.post(
                "/v1/hooks/pre-tool-use", json={"tool_name": "refund_x", "arguments": {}}, headers=agent
            )
        ).json()["decision"] == "allow"
        waiter = asyncio.create_task(
            http.get(f"/v1/requests/{rid}/wait", params={"timeout": 30}, headers=agent)
        )
        await eventually(lambda: runtime.hub.waiting == 1)  # parked in its long-poll

        write(config_file, with_refund_gate(DEFAULT_CONFIG, approvers=["bob", "carol"]))
        done = await http.post("/v1/admin/config/reload", headers=admin())
        assert done.status_code == 200, done.text
        assert done.json()["ok"] is True
        after = (await http.get("/v1/admin/config", headers=admin())).json()
        assert after["version"] == done.json()["version"] != before["version"]
        assert after["agents"]["finance-bot"]["hooks"][-1]["name"] == "refunds"

        # The next call meets the new gate; each request names the configuration it was gated under.
        refund = await http.post(
            "/v1/hooks/pre-tool-use", json={"tool_name": "refund_x", "arguments": {}}, headers=agent
        )
        assert refund.json()["decision"] == "pending"
        assert refund.json()["request"]["config_version"] == after["version"]
        assert pending.json()["request"]["config_version"] == before["version"]
        trail = (await http.get(f"/v1/admin/requests/{rid}", headers=admin())).json()
        assert trail["config_version"] == before["version"]

        # The pending request keeps the gate it was made under, and an approval must suit the
        # gate as reloaded too: Carol, added, was not asked; Alice, removed, approves no more;
        # Bob, in both, decides it.
        assert not waiter.done(), "a reload does not disconnect waiting agents"
        for operator, accepted in (("carol", False), ("alice", False), ("bob", True)):
            async with transaction(runtime.sessions) as session:
                vote = await decide(
                    session, rid, verdict=Verdict.APPROVE, operator=operator, config=runtime.config
                )
            assert vote is not None
            assert vote.accepted is accepted, (operator, vote.message)
        answer = await asyncio.wait_for(waiter, 10)
    assert answer.json()["status"] == "approved"
    assert answer.json()["decided_by"]["user_id"] == "bob"


async def test_a_broken_file_changes_nothing_and_names_every_problem(
    live: tuple[Runtime, Server], config_file: Path
) -> None:
    _, server = live
    broken = copy.deepcopy(DEFAULT_CONFIG)
    broken["agents"]["finance-bot"]["hooks"][0]["when"] = "args.amount >>> 1"
    broken["agents"]["finance-bot"]["hooks"][1]["quorum"] = 0
    write(config_file, broken)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        before = (await http.get("/v1/admin/config", headers=admin())).json()
        failures_before = failures((await http.get("/metrics")).text)
        refused = await http.post("/v1/admin/config/reload", headers=admin())
        after = (await http.get("/v1/admin/config", headers=admin())).json()
        metrics = (await http.get("/metrics")).text
    assert refused.status_code == 422
    problems = refused.json()["problems"]
    assert len(problems) == 2, problems
    assert any("hooks[0].when: invalid CEL condition" in p for p in problems)
    assert any("hooks[1].quorum" in p for p in problems)
    assert refused.json()["version"] == before["version"] == after["version"]
    assert after == before
    assert f'signoff_config_info{{version="{before["version"]}"}} 1.0' in metrics
    assert failures(metrics) == failures_before + 1


def failures(metrics: str) -> float:
    (line,) = [m for m in metrics.splitlines() if m.startswith("signoff_config_reload_failures_total ")]
    return float(line.split()[1])


async def test_the_version_is_the_content_not_the_layout(tmp_path: Path) -> None:
    from signoff.app.config import load_config

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    write(a, DEFAULT_CONFIG)
    b.write_text(
        "# the same, written differently\n" + yaml.safe_dump(DEFAULT_CONFIG, sort_keys=True, indent=4)
    )
    assert config_version(load_config(a)) == config_version(load_config(b))
    write(b, with_refund_gate(DEFAULT_CONFIG))
    assert config_version(load_config(a)) != config_version(load_config(b))


async def test_unchanged_channels_keep_their_connection_and_changed_ones_are_rebuilt(
    db_url: str, tmp_path: Path
) -> None:
    slack = FakeSlack()
    await slack.start()
    data = copy.deepcopy(DEFAULT_CONFIG)
    data["channels"]["ops"] = {
        "type": "slack",
        "bot_token": BOT_TOKEN,
        "signing_secret": "s" * 20,
        "channel": CHANNEL,
        "base_url": slack.base_url,
        "app_token": APP_TOKEN,
    }
    path = tmp_path / "signoff.yaml"
    write(path, data)
    settings = Settings(database_url=db_url, admin_token=ADMIN_TOKEN, config=path)
    runtime = Runtime.create(settings, channels={"chat": FakeChannel("chat")})
    try:
        async with Server(runtime, background=True):
            await asyncio.wait_for(slack.socket_connected.wait(), 10)
            first = runtime.channels["ops"]
            write(path, with_refund_gate(data))
            kept = await runtime.reload()
            assert kept.ok
            assert kept.rebuilt == ()
            assert runtime.channels["ops"] is first
            assert len(slack.calls_to("apps.connections.open")) == 1, "the Socket Mode connection stays"

            data["channels"]["ops"]["channel"] = "C0OTHER"
            write(path, with_refund_gate(data))
            rebuilt = await runtime.reload()
            assert rebuilt.rebuilt == ("ops",)
            assert rebuilt.closed == ("ops",)
            assert runtime.channels["ops"] is not first
            deadline = time.monotonic() + 10
            while len(slack.calls_to("apps.connections.open")) < 2:
                assert time.monotonic() < deadline, "the rebuilt channel opened its own connection"
                await asyncio.sleep(0.05)
    finally:
        await runtime.aclose()
        await slack.close()


@pytest.fixture
def fake_feishu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFeishu]:
    """A fake Feishu Open API on loopback (lark-oapi's requests would send loopback through a proxy)."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeFeishu()
    with serve(fake):
        yield fake


async def test_a_feishu_long_connection_is_kept_or_rebuilt_and_clicks_still_decide(
    db_url: str, tmp_path: Path, fake_feishu: FakeFeishu
) -> None:
    app_id = "cli_reload_long_connection"
    fake_feishu.add_chat(CHAT)
    fake_feishu.add_app(app_id, "app-secret", chats=(CHAT,))
    fake_feishu.add_user("ou_alice", name="Alice", email="alice@example.com")
    data = copy.deepcopy(DEFAULT_CONFIG)
    data["people"]["alice"]["feishu"] = "ou_alice"
    data["channels"]["lark"] = {
        "type": "feishu",
        "app_id": app_id,
        "app_secret": "app-secret",
        "chat_id": CHAT,
        "base_url": fake_feishu.origin,
        "mode": "websocket",
    }
    data["agents"]["finance-bot"]["hooks"].append(
        {
            "type": "confirmation_gate",
            "name": "lark payments",
            "tools": ["lark_*"],
            "channel": "lark",
            "approvers": ["alice"],
        }
    )
    path = tmp_path / "signoff.yaml"
    write(path, data)
    settings = Settings(database_url=db_url, admin_token=ADMIN_TOKEN, config=path)
    runtime = Runtime.create(settings, channels={"chat": FakeChannel("chat")})
    try:
        async with FakeLongConnection() as feishu_ws:
            fake_feishu.ws_url = feishu_ws.url
            async with (
                Server(runtime, background=True) as server,
                httpx.AsyncClient(base_url=server.url, timeout=30) as http,
            ):
                agent = {"Authorization": f"Bearer {await key_for(runtime)}"}

                async def ask(key: str) -> str:
                    call = {"tool_name": "lark_pay", "arguments": {"to": "ACME"}, "idempotency_key": key}
                    answer = (await http.post("/v1/hooks/pre-tool-use", json=call, headers=agent)).json()
                    assert answer["decision"] == "pending", answer
                    rid: str = answer["request_id"]
                    return rid

                async def click(rid: str) -> None:
                    """Alice approves ``rid`` on its card, over the long connection."""
                    pushed = await feishu_ws.push(
                        json.dumps(card_action(rid, open_id="ou_alice", event_id=f"ev-{rid}")).encode()
                    )
                    assert pushed["code"] == 200
                    assert ack_data(pushed)["toast"]["type"] == "success", ack_data(pushed)
                    state = (await http.get(f"/v1/requests/{rid}", headers=agent)).json()
                    assert (state["status"], state["decided_by"]["user_id"]) == ("approved", "ou_alice")

                await asyncio.wait_for(feishu_ws.connected.wait(), 10)
                first = runtime.channels["lark"]
                before, after = await ask("before-reload"), await ask("after-reload")
                await eventually(lambda: len(fake_feishu.calls("POST", MESSAGES_PATH)) == 2)

                # Other settings change: the channel, and its connection, stay as they were.
                write(path, with_refund_gate(data))
                kept = await runtime.reload()
                assert kept.ok
                assert (kept.rebuilt, kept.closed) == ((), ())
                assert runtime.channels["lark"] is first
                await click(before)
                assert (feishu_ws.connections, feishu_ws.closed) == (1, 0), "no reconnect"
                assert len(fake_feishu.calls("POST", WS_ENDPOINT_PATH)) == 1

                # The app secret is rotated: the old connection closes, a new one opens with it.
                fake_feishu.apps[app_id] = "rotated-secret"
                data["channels"]["lark"]["app_secret"] = "rotated-secret"
                write(path, with_refund_gate(data))
                rebuilt = await runtime.reload()
                assert (rebuilt.rebuilt, rebuilt.closed) == (("lark",), ("lark",))
                assert runtime.channels["lark"] is not first
                await eventually(lambda: (feishu_ws.connections, feishu_ws.closed) == (2, 1))
                endpoint = fake_feishu.calls("POST", WS_ENDPOINT_PATH)
                assert [c.json["AppSecret"] for c in endpoint] == ["app-secret", "rotated-secret"]
                await click(after)
    finally:
        await runtime.aclose()


# --- a real `signoff serve`: SIGHUP and `signoff config reload` -----------------------------------


def wait_until(predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sighup_and_the_cli_reload_a_running_server(tmp_path: Path, sqlite_url: str) -> None:
    config = tmp_path / "signoff.yaml"
    write(config, DEFAULT_CONFIG)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    env.update(
        SIGNOFF_DATABASE_URL=f"sqlite:///{tmp_path / 'signoff.db'}",
        SIGNOFF_CONFIG=str(config),
        SIGNOFF_ADMIN_TOKEN=ADMIN_TOKEN,
        SIGNOFF_PORT=str(port),
        SIGNOFF_LOG_FORMAT="text",
    )
    server = subprocess.Popen(
        [str(SIGNOFF), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"

    def version() -> str | None:
        try:
            return str(httpx.get(f"{url}/v1/admin/config", headers=admin(), timeout=2).json()["version"])
        except httpx.HTTPError:
            return None

    try:
        wait_until(lambda: version() is not None)
        first = version()
        write(config, with_refund_gate(DEFAULT_CONFIG))
        server.send_signal(signal.SIGHUP)
        wait_until(lambda: version() != first)
        second = version()

        write(config, with_refund_gate(DEFAULT_CONFIG, approvers=["carol"]))
        done = subprocess.run(
            [str(SIGNOFF), "config", "reload"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        third = version()
        assert third not in (first, second)
        assert done.stdout.strip() == f"configuration {third} in force (channels rebuilt: none)"

        config.write_text(
            "agents: {finance-bot: {hooks: [{type: confirmation_gate, tools: [x], channel: ghost}]}}\n"
        )
        refused = subprocess.run(
            [str(SIGNOFF), "config", "reload"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 1
        assert "no channel named 'ghost'" in refused.stderr
        assert f"{third} stays in force" in refused.stderr
        assert version() == third

        server.send_signal(signal.SIGHUP)  # a broken file by signal: logged, nothing changes
        time.sleep(0.5)
        assert version() == third
        assert server.poll() is None
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert b"configuration reload refused, nothing changed" in err


def test_config_reload_needs_a_running_server_and_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    done = subprocess.run(
        [str(SIGNOFF), "config", "reload"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: SIGNOFF_ADMIN_TOKEN is not set")
    env["SIGNOFF_ADMIN_TOKEN"] = ADMIN_TOKEN
    done = subprocess.run(
        [str(SIGNOFF), "config", "reload", "--url", f"http://127.0.0.1:{free_port()}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "is `signoff serve` running there?" in done.stderr
