"""Chaos: kill -9 the server at random moments, and take the chat API down, and lose nothing.

A real ``signoff serve`` process (on SQLite or PostgreSQL) posts cards through
its Slack channel (slack-sdk) to the fake Slack Web API of the tests, run as a
process of its own (:mod:`bench.fake_slack_server`). The driver creates
``requests`` requests (each with its own idempotency key, re-sent after a
failure as a client would), then decides them: through the operator API, through
signed Slack callbacks (button clicks and the rejection modal), by the agent
cancelling, or by letting a short deadline pass; quorum-2 requests get two
votes, some an approval and then a rejection. Meanwhile the server is killed
with SIGKILL ``kills`` times at random moments and restarted, and at the start
the fake answers every card call with 429 (``Retry-After``) and then 5xx for a
while. At the end:

- no request is lost or doubled: exactly one request per idempotency key;
- each is in exactly one terminal state, the one its votes (or deadline, or
  cancel) call for, with exactly the votes cast;
- while the chat API was down, requests stayed pending (none given up on);
- every card was posted at least once, and the message the server knows was
  last updated to the outcome (the word in the text, and no buttons left);
- every duplicate post of a card is explained by a kill between the two posts,
  and there are at most kills x the dispatcher's concurrency of them;
- an approval that gave a grant (operator API or the card's grant button) has
  exactly one grant, and no other request has any: a grant exists exactly when
  its approval committed;
- an approval with changes (operator API ``arguments`` or the Slack edit modal)
  holds the approved arguments it was given, and no other request holds any:
  they exist exactly when that approval committed;
- no delivery is left pending or failed; the audit chain verifies
  (``signoff audit verify``).

    python -m bench.chaos --db sqlite|postgres [--requests 300] [--kills 10] [--seed N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import select

from bench._server import ROOT, drop_pg_database, free_port, fresh_pg_database
from tests.channels.fake_slack import BOT_TOKEN, CHANNEL
from tests.channels.slack_support import SECRET, button_payload, form_body, signed, submission_payload

SLACK = "ops-slack"
DISPATCH_CONCURRENCY = 8  # signoff.app.outbox.Dispatcher's default
LEASE_SECONDS = 3.0
OUTAGE_429_SECONDS = 1.5
OUTAGE_5XX_SECONDS = 1.5
OUTAGE_MAX_SECONDS = 30.0  # how long an outage may wait for a card call to refuse
SHORT_TIMEOUT_SECONDS = 4
WORDS = {"approved": "Approved", "rejected": "Rejected", "expired": "Expired", "cancelled": "Cancelled"}

CONFIG = """
channels:
  {slack}:
    type: slack
    bot_token: {bot_token}
    signing_secret: {secret}
    channel: {channel}
    base_url: {base_url}
people:
  alice: {{name: Alice, web: alice, slack: W0ALICE}}
  bob: {{name: Bob, web: bob, slack: W0BOB}}
agents:
  chaos-agent:
    hooks:
      - type: confirmation_gate
        name: one
        tools: ["pay_*"]
        channel: {slack}
        approvers: [alice, bob]
        timeout: 30m
      - type: confirmation_gate
        name: two
        tools: ["wire_*"]
        channel: {slack}
        approvers: [alice, bob]
        quorum: 2
        timeout: 30m
      - type: confirmation_gate
        name: short
        tools: ["quick_*"]
        channel: {slack}
        approvers: [alice, bob]
        timeout: {short}s
      - type: confirmation_gate
        name: granting
        tools: ["grant_*"]
        channel: {slack}
        approvers: [alice, bob]
        timeout: 30m
        grants: [{{scope: agent, for: 1h}}]
      - type: confirmation_gate
        name: editing
        tools: ["edit_*"]
        channel: {slack}
        approvers: [alice, bob]
        timeout: 30m
        editable: [amount]
