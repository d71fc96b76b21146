"""Decision-to-waiter latency through a real server process.

Starts ``signoff serve`` on a scratch database, parks a long-poll
(``GET /v1/requests/{id}/wait``) on a pending request, approves it through the
operator API from a second connection, and takes three clocks (wall clock,
the same on both sides of loopback). A Slack click is sent once the card is posted (the fake
Slack has it and Signoff has had a moment to record where), as a person's click comes after
the card shows:

- **send → return**: from sending the decision to the waiter's complete answer;
  an upper bound, it includes the decision's own HTTP round trip and vote;
- **commit → return**: from the ``approved`` audit event's timestamp, taken
  inside the deciding transaction just before it commits, to the waiter's
  answer: the wake-up itself plus the waiter's re-read and response (still an
  upper bound on commit → return, by the few statements between the audit
  event and the commit);
- the decision's round trip, for reference.

    python -m bench.wake_latency [--db sqlite|postgres] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime

import httpx

from bench._server import SLACK_SECRET, Signoff, config_with_slack, fake_slack, running_server


@dataclass
class Samples:
    send_to_return: list[float]
    commit_to_return: list[float]
    decision_rtt: list[float]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if q == 50:
        return statistics.median(s)
    return s[min(len(s) - 1, int(len(s) * q / 100))]


def slack_click(rid: str) -> tuple[bytes, dict[str, str]]:
    from tests.channels.slack_support import button_payload, form_body, signed

    payload = button_payload("signoff_approve", request_id=rid)
    payload["user"]["id"] = "W0ALICE"
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()), secret=SLACK_SECRET)


CARD_RECORDED = 0.03
"""Seconds a click waits after the fake Slack got the card: Signoff records where it was posted."""


async def card_posted(client: httpx.AsyncClient, slack: str, rid: str, seen: int) -> int:
    """Wait until the fake Slack at ``slack`` (its ``base_url``) got request ``rid``'s card, from
    its log's ``seen``-th call on; returns how many calls the log now holds."""
    log = slack.removesuffix("/api/") + "/control/log"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        calls = (await client.get(log, params={"since": seen})).json()
        seen += len(calls)
        if any(c["method"] == "chat.postMessage" and rid in c.get("buttons", ()) for c in calls):
            await asyncio.sleep(CARD_RECORDED)
            return seen
        await asyncio.sleep(0.005)
    raise RuntimeError(f"the card of {rid} was not posted within 10 s")


async def measure(
    s: Signoff, rounds: int, *, verbose: bool = True, via: str = "api", slack: str | None = None
) -> Samples:
    """``via``: ``api`` (the operator API) or ``slack`` (a signed Slack button click; the server
    needs :func:`bench._server.config_with_slack` with the fake Slack ``slack``, whose log tells
    when the card is posted)."""
    if via == "slack" and slack is None:
        raise ValueError("a Slack click needs the fake Slack's base_url (slack=...)")
    out = Samples([], [], [])
    seen = 0
    async with (
        httpx.AsyncClient(base_url=s.url, timeout=30, headers=s.agent_headers) as agent,
        httpx.AsyncClient(base_url=s.url, timeout=30, headers=s.admin_headers) as ops,
        httpx.AsyncClient(timeout=30) as fake,
    ):
        for i in range(rounds):
            tool = "slack_x" if via == "slack" else "pay_x"
            r = await agent.post(
                "/v1/hooks/pre-tool-use", json={"tool_name": tool, "arguments": {"amount": 10**6}}
            )
            rid = r.json()["request_id"]
            returned = 0.0

            async def wait(rid: str = rid) -> httpx.Response:
                nonlocal returned
                w = await agent.get(f"/v1/requests/{rid}/wait", params={"timeout": 20})
                returned = time.time()
                return w

            waiter = asyncio.create_task(wait())
            await asyncio.sleep(0.02)  # let the long-poll park
            if via == "slack":
                assert slack is not None
                seen = await card_posted(fake, slack, rid, seen)
                body, headers = slack_click(rid)
                sent = time.time()
                d = await ops.post("/callbacks/slack/bench-slack", content=body, headers=headers)
            else:
                sent = time.time()
                d = await ops.post(
                    f"/v1/admin/requests/{rid}/decision", json={"verdict": "approve", "operator": "alice"}
                )
            answered = time.time()
            d.raise_for_status()
            w = await waiter
            if w.status_code != 200 or w.json()["status"] != "approved":
                raise RuntimeError(f"waiter got {w.status_code}: {w.text}")
            trail = d.json() if via == "api" else (await ops.get(f"/v1/admin/requests/{rid}")).json()
            [event] = [e for e in trail["audit"] if e["action"] == "approved"]
            committed = datetime.fromisoformat(event["created_at"]).timestamp()
            out.send_to_return.append((returned - sent) * 1000)
            out.commit_to_return.append((returned - committed) * 1000)
            out.decision_rtt.append((answered - sent) * 1000)
            if verbose and (i + 1) % 100 == 0:
                print(f"  wake latency {i + 1}/{rounds}", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--via", choices=["api", "slack"], default="slack")
    args = p.parse_args()
    with fake_slack() as slack, running_server(args.db, config=config_with_slack(slack)) as s:
        samples = asyncio.run(measure(s, args.rounds, via=args.via, slack=slack))
    for name in ("send_to_return", "commit_to_return", "decision_rtt"):
        v = getattr(samples, name)
        print(f"{name} ({args.db}, {len(v)} rounds): p50 {pct(v, 50):.1f} ms, p99 {pct(v, 99):.1f} ms")


if __name__ == "__main__":
    main()
