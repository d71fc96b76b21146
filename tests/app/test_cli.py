"""The ``signoff`` command line against a SQLite file built by the migrations.

Commands run in this process, through the console script's own entry point under click's
test runner (its stdout, stderr, environment and exit code); the tests of what a shell sees
of a process (start-up, exit codes, one-line errors, a traceback with SIGNOFF_DEBUG) run
the installed ``signoff`` executable."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.config import AgentConfig, parse_config
from signoff.app.db import create_engine, migrate, sessionmaker, transaction
from signoff.app.keys import authenticate
from signoff.app.models import ConfirmationRequest
from tests.app.factories import make_request
from tests.cli import signoff
from tests.conftest import DEFAULT_CONFIG

SIGNOFF = Path(sys.executable).with_name("signoff")


class Cli:
    """Runs ``signoff`` with SIGNOFF_DATABASE_URL and SIGNOFF_CONFIG pointing at this test's
    files: in this process, or (``process``) as the installed executable."""

    def __init__(self, tmp_path: Path, *, process: bool = False) -> None:
        self.process = process
        self.db = tmp_path / "signoff.db"
        self.url = f"sqlite:///{self.db}"
        self.config_file = tmp_path / "signoff.yaml"
        self.config_file.write_text(yaml.safe_dump(DEFAULT_CONFIG, sort_keys=False), encoding="utf-8")
        self.config = parse_config(DEFAULT_CONFIG, source=str(self.config_file))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
        self.env.update(SIGNOFF_DATABASE_URL=self.url, SIGNOFF_CONFIG=str(self.config_file))

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        if self.process:
            return subprocess.run(
                [str(SIGNOFF), *args], env=self.env, capture_output=True, text=True, timeout=120, check=False
            )
        # The environment exactly as the process would get it: SIGNOFF_* only from self.env.
        return signoff(*args, env=self.env)

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def run(self, work: Callable[[Any], Any]) -> Any:
        """Run ``await work(session)`` in one transaction on the same database, in-process."""

        async def go() -> Any:
            engine = create_engine(self.url)
            try:
                async with transaction(sessionmaker(engine)) as session:
                    return await work(session)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def request(self, tool: str = "pay_invoice", **kw: Any) -> str:
        """A pending request made the way the pre-tool-use flow makes it."""

        async def work(session: Any) -> str:
            req = await make_request(session, self.config, tool=tool, **kw)
            return req.id

        rid: str = self.run(work)
        return rid

    def row(self, rid: str) -> ConfirmationRequest:
        async def work(session: Any) -> ConfirmationRequest | None:
            return await session.get(ConfirmationRequest, rid)

        req = self.run(work)
        assert req is not None
        return req

    def agent_for(self, token: str) -> str | None:
        async def work(session: Any) -> str | None:
            return await authenticate(session, token)

        agent: str | None = self.run(work)
        return agent

    def sql(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.db) as conn:
            rows = conn.execute(statement, params).fetchall()
        conn.close()
        return rows


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file the migrations built, once for the module; each test gets a copy."""
    db = tmp_path_factory.mktemp("migrated") / "signoff.db"
    migrate(f"sqlite:///{db}")
    return db


def _copy(source: Path, target: Path) -> None:
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


@pytest.fixture
def cli(tmp_path: Path, migrated: Path) -> Cli:
    c = Cli(tmp_path)
    _copy(migrated, c.db)
    return c


@pytest.fixture
def cli_process(tmp_path: Path, migrated: Path) -> Cli:
    """The installed executable, for what a shell sees of it."""
    c = Cli(tmp_path, process=True)
    _copy(migrated, c.db)
    return c


