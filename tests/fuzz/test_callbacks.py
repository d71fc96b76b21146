"""The callback endpoints under fire: malformed bodies, headers and signatures (hypothesis).

A real ``signoff serve`` process (SQLite, then PostgreSQL) with a Slack and a
Feishu channel holds two pending requests, one per channel. Every generated
callback — random bytes, random headers, or a well-formed click on one of those
requests with its authentication broken (no signature, a wrong secret, a stale
or malformed timestamp, a signed body changed afterwards, an unencrypted
downgrade, a body over the limit) — must get a 4xx. At the end neither request
has a vote and both are still pending, and the refusals were audited.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench._server import Signoff, signoff_database
from tests.channels.feishu_support import ENCRYPT_KEY, TOKEN, card_action, encrypt, sign
from tests.channels.slack_support import SECRET, button_payload, form_body, signed, submission_payload

EXAMPLES = 120
SLACK = "/callbacks/slack/ops-slack"
FEISHU = "/callbacks/feishu/finance"

CONFIG = f"""
channels:
  ops-slack:
    type: slack
    bot_token: xoxb-test-bot-token
    signing_secret: {SECRET}
    channel: C0SIGNOFF
    base_url: http://127.0.0.1:9/api/
  finance:
    type: feishu
    app_id: cli_fuzz
    app_secret: fuzz-app-secret
    verification_token: {TOKEN}
    encrypt_key: {ENCRYPT_KEY}
    chat_id: oc_approvals
    base_url: http://127.0.0.1:9
people:
  alice: {{name: Alice, web: alice, slack: W0ALICE, feishu: ou_alice}}
agents:
  bench-agent:
    hooks:
      - type: confirmation_gate
        tools: ["pay_*"]
        channel: ops-slack
        approvers: [alice]
        timeout: 30m
      - type: confirmation_gate
        tools: ["wire_*"]
        channel: finance
        approvers: [alice]
        timeout: 30m