"""
GRANT = {"scope": "agent", "seconds": 3600, "same": []}

# action → (tool prefix, expected status, approvals, rejections)
ACTIONS: dict[str, tuple[str, str, int, int]] = {
    "api-approve": ("pay", "approved", 1, 0),
    "slack-approve": ("pay", "approved", 1, 0),
    "api-reject": ("pay", "rejected", 0, 1),
    "slack-reject": ("pay", "rejected", 0, 1),
    "cancel": ("pay", "cancelled", 0, 0),
    "two-approvals": ("wire", "approved", 2, 0),
    "approve-then-reject": ("wire", "rejected", 1, 1),
    "expire": ("quick", "expired", 0, 0),
    "api-grant": ("grant", "approved", 1, 0),
    "slack-grant": ("grant", "approved", 1, 0),
    "api-edit": ("edit", "approved", 1, 0),
    "slack-edit": ("edit", "approved", 1, 0),
}
GRANTING = frozenset({"api-grant", "slack-grant"})
"""Actions whose approval gives a grant."""
EDITING = frozenset({"api-edit", "slack-edit"})
"""Actions whose approval changes the call's ``amount`` (to :func:`edited_amount`)."""
WEIGHTS = {
    "api-approve": 3,
    "slack-approve": 3,
    "api-reject": 2,
    "slack-reject": 2,
    "cancel": 1,
    "two-approvals": 2,
    "approve-then-reject": 1,
    "expire": 1,
    "api-grant": 1,
    "slack-grant": 1,
    "api-edit": 1,
    "slack-edit": 1,
}


@dataclass
class Plan:
    n: int
    action: str
    key: str
    rid: str | None = None

    @property
    def tool(self) -> str:
        return f"{ACTIONS[self.action][0]}_chaos_{self.n}"

    @property
    def expected(self) -> str:
        return ACTIONS[self.action][1]


@dataclass
class Report:
    db: str
    requests: int
    kills: list[float] = field(default_factory=list)
    posts: int = 0
    duplicate_posts: int = 0
    retried_deliveries: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        state = "ok" if self.ok else f"{len(self.problems)} problems"
        return (
            f"chaos {self.db}: {self.requests} requests, {len(self.kills)} kills, {self.posts} card posts "
            f"({self.duplicate_posts} duplicates), {self.retried_deliveries} deliveries retried after the "
            f"outage: {state} in {self.seconds:.1f} s"
        )


class Processes:
    """The fake Slack and the server (killed and restarted at will)."""

    def __init__(self, tmp: Path, db: str) -> None:
        self.tmp = tmp
        self.db = db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[bytes] | None = None
        self.fake: subprocess.Popen[bytes] | None = None
        self.fake_url = ""
        self.env: dict[str, str] = {}
        self.kills: list[float] = []
        self.starts = 0
        self._logs: list[Any] = []

    def _log(self, name: str) -> Any:
        f = (self.tmp / name).open("wb")
        self._logs.append(f)
        return f

    def start_fake(self) -> None:
        port_file = self.tmp / "fake.port"
        self.fake = subprocess.Popen(
            [sys.executable, "-m", "bench.fake_slack_server", "--port-file", str(port_file)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self._log("fake.log"),
        )
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                self.fake_url = f"http://127.0.0.1:{port_file.read_text().strip()}"
                return
            time.sleep(0.05)
        raise RuntimeError("the fake Slack did not start")

    def start_server(self) -> None:
        self.starts += 1
        log = self._log(f"server-{self.starts}.log")
        self.server = subprocess.Popen(
            [sys.executable, "-m", "signoff.app.cli", "serve", "--port", str(self.port), "--no-migrate"],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    async def ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as c:
            while time.monotonic() < deadline:
                assert self.server is not None
                if self.server.poll() is not None:
                    raise RuntimeError(f"server exited with {self.server.returncode}; see {self.tmp}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(f"{self.url}/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError("server not ready in time")

    def kill9(self) -> None:
        assert self.server is not None
        self.server.send_signal(signal.SIGKILL)
        self.server.wait(10)
        self.kills.append(time.time())

    def stop(self) -> None:
        for proc in (self.server, self.fake):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for f in self._logs:
            f.close()
        self._logs.clear()


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    accept: tuple[int, ...] = (200,),
    timeout: float = 90,
    **kw: Any,
) -> httpx.Response:
    """Send until the server gives an answer in ``accept`` (a crashed server is retried)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            r = await client.request(method, url, **kw)
            if r.status_code in accept:
                return r
            if r.status_code < 500:
                raise RuntimeError(f"{method} {url}: HTTP {r.status_code} {r.text[:300]}")
            last = f"HTTP {r.status_code}"
        except httpx.TransportError as exc:
            last = type(exc).__name__
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{method} {url}: no answer in {timeout} s (last: {last})")


def slack_click(rid: str, user: str, n: int, *, grant: bool = False) -> tuple[bytes, dict[str, str]]:
    if grant:
        value = json.dumps({"request_id": rid, "grant": GRANT}, separators=(",", ":"))
        payload = button_payload("signoff_grant.0", request_id=value)
    else:
        payload = button_payload("signoff_approve", request_id=rid)
    payload["user"]["id"] = user
    payload["actions"][0]["action_ts"] = f"{time.time():.6f}{n}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()), secret=SECRET)


def edited_amount(n: int) -> int:
    """The amount an approval with changes gives request ``n`` (it asked for ``1000 + n``)."""
    return 500 + n


def slack_edit(rid: str, user: str, n: int) -> tuple[bytes, dict[str, str]]:
    """The edit modal's ``view_submission``, the amount changed (as the modal the card's "Edit
    and approve" opens would send it)."""
    payload = submission_payload(None, request_id=rid)
    view = payload["view"]
    view["id"] = f"V0EDIT{n}{secrets.token_hex(3)}"
    view["callback_id"] = "signoff_edit_approve"
    view["private_metadata"] = json.dumps(
        {"request_id": rid, "channel_id": CHANNEL, "fields": [["amount", "json"]]}
    )
    view["state"]["values"] = {
        "signoff_edit.0": {"value": {"type": "plain_text_input", "value": str(edited_amount(n))}}
    }
    payload["user"]["id"] = user
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()), secret=SECRET)