# --- db -------------------------------------------------------------------------------------------


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    assert not cli.db.exists()
    out = cli.ok("db", "upgrade")
    assert "head" in out
    tables = {r[0] for r in cli.sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {
        "confirmation_request",
        "vote",
        "audit_event",
        "audit_head",
        "delivery",
        "agent_key",
        "alembic_version",
    } <= tables
    assert cli.sql("SELECT id, seq, last_hash FROM audit_head") == [(i, 0, "0" * 64) for i in range(1, 65)]
    [(version,)] = cli.sql("SELECT version_num FROM alembic_version")
    # Running it again is harmless.
    cli.ok("db", "upgrade")
    assert cli.sql("SELECT version_num FROM alembic_version") == [(version,)]


# --- keys -----------------------------------------------------------------------------------------


def test_keys_create_prints_the_key_alone_on_the_last_line(cli_process: Cli) -> None:
    cli = cli_process
    out = cli.ok("keys", "create", "finance-bot")
    lines = out.rstrip("\n").splitlines()
    key = lines[-1]
    assert key == key.strip()
    assert key.startswith("sk_signoff_")
    assert " " not in key
    assert all(key not in line for line in lines[:-1])
    assert cli.agent_for(key) == "finance-bot"
    assert cli.agent_for(key + "x") is None
    # Stored hashed: the key itself is nowhere in the database.
    [(stored,)] = cli.sql("SELECT key_hash FROM agent_key")
    assert key not in stored


def test_each_key_is_new(cli: Cli) -> None:
    first = cli.ok("keys", "create", "finance-bot").splitlines()[-1]
    second = cli.ok("keys", "create", "finance-bot").splitlines()[-1]
    assert first != second
    assert cli.agent_for(first) == cli.agent_for(second) == "finance-bot"


def test_keys_list_never_prints_the_key(cli: Cli) -> None:
    key = cli.ok("keys", "create", "finance-bot").splitlines()[-1]
    other = cli.ok("keys", "create", "other-bot").splitlines()[-1]
    out = cli.ok("keys", "list")
    assert key not in out
    assert other not in out
    ids = {r[0]: r[1] for r in cli.sql("SELECT id, agent_id FROM agent_key")}
    lines = out.strip().splitlines()
    assert len(lines) == 2
    listed = {line.split()[0]: line.split()[1] for line in lines}
    assert listed == ids
    assert all(line.endswith("live") for line in lines)
    for hashed in (r[0] for r in cli.sql("SELECT key_hash FROM agent_key")):
        assert hashed not in out


def test_keys_revoke_by_id(cli: Cli) -> None:
    first = cli.ok("keys", "create", "finance-bot").splitlines()[-1]
    second = cli.ok("keys", "create", "finance-bot").splitlines()[-1]
    first_id = first.removeprefix("sk_signoff_").split("_")[0]
    assert cli.sql("SELECT agent_id FROM agent_key WHERE id = ?", first_id) == [("finance-bot",)]

    assert cli.ok("keys", "revoke", first_id).strip() == f"revoked {first_id}"
    assert cli.agent_for(first) is None
    assert cli.agent_for(second) == "finance-bot"
    listed = cli.ok("keys", "list")
    [revoked_line] = [line for line in listed.splitlines() if line.startswith(first_id)]
    assert "revoked" in revoked_line

    again = cli("keys", "revoke", first_id)
    assert again.returncode == 1
    assert "no live key matched" in again.stderr
    unknown = cli("keys", "revoke", "deadbeef")
    assert unknown.returncode == 1


def test_keys_revoke_by_agent(cli: Cli) -> None:
    keys = [cli.ok("keys", "create", "finance-bot").splitlines()[-1] for _ in range(2)]
    other = cli.ok("keys", "create", "other-bot").splitlines()[-1]
    out = cli.ok("keys", "revoke", "--agent", "finance-bot")
    assert out.startswith("revoked ")
    assert len(out.removeprefix("revoked ").split(", ")) == 2
    assert [cli.agent_for(k) for k in keys] == [None, None]
    assert cli.agent_for(other) == "other-bot"
    assert cli("keys", "revoke", "--agent", "finance-bot").returncode == 1


def test_keys_revoke_needs_exactly_one_target(cli_process: Cli) -> None:
    cli = cli_process
    assert signoff("keys", "create", "finance-bot", env=cli.env).returncode == 0  # in this process
    neither = cli("keys", "revoke")
    assert neither.returncode == 2
    assert "name a key id or --agent" in neither.stderr
    both = cli("keys", "revoke", "abc", "--agent", "finance-bot")
    assert both.returncode == 2


def test_key_events_are_audited(cli: Cli) -> None:
    cli.ok("keys", "create", "finance-bot")
    cli.ok("keys", "revoke", "--agent", "finance-bot")
    assert [r[0] for r in cli.sql("SELECT action FROM audit_event ORDER BY seq")] == [
        "key_created",
        "key_revoked",
    ]


# --- requests -------------------------------------------------------------------------------------


def test_requests_list_is_a_table_with_a_header_id_first(cli: Cli) -> None:
    assert cli.ok("requests", "list") == "no requests\n"
    paid = cli.request("pay_invoice")
    wired = cli.request("wire_money")
    done = cli.request("pay_refund")
    cli.ok("requests", "approve", done, "--as", "alice", "--reason", "checked")

    def ids(*args: str) -> list[str]:
        out = cli.ok("requests", "list", *args)
        lines = out.strip().splitlines()
        if lines == [lines[0]] and lines[0].startswith("no "):
            return []
        assert lines[0].split() == ["ID", "STATUS", "AGENT", "TOOL", "WHEN", "DECIDED", "BY"]
        return [line.split()[0] for line in lines[1:]]

    assert ids() == [done, wired, paid], "newest first"
    assert ids("--status", "pending") == [wired, paid]
    assert ids("--status", "approved") == [done]
    assert ids("--status", "rejected") == []
    assert cli.ok("requests", "list", "--status", "rejected") == "no rejected requests\n"
    assert cli.ok("requests", "list", "--agent", "other-bot") == "no requests of agent other-bot\n"
    assert ids("--limit", "1") == [done]

    table = cli.ok("requests", "list").splitlines()
    # aligned: every column starts where the header's does
    starts = [table[0].index(h) for h in ("STATUS", "AGENT", "TOOL", "WHEN", "DECIDED BY")]
    for line in table[1:]:
        for start in starts:
            assert line[start - 2 : start] == "  ", (line, start)
            assert line[start] != " ", (line, start)
    decided = next(line for line in table if line.startswith(done))
    assert decided.split()[:5] == [done, "approved", "finance-bot", "pay_refund", "decided"]
    assert "expires" not in decided
    assert decided.rstrip().endswith("Alice"), "the decider is shown"
    pending = next(line for line in table if line.startswith(paid))
    assert "expires" in pending
    assert pending.rstrip().endswith("-")

    bad = cli("requests", "list", "--status", "maybe")
    assert bad.returncode == 2
    assert bad.stderr == "error: --status 'maybe': one of pending, approved, rejected, expired, cancelled\n"


def test_requests_show_prints_json(cli: Cli) -> None:
    rid = cli.request("pay_invoice", arguments={"amount": 90000, "api_token": "s3cret"}, user_id="carol")
    shown = json.loads(cli.ok("requests", "show", rid))
    assert shown["id"] == rid
    assert shown["status"] == "pending"
    assert shown["agent_id"] == "finance-bot"
    assert shown["tool_name"] == "pay_invoice"
    assert shown["arguments"] == {"amount": 90000, "api_token": "[redacted]"}
    assert shown["gate"] == "payments"
    assert shown["user_id"] == "carol"
    assert shown["votes"] == []
    assert shown["decided_by"] is None


def test_requests_approve_then_again(cli: Cli) -> None:
    rid = cli.request()
    done = cli("requests", "approve", rid, "--as", "alice", "--reason", "ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Approved once by Alice."
    row = cli.row(rid)
    assert row.status == "approved"
    assert (row.decided_by_channel, row.decided_by_user_id, row.decided_by_name) == ("web", "alice", "Alice")
    assert row.reason == "ok"
    shown = json.loads(cli.ok("requests", "show", rid))
    assert shown["status"] == "approved"
    [vote] = shown["votes"]
    assert (vote["verdict"], vote["user_id"], vote["reason"]) == ("approve", "alice", "ok")
    assert vote["assurance"] == "cli_local"  # on the database itself: whoever --as names

    again = cli("requests", "approve", rid, "--as", "bob")
    assert again.returncode == 1
    assert "already approved by Alice" in again.stderr
    assert cli.row(rid).decided_by_user_id == "alice"
    actions = [r[0] for r in cli.sql("SELECT action FROM audit_event WHERE request_id = ? ORDER BY seq", rid)]
    assert actions == ["created", "vote", "approved", "vote_refused"]
    [(identity,)] = cli.sql("SELECT detail FROM audit_event WHERE request_id = ? AND action = 'vote'", rid)
    assert json.loads(identity)["identity"] == {"via": "cli"}


def test_requests_reject(cli: Cli) -> None:
    rid = cli.request()
    done = cli("requests", "reject", rid, "--as", "bob", "--reason", "not today")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Rejected by Bob."
    row = cli.row(rid)
    assert row.status == "rejected"
    assert row.reason == "not today"
    again = cli("requests", "reject", rid, "--as", "alice", "--reason", "x")
    assert again.returncode == 1
    assert "already rejected by Bob" in again.stderr


def test_requests_reject_without_a_required_reason(cli: Cli) -> None:
    rid = cli.request("wire_money")
    refused = cli("requests", "reject", rid, "--as", "bob")
    assert refused.returncode == 1
    assert "reason is required" in refused.stderr
    assert cli.row(rid).status == "pending"


def test_quorum_two_through_the_cli(cli: Cli) -> None:
    rid = cli.request("wire_money")
    first = cli.ok("requests", "approve", rid, "--as", "alice")
    assert first.strip() == "Approval recorded (1 of 2)."
    assert cli.row(rid).status == "pending"
    twice = cli("requests", "approve", rid, "--as", "alice")
    assert twice.returncode == 1
    assert "already voted" in twice.stderr
    cli.ok("requests", "approve", rid, "--as", "bob")
    assert cli.row(rid).status == "approved"


@pytest.mark.parametrize("operator", ["mallory", "carol"], ids=["stranger", "not-listed"])
def test_requests_approve_by_someone_not_an_approver(cli: Cli, operator: str) -> None:
    rid = cli.request()
    refused = cli("requests", "approve", rid, "--as", operator)
    assert refused.returncode == 1
    assert "not an approver" in refused.stderr
    assert cli.row(rid).status == "pending"


@pytest.mark.parametrize("verdict", ["approve", "reject"])
@pytest.mark.parametrize("as_", [None, "", "  "], ids=["missing", "empty", "blank"])
def test_a_decision_without_as_says_so_and_lists_the_approvers(
    cli: Cli, verdict: str, as_: str | None
) -> None:
    rid = cli.request()
    done = cli("requests", verdict, rid, "--reason", "r", *(["--as", as_] if as_ is not None else []))
    assert done.returncode == 2
    assert done.stderr == (
        f"error: say who decides: `signoff requests {verdict} {rid} --as NAME` "
        "(approvers of this request: alice, bob)\n"
    )
    assert cli.row(rid).status == "pending"


def test_a_decision_without_a_configuration_names_signoff_config(cli: Cli) -> None:
    rid = cli.request()
    del cli.env["SIGNOFF_CONFIG"]
    done = cli("requests", "approve", rid, "--as", "alice")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: SIGNOFF_CONFIG is not set")
    assert "set SIGNOFF_CONFIG=" in done.stderr
    assert cli.row(rid).status == "pending"


def test_a_database_without_tables_names_db_upgrade(tmp_path: Path) -> None:
    cli = Cli(tmp_path, process=True)  # the file does not exist: nothing migrated it
    for args in (["keys", "create", "finance-bot"], ["requests", "list"], ["audit", "verify"]):
        done = cli(*args)
        assert done.returncode == 1, args
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert "has no Signoff tables yet: run `signoff db upgrade`" in done.stderr
        assert "Traceback" not in done.stderr


def test_an_unreachable_database_is_one_line_without_the_password(tmp_path: Path) -> None:
    cli = Cli(tmp_path, process=True)
    cli.env["SIGNOFF_DATABASE_URL"] = "postgresql://signoff:hunter2@127.0.0.1:9/signoff"
    for args in (["keys", "create", "finance-bot"], ["db", "upgrade"], ["requests", "list"]):
        done = cli(*args)
        assert done.returncode == 1, args
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(
            "error: cannot reach the database at postgresql://signoff:***@127.0.0.1:9/"
        )
        assert "check SIGNOFF_DATABASE_URL" in done.stderr
        assert "hunter2" not in done.stderr


def test_signoff_debug_adds_the_traceback(tmp_path: Path) -> None:
    cli = Cli(tmp_path, process=True)
    cli.env["SIGNOFF_DEBUG"] = "1"
    done = cli("keys", "create", "finance-bot")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("error: the database at ")


def test_the_requester_cannot_approve_through_the_cli(cli: Cli) -> None:
    rid = cli.request(user_id="alice")
    refused = cli("requests", "approve", rid, "--as", "alice")
    assert refused.returncode == 1
    assert "own behalf" in refused.stderr
    cli.ok("requests", "approve", rid, "--as", "bob")


@pytest.mark.parametrize("command", ["show", "approve", "reject"])
def test_unknown_request_id(cli: Cli, command: str) -> None:
    args = ["requests", command, "no-such-request"] + (
        ["--as", "alice", "--reason", "x"] if command != "show" else []
    )
    done = cli(*args)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == "error: no request no-such-request (see `signoff requests list`)\n"


def test_decisions_refuse_an_invalid_configuration(cli: Cli) -> None:
    rid = cli.request()
    cli.config_file.write_text(
        "agents: {finance-bot: {hooks: [{type: confirmation_gate, tools: [x], channel: ghost}]}}\n"
    )
    done = cli("requests", "approve", rid, "--as", "alice")
    assert done.returncode == 2
    assert "no channel named 'ghost'" in done.stderr
    assert cli.row(rid).status == "pending"


def test_a_misspelt_approver_cannot_approve_since_the_configuration_no_longer_loads(cli: Cli) -> None:
    typo = copy.deepcopy(DEFAULT_CONFIG)
    typo["agents"]["finance-bot"]["hooks"][0].update(channel="web", approvers=["alcie", "bob"])
    # The request as a server that took the file would have made it: `alcie` an approver.
    gates = tuple(ConfirmationGate.model_validate(h) for h in typo["agents"]["finance-bot"]["hooks"])
    cli.config = replace(cli.config, agents={"finance-bot": AgentConfig(hooks=gates)})
    rid = cli.request()
    cli.config_file.write_text(yaml.safe_dump(typo, sort_keys=False), encoding="utf-8")
    problem = (
        f"{cli.config_file}: agents.finance-bot.hooks[0].approvers[0]: 'alcie' is neither in people "
        "nor an operator; did you mean 'alice'?"
    )
    for who in ("alcie", "alice"):
        done = cli("requests", "approve", rid, "--as", who)
        assert done.returncode == 2, done.stdout
        assert problem in done.stderr
    assert cli.row(rid).status == "pending"
    check = cli("config", "check", str(cli.config_file))
    assert (check.returncode, check.stdout, check.stderr) == (1, "", problem + "\n")


# --- audit ----------------------------------------------------------------------------------------


def test_audit_verify_intact(cli: Cli) -> None:
    assert cli.ok("audit", "verify").strip() == "audit chain intact: 0 events"
    cli.ok("keys", "create", "finance-bot")
    rid = cli.request()
    cli.ok("requests", "approve", rid, "--as", "alice")
    assert cli.ok("audit", "verify").strip() == "audit chain intact: 4 events"


def test_audit_verify_names_the_edited_event(cli: Cli) -> None:
    rid = cli.request()
    cli.ok("requests", "approve", rid, "--as", "alice", "--reason", "ok")
    cli.request("wire_money")
    total = len(cli.sql("SELECT seq FROM audit_event"))
    [(seq, detail)] = cli.sql("SELECT seq, detail FROM audit_event WHERE action = 'vote'")
    edited = {**json.loads(detail), "reason": "something else"}
    cli.sql("UPDATE audit_event SET detail = ? WHERE seq = ?", json.dumps(edited), seq)

    done = cli("audit", "verify")
    assert done.returncode == 1
    output = done.stdout + done.stderr
    assert f"broken at event {seq}:" in output
    assert "edited" in output
    assert seq < total, "the broken event is found even with intact events after it"


def test_audit_verify_notices_a_deleted_event(cli: Cli) -> None:
    cli.request()
    cli.request()
    [(last,)] = cli.sql("SELECT max(seq) FROM audit_event")
    [(chain,)] = cli.sql("SELECT chain FROM audit_event WHERE seq = ?", last)
    cli.sql("DELETE FROM audit_event WHERE seq = ?", last)
    done = cli("audit", "verify")
    assert done.returncode == 1
    assert f"chain {chain}'s head says" in done.stdout + done.stderr
    assert "(deleted)" in done.stdout + done.stderr


# --- grants ---------------------------------------------------------------------------------------


@pytest.fixture
def granting(cli: Cli) -> Cli:
    """The CLI with a gate on ``transfer_*`` that offers grants."""
    raw = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["agents"]["finance-bot"]["hooks"].insert(
        0,
        {
            "type": "confirmation_gate",
            "name": "transfers",
            "tools": ["transfer_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "grants": [{"scope": "agent", "for": "30m", "same": ["to"]}, {"scope": "session", "for": "1h"}],
        },
    )
    cli.config_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    cli.config = parse_config(raw, source=str(cli.config_file))
    return cli


def test_approve_with_a_grant_then_list_and_revoke_it(granting: Cli) -> None:
    cli = granting
    rid = cli.request("transfer_funds", arguments={"to": "acme", "amount": 5})
    done = cli("requests", "approve", rid, "--as", "alice", "--grant", "agent:30m")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Approved for this agent until ")
    assert done.stdout.strip().endswith("by Alice.")
    [line] = cli.ok("grants", "list").splitlines()
    grant_id = line.split()[0]
    assert f"{grant_id}  finance-bot  transfer_funds  agent  same=to  by Alice  until " in line
    assert line.endswith("uses=0  active")
    assert json.loads(cli.ok("requests", "show", rid))["grant"]["id"] == grant_id

    assert cli.ok("grants", "revoke", grant_id, "--as", "bob").strip() == f"revoked grant {grant_id}"
    assert cli.ok("grants", "list").strip() == ""
    [line] = cli.ok("grants", "list", "--all").splitlines()
    assert "revoked " in line
    assert line.endswith("by bob")
    again = cli("grants", "revoke", grant_id)
    assert again.returncode == 1
    assert "already revoked" in again.stderr
    missing = cli("grants", "revoke", "nope")
    assert missing.returncode == 1
    assert "no grant nope" in missing.stderr
    actions = [r[0] for r in cli.sql("SELECT action FROM audit_event ORDER BY seq")]
    assert actions.count("grant_created") == 1
    assert actions.count("grant_revoked") == 1


@pytest.mark.parametrize(
    ("grant", "error"),
    [
        ("agent:1h", "offer no such grant"),
        ("session:1h", "names no session"),
        ("agent:soon", "not a duration"),
        ("team:1h", "the scope is session or agent"),
    ],
)
def test_a_grant_the_gate_does_not_offer_is_one_error_line(granting: Cli, grant: str, error: str) -> None:
    rid = granting.request("transfer_funds", arguments={"to": "acme"})
    done = granting("requests", "approve", rid, "--as", "alice", "--grant", grant)
    assert done.returncode != 0
    assert error in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert granting.row(rid).status == "pending"
    assert granting.sql("SELECT count(*) FROM approval_grant") == [(0,)]


# --- approving with changes ----------------------------------------------------------------------


@pytest.fixture
def editing(cli: Cli) -> Cli:
    """The CLI with a gate on ``send_*`` whose approver may change ``amount`` and ``memo``."""
    raw = json.loads(json.dumps(DEFAULT_CONFIG))
    raw["agents"]["finance-bot"]["hooks"].insert(
        0,
        {
            "type": "confirmation_gate",
            "name": "sends",
            "tools": ["send_*"],
            "channel": "chat",
            "approvers": ["alice", "bob"],
            "editable": ["amount", "memo"],
        },
    )
    cli.config_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    cli.config = parse_config(raw, source=str(cli.config_file))
    return cli


def test_approve_with_set_changes_the_approved_call(editing: Cli) -> None:
    rid = editing.request("send_payment", arguments={"to": "acme", "amount": 90000, "memo": "x"})
    done = editing("requests", "approve", rid, "--as", "alice", "--set", "amount=40000", "--set", "memo=007")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'Approved by Alice with changes: amount 90000 → 40000, memo "x" → "007".'
    shown = json.loads(editing.ok("requests", "show", rid))
    assert shown["approved_arguments"] == {"to": "acme", "amount": 40000, "memo": "007"}
    assert [c["field"] for c in shown["changes"]] == ["amount", "memo"]


@pytest.mark.parametrize(
    ("option", "error"),
    [
        ("to=elsewhere", "to cannot be changed"),
        ("amount", "write FIELD=VALUE"),
        ("=1", "write FIELD=VALUE"),
        ("memo=" + "x" * 5000, "bytes"),
    ],
)
def test_a_change_the_gate_does_not_allow_is_one_error_line(editing: Cli, option: str, error: str) -> None:
    rid = editing.request("send_payment", arguments={"to": "acme", "amount": 90000})
    done = editing("requests", "approve", rid, "--as", "alice", "--set", option)
    assert done.returncode != 0
    assert error in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert editing.row(rid).status == "pending"


def test_decisions_and_revocations_from_the_command_line_are_owed_to_webhooks(granting: Cli) -> None:
    cli = granting
    raw = yaml.safe_load(cli.config_file.read_text(encoding="utf-8"))
    secret = "whsec_" + "A" * 43 + "="
    raw["webhooks"] = {
        "sink": {
            "url": "https://hooks.example.com/in",
            "secret": secret,
            "events": ["request.decided", "grant.revoked"],
        }
    }
    cli.config_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    rid = cli.request("transfer_funds", arguments={"to": "acme", "amount": 5})
    cli.ok("requests", "approve", rid, "--as", "alice", "--grant", "agent:30m")
    [line] = cli.ok("grants", "list").splitlines()
    cli.ok("grants", "revoke", line.split()[0], "--as", "bob")
    rows = cli.sql("SELECT channel, kind, payload FROM delivery WHERE kind = 'webhook' ORDER BY id")
    assert [(ch, json.loads(p)["type"]) for ch, _, p in rows] == [
        ("sink", "request.decided"),
        ("sink", "grant.revoked"),
    ]
    assert json.loads(rows[0][2])["data"]["status"] == "approved"


# --- what an operator meets -----------------------------------------------------------------------


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = getattr(command, "commands", {})
    return [path, *(p for name, sub in subs.items() for p in _commands(sub, (*path, name)))]


def test_help_writes_placeholders_as_words_and_breaks_no_word(cli: Cli) -> None:
    import typer

    from signoff.app.cli import app

    paths = _commands(typer.main.get_command(app))
    assert ("requests", "approve") in paths
    for path in paths:
        cli.env["COLUMNS"] = "80"
        text = cli.ok(*path, "--help")
        for shown in ("<bool>", "<str>", "<int>", "<path>", "<list", "{"):
            assert shown not in text, (path, shown, text)
    approve = cli.ok("requests", "approve", "--help")
    assert "Usage: signoff requests approve [OPTIONS] REQUEST_ID" in approve
    assert "--as NAME" in approve
    # Wrapped between words only.
    words = " ".join(cli.ok("requests", "list", "--help").split())
    assert "Only this status: pending, approved, rejected, expired or cancelled." in words
    assert "[KEY_ID]" in cli.ok("keys", "revoke", "--help")


def _imported(*args: str, env: dict[str, str] | None = None, full: bool = False) -> tuple[int, set[str]]:
    """The exit code of ``signoff ARGS`` in a fresh process, and the top-level modules it had
    imported by then (``full``: every module, by its dotted name)."""
    probe = (
        "import sys, atexit\n"
        "atexit.register(lambda: sys.__stderr__.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n'))\n"
        f"sys.argv = ['signoff', *{list(args)!r}]\n"
        "from _signoff_hooks_entry import server\n"
        "server()\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("MODULES "))
    names = line.split()[1:]
    return done.returncode, set(names) if full else {m.split(".")[0] for m in names}


SERVER = {"fastapi", "starlette", "uvicorn", "apscheduler", "jinja2", "slack_sdk", "lark_oapi"}
"""The web server and the channels' SDKs (httpx is the webhooks' client: decisions owe events)."""


def test_signoff_help_imports_nothing_of_the_server() -> None:
    code, loaded = _imported("--help")
    assert code == 0
    assert not loaded & (SERVER | {"httpx", "sqlalchemy", "sqlmodel", "pydantic", "yaml", "cel"})
    # typer's rich help, the version's metadata and the event loop: each costs more than the rest
    # of the start (docs/benchmarks.md, bench/cli_startup.py).
    assert not loaded & {"rich", "markdown_it", "asyncio"}
    assert "importlib.metadata" not in _imported("--help", full=True)[1]


def test_listing_and_deciding_import_the_database_but_not_the_web_server(cli: Cli) -> None:
    rid = cli.request("pay_invoice")
    env = {"SIGNOFF_DATABASE_URL": cli.url, "SIGNOFF_CONFIG": str(cli.config_file)}
    for args in (("requests", "list"), ("requests", "approve", rid, "--as", "alice")):
        code, loaded = _imported(*args, env=env)
        assert code == 0, args
        assert "sqlalchemy" in loaded
        assert not loaded & SERVER, (args, loaded & SERVER)
    assert cli.row(rid).status == "approved"


def test_keys_create_refuses_an_agent_the_configuration_does_not_name(cli: Cli) -> None:
    refused = cli("keys", "create", "finance-bto")
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr == (
        f"error: {cli.config_file} names no agent 'finance-bto'; did you mean 'finance-bot'? "
        "(its agents: finance-bot, other-bot); a key for it would be denied on every call. "
        "Add the agent to the file, or pass --force to create the key anyway\n"
    )
    assert cli.sql("SELECT count(*) FROM agent_key") == [(0,)]
    forced = cli.ok("keys", "create", "finance-bto", "--force").splitlines()[-1]
    assert cli.agent_for(forced) == "finance-bto"


def test_keys_create_without_a_configuration_warns(cli: Cli) -> None:
    del cli.env["SIGNOFF_CONFIG"]
    done = cli("keys", "create", "anyone")
    assert done.returncode == 0
    assert done.stderr.startswith("warning: SIGNOFF_CONFIG is not set, so nothing says whether 'anyone'")


def test_config_check_counts_in_words(cli: Cli, tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(
        yaml.safe_dump(
            {
                "people": {"alice": {"name": "Alice", "web": "alice"}},
                "agents": {
                    "bot": {
                        "hooks": [
                            {
                                "type": "confirmation_gate",
                                "tools": ["x"],
                                "channel": "web",
                                "approvers": ["alice"],
                            }
                        ]
                    }
                },
            }
        ),
        encoding="utf-8",
    )
    assert cli.ok("config", "check", str(one)) == f"{one}: ok (1 channel, 1 person, 1 agent, 1 gate)\n"
    assert cli.ok("config", "check", str(cli.config_file)).startswith(
        f"{cli.config_file}: ok (2 channels, 3 people"
    )


def test_a_decision_under_another_configuration_version_says_so_and_uses_the_requests_gates(
    cli: Cli,
) -> None:
    rid = cli.request("pay_invoice")
    same = cli("requests", "approve", cli.request("pay_invoice"), "--as", "alice")
    assert same.returncode == 0
    assert "note:" not in same.stderr

    changed = copy.deepcopy(DEFAULT_CONFIG)
    changed["agents"]["finance-bot"]["hooks"][0]["approvers"] = ["bob", "carol"]
    cli.config_file.write_text(yaml.safe_dump(changed, sort_keys=False), encoding="utf-8")
    gated = cli.config.version
    now = parse_config(changed, source=str(cli.config_file)).version
    note = (
        f"note: request {rid} was gated under configuration {gated}; {cli.config_file} is {now}. "
        f"Who may decide it is the request's own gates' (as of {gated}), and an approval must suit "
        "the file's gates too\n"
    )
    carol = cli("requests", "approve", rid, "--as", "carol")
    assert carol.returncode == 1, "carol is an approver in the file, not of this request"
    assert carol.stderr.startswith(note)
    alice = cli("requests", "approve", rid, "--as", "alice")
    assert alice.returncode == 1, "alice was asked, and the file no longer lists her"
    assert alice.stderr.startswith(note)
    assert cli.row(rid).status == "pending"
    bob = cli("requests", "approve", rid, "--as", "bob")
    assert bob.returncode == 0, bob.stderr
    assert bob.stderr == note
    assert cli.row(rid).status == "approved"
