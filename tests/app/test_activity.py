"""A real ``signoff serve`` logs one INFO line for each request created, vote, refused vote,
decision and expiry, and counts every decision it sees once in ``signoff_decisions_total``:
its own at their commit, and those the command line makes in the database."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from signoff.app.requests.activity import line
from tests.app.serving import Served, environment, serve, signoff
from tests.conftest import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DEADLINE_SECONDS = 120.0


def _until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def _decisions(served: Served) -> dict[str, float]:
    text = httpx.get(f"{served.url}/metrics", timeout=10).text
    found = re.findall(r'^signoff_decisions_total\{status="(\w+)"\} (\S+)$', text, re.M)
    return {s: float(n) for s, n in found}


def _lines(served: Served, event: str) -> list[str]:
    """The log's lines of ``event`` (what follows the logger's name)."""
    said = [ln.split("signoff.requests: ", 1) for ln in served.output().splitlines()]
    return [parts[1] for parts in said if len(parts) == 2 and parts[1].startswith(f"{event} id=")]


def test_each_event_is_one_line_and_every_decision_counts_once(tmp_path: Path) -> None:
    env = environment(tmp_path, f"sqlite:///{tmp_path / 'signoff.db'}")
    assert signoff(env, "db", "upgrade").returncode == 0
    key = signoff(env, "keys", "create", "finance-bot").stdout.strip().splitlines()[-1]
    agent = {"Authorization": f"Bearer {key}"}

    with serve(env, tmp_path / "serve.log") as served, httpx.Client(base_url=served.url, timeout=30) as http:

        def ask(tool: str, n: int) -> str:
            call = {"tool_name": tool, "arguments": {"amount": 90000 + n, "api_token": "s3cret"}}
            answer = http.post("/v1/hooks/pre-tool-use", json=call, headers=agent).json()
            assert answer["decision"] == "pending", answer
            return str(answer["request_id"])

        by_api, by_cli = ask("pay_vendor", 1), ask("pay_vendor", 2)
        refused = http.post(
            f"/v1/admin/requests/{by_cli}/decision",
            json={"verdict": "approve", "operator": "carol"},
            headers=ADMIN,
        )
        assert not refused.is_success
        approve = {"verdict": "approve", "operator": "alice"}
        assert http.post(f"/v1/admin/requests/{by_api}/decision", json=approve, headers=ADMIN).is_success
        done = signoff(env, "requests", "approve", by_cli, "--as", "bob")
        assert done.returncode == 0, done.stderr

        _until("both approvals counted", lambda: _decisions(served).get("approved") == 2)
        expiring = ask("quick_pay", 3)
        _until("the expiry counted", lambda: _decisions(served).get("expired") == 1)
        # Read again and again meanwhile, the approvals were still counted once each.
        assert _decisions(served) == {"approved": 2, "expired": 1}

        created = _lines(served, "request created")
        assert sorted(created) == sorted(
            [
                f"request created id={by_api} agent=finance-bot tool=pay_vendor gate=payments",
                f"request created id={by_cli} agent=finance-bot tool=pay_vendor gate=payments",
                f"request created id={expiring} agent=finance-bot tool=quick_pay gate=short",
            ]
        )
        assert _lines(served, "vote") == [
            f"vote id={by_api} agent=finance-bot tool=pay_vendor gate=payments who=Alice verdict=approve"
        ]
        (why,) = _lines(served, "vote refused")
        assert why.startswith(
            f"vote refused id={by_cli} agent=finance-bot tool=pay_vendor gate=payments who=Carol "
            'verdict=approve why="'
        ), why
        assert sorted(_lines(served, "request decided")) == sorted(
            [
                f"request decided id={by_api} agent=finance-bot tool=pay_vendor gate=payments who=Alice "
                "verdict=approved",
                f"request decided id={by_cli} agent=finance-bot tool=pay_vendor gate=payments who=Bob "
                'verdict=approved by="another process"',
            ]
        )
        assert _lines(served, "request expired") == [
            f"request expired id={expiring} agent=finance-bot tool=quick_pay gate=short who=expiry "
            "verdict=expired"
        ]
        assert "s3cret" not in served.output()


def test_a_line_masks_secrets_and_quotes_what_has_spaces() -> None:
    token = "ghp_" + "a1B2" * 9
    text = line("vote", "r1", {"who": f"Bearer {token}", "tool": "pay", "gate": None, "why": "not listed"})
    assert token not in text
    assert text.startswith("vote id=r1 who=")
    assert "[redacted]" in text
    assert text.endswith(' tool=pay why="not listed"')