def slack_reject(rid: str, user: str, n: int) -> tuple[bytes, dict[str, str]]:
    payload = submission_payload(f"chaos says no ({n})", request_id=rid)
    payload["user"]["id"] = user
    payload["view"]["id"] = f"V0CHAOS{n}{secrets.token_hex(3)}"
    body = form_body(payload)
    return body, signed(body, timestamp=int(time.time()), secret=SECRET)


async def decide(client: httpx.AsyncClient, plan: Plan, agent: dict[str, str], admin: dict[str, str]) -> None:
    rid = plan.rid
    assert rid is not None
    api = f"/v1/admin/requests/{rid}/decision"
    slack = f"/callbacks/slack/{SLACK}"

    async def via_api(verdict: str, who: str, grant: bool = False, edit: bool = False) -> None:
        body: dict[str, Any] = {"verdict": verdict, "operator": who}
        if verdict == "reject":
            body["reason"] = "chaos says no"
        if grant:
            body["grant"] = {"scope": "agent", "for": "1h"}
        if edit:
            body["arguments"] = {"amount": edited_amount(plan.n)}
        # 409: a try before a crash got through, and this one is refused as a second vote.
        await call(client, "POST", api, json=body, headers=admin, accept=(200, 409))

    async def via_slack(verdict: str, user: str) -> None:
        body, headers = (slack_click if verdict == "approve" else slack_reject)(rid, user, plan.n)
        await call(client, "POST", slack, content=body, headers=headers)

    match plan.action:
        case "api-approve":
            await via_api("approve", "alice")
        case "slack-approve":
            await via_slack("approve", "W0BOB")
        case "api-reject":
            await via_api("reject", "bob")
        case "slack-reject":
            await via_slack("reject", "W0ALICE")
        case "cancel":
            await call(client, "POST", f"/v1/requests/{rid}/cancel", headers=agent, accept=(200, 409))
        case "two-approvals":
            await via_api("approve", "alice")
            await via_slack("approve", "W0BOB")
        case "approve-then-reject":
            await via_slack("approve", "W0ALICE")
            await via_api("reject", "bob")
        case "expire":
            pass
        case "api-grant":
            await via_api("approve", "alice", grant=True)
        case "slack-grant":
            body, headers = slack_click(rid, "W0BOB", plan.n, grant=True)
            await call(client, "POST", slack, content=body, headers=headers)
        case "api-edit":
            await via_api("approve", "bob", edit=True)
        case "slack-edit":
            body, headers = slack_edit(rid, "W0ALICE", plan.n)
            await call(client, "POST", slack, content=body, headers=headers)


async def workers(n: int, items: list[Plan], work: Any) -> None:
    queue = list(items)

    async def worker() -> None:
        while queue:
            await work(queue.pop(0))

    await asyncio.gather(*(worker() for _ in range(n)))