"""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def live(request: pytest.FixtureRequest) -> Iterator[tuple[Signoff, dict[str, str]]]:
    """A running server and its two pending requests: {"slack": id, "feishu": id}."""
    with signoff_database(request.param, config=CONFIG, name="signoff_fuzz_callbacks_pg") as s:
        s.start()
        ids: dict[str, str] = {}
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for channel, tool in (("slack", "pay_fuzz"), ("feishu", "wire_fuzz")):
                r = c.post("/v1/hooks/pre-tool-use", json={"tool_name": tool}, headers=s.agent_headers)
                ids[channel] = r.json()["request_id"]
        yield s, ids


# --- what gets sent -------------------------------------------------------------------------

header_names = st.sampled_from(
    [
        "X-Slack-Request-Timestamp",
        "X-Slack-Signature",
        "X-Lark-Request-Timestamp",
        "X-Lark-Request-Nonce",
        "X-Lark-Signature",
        "Content-Type",
        "X-Slack-Retry-Num",
        "X-Anything",
    ]
)
# Printable ASCII without surrounding blanks: what an HTTP client can send at all.
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80).map(str.strip)
random_headers = st.dictionaries(header_names, header_values, max_size=6)
random_bodies = st.one_of(
    st.binary(max_size=2048),
    st.text(max_size=500).map(str.encode),
    st.dictionaries(st.text(max_size=12), st.text(max_size=20), max_size=5).map(
        lambda d: json.dumps(d).encode()
    ),
    st.just(b"payload=%7B%22type%22%3A%22block_actions%22%7D"),
)


def slack_click(rid: str, verdict: str) -> bytes:
    if verdict == "approve":
        payload = button_payload("signoff_approve", request_id=rid)
    else:
        payload = submission_payload("fuzzed", request_id=rid)
    payload["user"]["id"] = "W0ALICE"
    return form_body(payload)


def broken_slack(rid: str, verdict: str, how: str, now: int) -> tuple[bytes, dict[str, str]]:
    body = slack_click(rid, verdict)
    if how == "unsigned":
        return body, {"Content-Type": "application/x-www-form-urlencoded"}
    if how == "wrong-secret":
        return body, signed(body, timestamp=now, secret="not-the-secret")
    if how == "stale":
        return body, signed(body, timestamp=now - 6 * 60)
    if how == "future":
        return body, signed(body, timestamp=now + 6 * 60)
    if how == "changed-after-signing":
        headers = signed(body, timestamp=now)
        return body.replace(b"W0ALICE", b"W0MALLO"), headers
    if how == "bad-timestamp":
        headers = signed(body, timestamp=now)
        headers["X-Slack-Request-Timestamp"] = f"{now}.5"
        return body, headers
    if how == "v1-signature":
        headers = signed(body, timestamp=now)
        headers["X-Slack-Signature"] = "v1=" + headers["X-Slack-Signature"][3:]
        return body, headers
    raise AssertionError(how)


def broken_feishu(rid: str, verdict: str, how: str, now: int) -> tuple[bytes, dict[str, str]]:
    payload = json.dumps(card_action(request_id=rid, verdict=verdict, event_id=f"ev-{how}-{now}")).encode()
    body = json.dumps({"encrypt": encrypt(payload, ENCRYPT_KEY)}).encode()
    ts, nonce = str(now), "fuzz-nonce"

    def headers(sig: str, stamp: str = ts) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "X-Lark-Request-Timestamp": stamp,
            "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": sig,
        }

    if how == "unsigned":
        return body, {"Content-Type": "application/json"}
    if how == "wrong-secret":
        return body, headers(sign(ts, nonce, "not-the-key", body))
    if how == "stale":
        old = str(now - 6 * 60)
        return body, headers(sign(old, nonce, ENCRYPT_KEY, body), old)
    if how == "future":
        ahead = str(now + 6 * 60)
        return body, headers(sign(ahead, nonce, ENCRYPT_KEY, body), ahead)
    if how == "changed-after-signing":
        other = json.dumps(
            {"encrypt": encrypt(payload.replace(b"approve", b"reject!"), ENCRYPT_KEY)}
        ).encode()
        return other, headers(sign(ts, nonce, ENCRYPT_KEY, body))
    if how == "bad-timestamp":
        return body, headers(sign("soon", nonce, ENCRYPT_KEY, body), "soon")
    if how == "v1-signature":  # plaintext, unencrypted: a downgrade, with the token inside
        return payload, headers(sign(ts, nonce, ENCRYPT_KEY, payload))
    raise AssertionError(how)


HOW = [
    "unsigned",
    "wrong-secret",
    "stale",
    "future",
    "changed-after-signing",
    "bad-timestamp",
    "v1-signature",
]


@st.composite
def callbacks(draw: st.DrawFn, ids: dict[str, str]) -> tuple[str, bytes, dict[str, str]]:
    kind = draw(st.sampled_from(["slack-broken", "feishu-broken", "random", "oversized", "unknown-channel"]))
    now = int(time.time())
    if kind == "slack-broken":
        body, headers = broken_slack(
            ids["slack"], draw(st.sampled_from(["approve", "reject"])), draw(st.sampled_from(HOW)), now
        )
        return SLACK, body, headers
    if kind == "feishu-broken":
        body, headers = broken_feishu(
            ids["feishu"], draw(st.sampled_from(["approve", "reject"])), draw(st.sampled_from(HOW)), now
        )
        return FEISHU, body, headers
    if kind == "oversized":
        return draw(st.sampled_from([SLACK, FEISHU])), b"x" * (1024 * 1024 + 10), {}
    path = SLACK if kind == "random" and draw(st.booleans()) else FEISHU
    if kind == "unknown-channel":
        path = draw(
            st.sampled_from(["/callbacks/slack/finance", "/callbacks/feishu/nope", "/callbacks/web/x"])
        )
    return path, draw(random_bodies), draw(random_headers)


@pytest.mark.postgres
def test_broken_callbacks_get_a_4xx_and_change_nothing(live: tuple[Signoff, dict[str, str]]) -> None:
    server, ids = live
    answers: list[tuple[str, int]] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = refusals_counted(client.get("/metrics").text)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def send(data: st.DataObject) -> None:
            path, body, headers = data.draw(callbacks(ids))
            status = client.post(path, content=body, headers=headers).status_code
            answers.append((path, status))
            assert 400 <= status < 500, f"{path} answered {status} to {body[:200]!r} with {headers}"

        send()

        assert len(answers) >= EXAMPLES // 2
        for rid in ids.values():
            state = client.get(f"/v1/admin/requests/{rid}", headers=server.admin_headers).json()
            assert state["status"] == "pending", state
            assert state["votes"] == [], state
        rejected = client.get("/v1/admin/audit", params={"limit": 1000}, headers=server.admin_headers).json()
        counted = refusals_counted(client.get("/metrics").text) - before
    # Every refusal a channel made is counted; a 413 may be the server's body limit's instead.
    refused = [status for path, status in answers if path in (SLACK, FEISHU)]
    assert sum(1 for s in refused if s != 413) <= counted <= len(refused)
    # The first of each kind is on record at once, the rest in each window's tally.
    assert any(e["action"] == "callback_rejected" for e in rejected)


def refusals_counted(metrics: str) -> float:
    """Refused callbacks counted on ``/metrics``, all channels and reasons."""
    samples = re.findall(r"^signoff_callback_rejections_total\{.*\} (\S+)$", metrics, re.M)
    return sum(float(v) for v in samples)