@contextlib.asynccontextmanager
async def database(db: str, tmp: Path) -> AsyncIterator[str]:
    name = f"signoff_chaos_pg_{os.getpid()}"
    url = f"sqlite:///{tmp}/chaos.db" if db == "sqlite" else fresh_pg_database(name)
    try:
        yield url
    finally:
        if db == "postgres":
            drop_pg_database(name)


async def snapshot(url: str) -> dict[str, Any]:
    from signoff.app.db import create_engine, sessionmaker
    from signoff.app.models import ConfirmationRequest, Delivery, Grant, Vote

    engine = create_engine(url, readonly=True)
    try:
        async with sessionmaker(engine)() as s:
            requests = list((await s.exec(select(ConfirmationRequest))).all())
            votes = list((await s.exec(select(Vote))).all())
            deliveries = list((await s.exec(select(Delivery))).all())
            grants = list((await s.exec(select(Grant))).all())
    finally:
        await engine.dispose()
    return {"requests": requests, "votes": votes, "deliveries": deliveries, "grants": grants}


async def run(
    db: str,
    *,
    requests: int = 300,
    kills: int = 10,
    seed: int | None = None,
    keep: Path | None = None,
    verbose: bool = True,
) -> Report:
    seed = seed if seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    report = Report(db, requests)
    started = time.monotonic()

    def say(msg: str) -> None:
        if verbose:
            print(f"[chaos {db} {time.monotonic() - started:5.1f}s] {msg}", file=sys.stderr, flush=True)

    say(f"seed {seed}")
    with tempfile.TemporaryDirectory(prefix="signoff-chaos-") as tmp_name:
        tmp = Path(keep or tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        procs = Processes(tmp, db)
        try:
            async with database(db, tmp) as url:
                procs.start_fake()
                cfg = tmp / "signoff.yaml"
                cfg.write_text(
                    CONFIG.format(
                        slack=SLACK,
                        bot_token=BOT_TOKEN,
                        secret=SECRET,
                        channel=CHANNEL,
                        base_url=f"{procs.fake_url}/api/",
                        short=SHORT_TIMEOUT_SECONDS,
                    )
                )
                admin = secrets.token_urlsafe(24)
                procs.env = {
                    **{k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")},
                    "SIGNOFF_CONFIG": str(cfg),
                    "SIGNOFF_DATABASE_URL": url,
                    "SIGNOFF_ADMIN_TOKEN": admin,
                    "SIGNOFF_OUTBOX_LEASE_SECONDS": str(LEASE_SECONDS),
                    "SIGNOFF_LOG_LEVEL": "WARNING",
                }
                cli = [sys.executable, "-m", "signoff.app.cli"]
                subprocess.run(
                    [*cli, "db", "upgrade"], env=procs.env, cwd=ROOT, check=True, capture_output=True
                )
                out = subprocess.run(
                    [*cli, "keys", "create", "chaos-agent"],
                    env=procs.env,
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                key = out.stdout.strip().splitlines()[-1]
                plans = await drive(procs, report, rng, key, admin, requests, kills, say)
                say("settling, then verifying")
                await verify(procs, report, url, plans)
                report.kills = list(procs.kills)
        finally:
            procs.stop()
    report.seconds = time.monotonic() - started
    say(report.summary())
    return report


async def drive(
    procs: Processes,
    report: Report,
    rng: random.Random,
    key: str,
    admin: str,
    count: int,
    kills: int,
    say: Any,
) -> list[Plan]:
    agent_h = {"Authorization": f"Bearer {key}"}
    admin_h = {"Authorization": f"Bearer {admin}"}
    actions = list(WEIGHTS)
    plans = [
        Plan(
            n,
            rng.choices(actions, weights=[WEIGHTS[a] for a in actions])[0],
            f"chaos-{n}-{secrets.token_hex(4)}",
        )
        for n in range(count)
    ]
    outage_pending: list[str] = []
    procs.start_server()
    await procs.ready()

    async def killer() -> None:
        for k in range(kills):
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            procs.kill9()
            say(f"kill -9 #{k + 1}")
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            procs.start_server()
            await procs.ready()

    async with httpx.AsyncClient(base_url=procs.url, timeout=10) as client:
        control = httpx.AsyncClient(base_url=procs.fake_url, timeout=5)
        kill_task = asyncio.create_task(killer())

        async def down(mode: str, status: int, seconds: float) -> None:
            # Down for ``seconds``, and on until a card call was refused: on a loaded machine
            # a restart can take the whole window, and an outage nobody met tests nothing.
            since = time.time()
            await control.post("/control/outage", json={"mode": mode, "retry_after": 1})
            await asyncio.sleep(seconds)
            deadline = time.monotonic() + OUTAGE_MAX_SECONDS
            while time.monotonic() < deadline:
                log = (await control.get("/control/log")).json()
                if any(e["t"] >= since and e.get("status") == status for e in log):
                    return
                await asyncio.sleep(0.2)

        async def outage() -> None:
            say("chat API down: 429 with Retry-After")
            await down("429", 429, OUTAGE_429_SECONDS)
            say("chat API down: 5xx")
            await down("5xx", 503, OUTAGE_5XX_SECONDS)
            await control.post("/control/outage", json={"mode": "off"})
            say("chat API back")

        outage_task = asyncio.create_task(outage())

        async def create(plan: Plan) -> None:
            body = {
                "tool_name": plan.tool,
                "arguments": {"n": plan.n, "amount": 1000 + plan.n},
                "session_id": "chaos",
                "idempotency_key": plan.key,
            }
            r = await call(client, "POST", "/v1/hooks/pre-tool-use", json=body, headers=agent_h)
            answer = r.json()
            if answer.get("request_id") is None:
                raise RuntimeError(f"no request for {plan.key}: {answer}")
            plan.rid = answer["request_id"]
            if not outage_task.done():
                outage_pending.append(plan.rid)

        await workers(8, plans, create)
        say(f"{len(plans)} requests created")
        await outage_task
        # While the chat API was down the requests waited: none was given up on.
        states = await asyncio.gather(
            *(call(client, "GET", f"/v1/requests/{rid}", headers=agent_h) for rid in outage_pending)
        )
        report.problems += [
            f"{s.json()['id']} is {s.json()['status']} right after the outage"
            for s in states
            if s.json()["status"] not in ("pending", "expired")
        ]
        await workers(8, plans, lambda p: decide(client, p, agent_h, admin_h))
        say("decisions sent")
        await kill_task
        await control.aclose()
    return plans


async def settle(url: str, timeout: float) -> dict[str, Any]:
    """Wait until every request is terminal and no delivery is pending."""
    deadline = time.monotonic() + timeout
    snap = await snapshot(url)
    while time.monotonic() < deadline:
        snap = await snapshot(url)
        open_requests = [r for r in snap["requests"] if r.status == "pending"]
        open_deliveries = [d for d in snap["deliveries"] if d.status == "pending"]
        if not open_requests and not open_deliveries:
            return snap
        await asyncio.sleep(0.25)
    return snap


async def verify(procs: Processes, report: Report, url: str, plans: list[Plan]) -> None:
    from signoff.app.requests.eligibility import gates_of

    # The last server started runs on (not killed) until everything has settled.
    snap = await settle(url, timeout=LEASE_SECONDS + SHORT_TIMEOUT_SECONDS + 40)
    async with httpx.AsyncClient(base_url=procs.fake_url, timeout=10) as control:
        log: list[dict[str, Any]] = (await control.get("/control/log")).json()
    assert procs.server is not None
    procs.server.terminate()
    procs.server.wait(15)
    problems = report.problems

    by_key = Counter(r.idempotency_key for r in snap["requests"])
    requests = {r.id: r for r in snap["requests"]}
    if len(snap["requests"]) != len(plans):
        problems.append(f"{len(snap['requests'])} requests in the database for {len(plans)} calls")
    problems += [f"idempotency key {k} has {n} requests" for k, n in by_key.items() if n != 1]
    votes: dict[str, list[Any]] = defaultdict(list)
    for v in snap["votes"]:
        votes[v.request_id].append(v)
    grants = Counter(g.request_id for g in snap["grants"])
    for plan in plans:
        req = requests.get(plan.rid or "")
        if req is None:
            problems.append(f"request {plan.rid} ({plan.key}) is lost")
            continue
        _, expected, approvals, rejections = ACTIONS[plan.action]
        got = Counter(v.verdict for v in votes[req.id])
        if req.status != expected:
            problems.append(f"{req.id} ({plan.action}) is {req.status}, expected {expected}")
        if (got["approve"], got["reject"]) != (approvals, rejections):
            problems.append(
                f"{req.id} ({plan.action}) has votes {dict(got)}, expected {approvals}/{rejections}"
            )
        quorum = gates_of(req)[0].quorum
        consistent = {
            "approved": got["approve"] >= quorum and got["reject"] == 0,
            "rejected": got["reject"] == 1,
            "expired": got["reject"] == 0 and got["approve"] < quorum,
            "cancelled": got["reject"] == 0 and got["approve"] < quorum,
        }.get(str(req.status), False)
        if not consistent:
            problems.append(f"{req.id} is {req.status} with votes {dict(got)} (quorum {quorum})")
        given = 1 if plan.action in GRANTING and req.status == "approved" else 0
        if grants[req.id] != given:
            problems.append(
                f"{req.id} ({plan.action}, {req.status}) has {grants[req.id]} grants, expected {given}"
            )
        edited = plan.action in EDITING and req.status == "approved"
        want = {**req.arguments, "amount": edited_amount(plan.n)} if edited else None
        if req.approved_arguments != want:
            problems.append(
                f"{req.id} ({plan.action}, {req.status}) holds approved arguments "
                f"{req.approved_arguments}, expected {want}"
            )

    deliveries = snap["deliveries"]
    problems += [
        f"delivery {d.id} ({d.kind} {d.request_id}) is still {d.status}"
        for d in deliveries
        if d.status != "sent"
    ]
    report.retried_deliveries = sum(1 for d in deliveries if d.attempts > 1)
    if report.retried_deliveries == 0:
        problems.append("no delivery was retried: the outage did not bite")
    posts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    updates: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in log:
        if e.get("status") != 200 or not e.get("ok"):
            continue
        if e["method"] == "chat.postMessage":
            rid = next((r for r in requests if r in e.get("blob", "")), None)
            if rid is not None:
                posts[rid].append(e)
        elif e["method"] == "chat.update":
            updates[str(e.get("ts"))].append(e)
    report.posts = sum(len(p) for p in posts.values())
    post_ref = {d.request_id: (d.message_ref or {}).get("ts") for d in deliveries if d.kind == "post"}
    for rid, req in requests.items():
        mine = posts.get(rid, [])
        if not mine:
            problems.append(f"{rid}: no card was posted")
            continue
        for earlier, later in itertools.pairwise(mine):
            report.duplicate_posts += 1
            if not any(earlier["t"] < k < later["t"] for k in procs.kills):
                problems.append(
                    f"{rid}: posted twice ({earlier['ts']}, {later['ts']}) with no kill in between"
                )
        ts = post_ref.get(rid)
        if ts not in {p["ts"] for p in mine}:
            problems.append(f"{rid}: the server's message {ts} is not one it posted")
            continue
        last = updates.get(str(ts), [])
        final = last[-1] if last else mine[-1]
        word = WORDS.get(str(req.status), "?")
        if final.get("buttons"):
            problems.append(f"{rid}: its card {ts} still has buttons though the request is {req.status}")
        if not str(final.get("text", "")).startswith(word):
            problems.append(f"{rid}: its card {ts} says {final.get('text', '')[:60]!r}, not {word}")
    if report.duplicate_posts > len(procs.kills) * DISPATCH_CONCURRENCY:
        problems.append(f"{report.duplicate_posts} duplicate posts for {len(procs.kills)} kills")
    audit = subprocess.run(
        [sys.executable, "-m", "signoff.app.cli", "audit", "verify"],
        env=procs.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if audit.returncode != 0:
        problems.append(f"signoff audit verify: {audit.stderr.strip() or audit.stdout.strip()}")


def main() -> None:
    p = argparse.ArgumentParser(description="kill -9 and chat outages against a real server")
    p.add_argument("--db", choices=["sqlite", "postgres"], action="append")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--seed", type=int)
    p.add_argument("--keep", type=Path, help="keep the logs and the SQLite file in this folder")
    args = p.parse_args()
    failed = False
    for db in args.db or ["sqlite", "postgres"]:
        report = asyncio.run(
            run(db, requests=args.requests, kills=args.kills, seed=args.seed, keep=args.keep)
        )
        print(report.summary())
        for problem in report.problems[:50]:
            print("  ", problem)
        failed |= not report.ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
