from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from signoff.hooks._contract import Decision
from signoff.hooks._gate import TransportFailure, seconds_text, transport_failure, unreachable_reason
from signoff.hooks._plain_async import AsyncPlainGateClient
from signoff.hooks.client import (
    AsyncGateClient,
    GateClient,
    GateConfigError,
    GateDecision,
    GateDenied,
    GateFailure,
    GateTimeout,
    GateUnavailable,
    make_idempotency_key,
)
from tests.hooks.signoff_fakes import KEY, URL, LiveSignoff, Scripted, pending, record, state, submitted

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}

Ask = Callable[..., GateDecision]


@pytest.fixture(params=["sync", "async"])
def ask(request: pytest.FixtureRequest) -> Callable[..., Ask]:
    """``ask(handler, **client_kwargs)(tool, args, **call_kwargs)`` through either shell."""

    def bind(handler: Callable[[httpx.Request], httpx.Response], **client_kwargs: Any) -> Ask:
        options = {"url": URL, "api_key": KEY, **FAST, **client_kwargs}

        def call(tool: str, args: dict[str, Any] | None = None, **kwargs: Any) -> GateDecision:
            transport = httpx.MockTransport(handler)
            if request.param == "sync":
                with GateClient(transport=transport, **options) as client:
                    return client.pre_tool_use(tool, args, **kwargs)

            async def go() -> GateDecision:
                async with AsyncGateClient(transport=transport, **options) as client:
                    return await client.pre_tool_use(tool, args, **kwargs)

            return asyncio.run(go())

        return call

    return bind


# --------------------------------------------------------------------------- decisions


def test_allow_sends_the_call_and_allows(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", submitted("allow", reason="no gate matched"))
    decision = ask(fake)(
        "pay_invoice",
        {"amount": 10},
        session_id="s1",
        tool_call_id="c1",
        user_id="u1",
        metadata={"team": "fin"},
    )
    assert decision.allowed
    assert decision.decision is Decision.ALLOW
    assert decision.failure is None
    assert decision.reason == "no gate matched"
    (sent,) = fake.sent("submit")
    assert sent.method == "POST"
    assert str(sent.url) == f"{URL}/v1/hooks/pre-tool-use"
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert json.loads(sent.content) == {
        "tool_name": "pay_invoice",
        "arguments": {"amount": 10},
        "session_id": "s1",
        "tool_call_id": "c1",
        "user_id": "u1",
        "metadata": {"team": "fin"},
        "idempotency_key": "python:s1:c1",
    }


def test_deny_is_a_decision_not_a_failure(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", submitted("deny", reason="read-only mode"))
    decision = ask(fake)("drop_table", {"name": "users"})
    assert not decision.allowed
    assert decision.decision is Decision.DENY
    assert decision.failure is None
    assert decision.reason == "read-only mode"
    with pytest.raises(GateDenied) as info:
        decision.raise_for_denial()
    assert type(info.value) is GateDenied
    assert info.value.reason == "read-only mode"


def test_pending_then_approved_waits_and_allows(ask: Callable[..., Ask]) -> None:
    approved = state(
        "req-7",
        "approved",
        decided_by={"channel": "slack", "user_id": "U1", "name": "Alice"},
    )
    fake = (
        Scripted()
        .on("submit", pending("req-7", modified_arguments={"amount": 50_000, "memo": "[redacted]"}))
        .on("wait", lambda r: (time.sleep(0.02), state("req-7"))[1], approved)
    )
    decision = ask(fake, poll_timeout=7)("pay_invoice", {"amount": 50_000, "memo": "secret"})
    assert decision.allowed
    assert decision.request_id == "req-7"
    assert decision.reason == "Approved by Alice (slack)"
    assert decision.modified_arguments == {"amount": 50_000, "memo": "[redacted]"}
    assert decision.arguments({"amount": 1}) == {"amount": 50_000, "memo": "[redacted]"}
    waits = fake.sent("wait")
    assert len(waits) == 2
    assert all(w.url.path == "/v1/requests/req-7/wait" for w in waits)
    assert all(w.url.params["timeout"] == "7" for w in waits)
    asked, again = fake.bodies()
    assert again == asked, "sent again as it was, once approved, for Signoff to answer"


def test_pending_then_rejected_denies_with_the_approvers_reason(ask: Callable[..., Ask]) -> None:
    rejected = state(
        "req-1",
        "rejected",
        reason="not this quarter",
        decided_by={"channel": "feishu", "user_id": "ou_1", "name": "Bob"},
    )
    fake = Scripted().on("submit", pending("req-1", modified_arguments={"x": 1})).on("wait", rejected)
    decision = ask(fake)("pay_invoice", {"amount": 1})
    assert not decision.allowed
    assert decision.failure is None
    assert decision.reason == "Rejected by Bob (feishu): not this quarter"
    assert decision.modified_arguments is None
    assert decision.request is not None
    assert decision.request["status"] == "rejected"


@pytest.mark.parametrize(("status", "words"), [("expired", "expired"), ("cancelled", "cancelled")])
def test_expired_or_cancelled_request_denies(ask: Callable[..., Ask], status: str, words: str) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", status))
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is None
    assert decision.reason is not None
    assert words in decision.reason
    assert "req-1" in decision.reason


def test_already_decided_request_is_answered_on_submit(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on(
        "submit", submitted("allow", request_id="req-1", request=record("req-1", "approved"))
    )
    decision = ask(fake)("pay_invoice", {}, session_id="s", tool_call_id="c")
    assert decision.allowed
    assert decision.request_id == "req-1"
    assert fake.sent("wait") == []


# --------------------------------------------------------------------------- re-attaching


def test_reattaches_after_dropped_connections(ask: Callable[..., Ask]) -> None:
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on(
            "wait",
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            httpx.ReadError("connection reset"),
            httpx.ConnectError("connection refused"),
            state("req-1", "approved"),
        )
    )
    decision = ask(fake)("pay_invoice", {})
    assert decision.allowed
    assert len(fake.sent("submit")) == 2, "re-attaches by request id; sent again only once approved"
    assert [r.url.path for r in fake.sent("wait")] == ["/v1/requests/req-1/wait"] * 4


def test_reattaches_after_503s_while_waiting(ask: Callable[..., Ask]) -> None:
    unavailable = httpx.Response(503, text="restarting")
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on("wait", unavailable, httpx.Response(502), state("req-1", "approved"))
    )
    assert ask(fake)("pay_invoice", {}).allowed
    assert len(fake.sent("wait")) == 3


def test_submit_retries_keep_the_idempotency_key(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on(
        "submit",
        httpx.ConnectError("refused"),
        httpx.Response(503),
        httpx.Response(429, headers={"Retry-After": "0"}),
        httpx.ReadTimeout("slow"),
        submitted("allow"),
    )
    decision = ask(fake)("pay_invoice", {"amount": 5}, session_id="sess", tool_call_id="call-9")
    assert decision.allowed
    keys = [b["idempotency_key"] for b in fake.bodies()]
    assert keys == ["python:sess:call-9"] * 5


def test_generated_key_is_stable_across_retries_but_fresh_per_call(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", httpx.Response(500), submitted("allow"))
    call = ask(fake)
    assert call("t", {}).allowed
    fake.scripts["submit"] = [httpx.Response(500), submitted("allow")]
    assert call("t", {}).allowed
    keys = [b["idempotency_key"] for b in fake.bodies()]
    assert len(keys) == 4
    assert keys[0] == keys[1] != keys[2] == keys[3]
    assert all(k.startswith("python:auto:") for k in keys)


def test_explicit_idempotency_key_wins(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", submitted("allow"))
    ask(fake, runtime="mine")("t", {}, session_id="s", tool_call_id="c", idempotency_key="k-1")
    assert fake.bodies()[0]["idempotency_key"] == "k-1"


def test_make_idempotency_key_needs_both_ids() -> None:
    assert make_idempotency_key("claude-code", "sess", "toolu_1") == "claude-code:sess:toolu_1"
    assert make_idempotency_key("claude-code", None, "toolu_1") is None
    assert make_idempotency_key("claude-code", "sess", None) is None


# --------------------------------------------------------------------------- failing closed


def test_server_down_until_deadline_denies_as_unavailable(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", httpx.ConnectError("[Errno 111] Connection refused"))
    started = time.monotonic()
    decision = ask(fake, deadline=0.3)("pay_invoice", {})
    elapsed = time.monotonic() - started
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert decision.reason is not None
    assert "Connection refused" in decision.reason
    assert len(fake.sent("submit")) >= 2, "retried before giving up"
    assert elapsed < 2.0
    with pytest.raises(GateUnavailable):
        decision.raise_for_denial()


def test_an_unreachable_server_is_given_up_on_long_before_the_wait_deadline(ask: Callable[..., Ask]) -> None:
    # An hour to wait for a human, but no request exists yet: deny after the submit window.
    fake = Scripted().on("submit", httpx.ConnectError("[Errno 111] Connection refused"))
    started = time.monotonic()
    decision = ask(fake, deadline=3600, submit_deadline=0.3)("pay_invoice", {})
    assert time.monotonic() - started < 2.0
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "within 0.3s" in (decision.reason or "")


def test_5xx_beyond_the_deadline_denies(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", httpx.Response(500, text="boom"))
    decision = ask(fake, deadline=0.2)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "HTTP 500" in (decision.reason or "")


def test_deadline_while_pending_denies_as_timeout_and_leaves_request_open(ask: Callable[..., Ask]) -> None:
    slow_pending = lambda r: (time.sleep(0.05), state("req-1"))[1]  # noqa: E731
    fake = Scripted().on("submit", pending("req-1")).on("wait", slow_pending)
    started = time.monotonic()
    decision = ask(fake, deadline=0.4)("pay_invoice", {})
    assert time.monotonic() - started < 2.0
    assert not decision.allowed
    assert decision.failure is GateFailure.TIMEOUT
    assert decision.request_id == "req-1"
    assert "still pending" in (decision.reason or "")
    assert fake.sent("cancel") == [], "no cancel unless cancel_on_deadline"
    with pytest.raises(GateTimeout) as info:
        decision.raise_for_denial()
    assert isinstance(info.value, GateDenied)
    assert info.value.request_id == "req-1"


def test_deadline_with_cancel_on_deadline_cancels(ask: Callable[..., Ask]) -> None:
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on("wait", state("req-1"))
        .on("cancel", state("req-1", "cancelled"))
    )
    decision = ask(fake, deadline=0.2, cancel_on_deadline=True)("pay_invoice", {})
    assert decision.failure is GateFailure.TIMEOUT
    assert "was cancelled" in (decision.reason or "")
    (cancel,) = fake.sent("cancel")
    assert cancel.method == "POST"
    assert cancel.url.path == "/v1/requests/req-1/cancel"


def test_approval_that_wins_the_race_against_cancel_is_honoured(ask: Callable[..., Ask]) -> None:
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on("wait", state("req-1"))
        .on("cancel", state("req-1", "approved"))
    )
    decision = ask(fake, deadline=0.2, cancel_on_deadline=True)("pay_invoice", {})
    assert decision.allowed


def test_cancel_refused_because_already_approved_reads_the_outcome(ask: Callable[..., Ask]) -> None:
    """The real server answers 409 to cancelling a decided request; the client reads it."""
    fake = (
        Scripted()
        .on("submit", pending("req-1", modified_arguments={"amount": 1}))
        .on("wait", state("req-1"))
        .on("cancel", httpx.Response(409, json={"detail": "request req-1 is already approved"}))
        .on("get", state("req-1", "approved"))
    )
    decision = ask(fake, deadline=0.2, cancel_on_deadline=True)("pay_invoice", {})
    assert decision.allowed
    assert decision.modified_arguments == {"amount": 1}
    assert [r.url.path for r in fake.sent("get")] == ["/v1/requests/req-1"]


def test_cancel_failing_entirely_still_times_out(ask: Callable[..., Ask]) -> None:
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on("wait", state("req-1"))
        .on("cancel", httpx.ConnectError("refused"))
        .on("get", httpx.ConnectError("refused"))
    )
    decision = ask(fake, deadline=0.2, cancel_on_deadline=True)("pay_invoice", {})
    assert decision.failure is GateFailure.TIMEOUT
    assert "cancelling it failed" in (decision.reason or "")


def test_fast_pending_answers_do_not_spin(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1"))
    decision = ask(fake, deadline=0.5, backoff_initial=0.1, backoff_max=0.1)("t", {})
    assert decision.failure is GateFailure.TIMEOUT
    assert len(fake.sent("wait")) <= 7


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, text="<html>proxy error</html>"),
        httpx.Response(200, json=["allow"]),
        httpx.Response(200, json={"decision": "maybe"}),
        httpx.Response(200, json={"decision": "pending", "request_id": None}),
        httpx.Response(200, json={"decision": "allow", "reason": 42}),
        httpx.Response(200, json={"decision": "allow", "modified_arguments": "rm -rf /"}),
        httpx.Response(200, json={"decision": "allow", "request": record("r", "rejected")}),
        httpx.Response(200, json={}),
    ],
    ids=[
        "html",
        "list",
        "unknown-decision",
        "pending-no-id",
        "bad-reason",
        "bad-args",
        "contradiction",
        "empty",
    ],
)
def test_malformed_submit_answer_denies(ask: Callable[..., Ask], reply: httpx.Response) -> None:
    fake = Scripted().on("submit", reply)
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "malformed" in (decision.reason or "")
    assert len(fake.sent("submit")) == 1


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"id": "req-1", "status": "approvedish"}),
        httpx.Response(200, json={"id": "req-other", "status": "approved"}),
    ],
    ids=["not-json", "unknown-status", "other-request"],
)
def test_malformed_wait_answer_denies(ask: Callable[..., Ask], reply: httpx.Response) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", reply)
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE


def test_401_denies_at_once(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", httpx.Response(401, json={"detail": "invalid API key"}))
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert decision.reason == "Signoff refused the API key (HTTP 401): invalid API key"
    assert len(fake.requests) == 1, "a bad key is not retried"


@pytest.mark.parametrize("status", [404, 413, 422])
def test_client_errors_deny_with_the_servers_detail(ask: Callable[..., Ask], status: int) -> None:
    fake = Scripted().on("submit", httpx.Response(status, json={"detail": "arguments too large"}))
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert f"HTTP {status}" in (decision.reason or "")
    assert "arguments too large" in (decision.reason or "")
    assert len(fake.requests) == 1


def test_unknown_request_while_waiting_denies(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", httpx.Response(404, json={"detail": "gone"}))
    decision = ask(fake)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "req-1" in (decision.reason or "")


def test_arguments_that_are_not_json_deny_without_sending(ask: Callable[..., Ask]) -> None:
    fake = Scripted()
    decision = ask(fake)("pay_invoice", {"amount": float("nan")})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert fake.requests == []


def test_non_json_argument_types_are_sent_readably(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", submitted("allow"))
    ask(fake)("t", {"tags": {"a"}, "pair": (1, 2), "blob": b"hi", "when": object()})
    args = fake.bodies()[0]["arguments"]
    assert args["tags"] == ["a"]
    assert args["pair"] == [1, 2]
    assert args["blob"] == "hi"
    assert args["when"].startswith("<object object")


def test_a_bug_below_the_client_denies_instead_of_raising(ask: Callable[..., Ask]) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("kaboom")

    decision = ask(broken)("pay_invoice", {})
    assert not decision.allowed
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "kaboom" in (decision.reason or "")


def test_wait_false_returns_pending_at_once(ask: Callable[..., Ask]) -> None:
    fake = Scripted().on("submit", pending("req-3"))
    decision = ask(fake)("pay_invoice", {}, wait=False)
    assert decision.pending
    assert not decision.allowed
    assert decision.decision is Decision.PENDING
    assert decision.request_id == "req-3"
    assert fake.sent("wait") == []
    with pytest.raises(GateDenied):
        decision.raise_for_denial()


# --------------------------------------------------------------------------- configuration


def test_configuration_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNOFF_URL", "https://signoff.example/")
    monkeypatch.setenv("SIGNOFF_API_KEY", "sk-env")
    fake = Scripted().on("submit", submitted("allow"))
    with GateClient(transport=httpx.MockTransport(fake)) as client:
        assert client.pre_tool_use("t", {}).allowed
    (sent,) = fake.requests
    assert str(sent.url) == "https://signoff.example/v1/hooks/pre-tool-use"
    assert sent.headers["Authorization"] == "Bearer sk-env"


def test_explicit_configuration_beats_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNOFF_URL", "https://wrong.example")
    monkeypatch.setenv("SIGNOFF_API_KEY", "sk-wrong")
    fake = Scripted().on("submit", submitted("allow"))
    with GateClient(URL, KEY, transport=httpx.MockTransport(fake)) as client:
        client.pre_tool_use("t", {})
    assert fake.requests[0].url.host == "signoff.test"
    assert fake.requests[0].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SIGNOFF_URL"),
        ({"SIGNOFF_URL": URL}, "SIGNOFF_API_KEY"),
        ({"SIGNOFF_URL": "signoff.test:8080", "SIGNOFF_API_KEY": "k"}, "http://"),
    ],
)
def test_missing_configuration_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for cls in (GateClient, AsyncGateClient):
        with pytest.raises(GateConfigError, match=message) as info:
            cls()
        assert isinstance(info.value, GateDenied), "config errors fail closed for except GateDenied"


def test_repr_hides_the_key() -> None:
    with GateClient(URL, KEY) as client:
        assert KEY not in repr(client)
        assert URL in repr(client)


# --------------------------------------------------------------------------- raising API


def test_require_returns_the_allow_and_raises_typed_errors() -> None:
    fake = Scripted().on("submit", submitted("allow", modified_arguments={"a": 2}))
    with GateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST) as client:
        assert client.require("t", {"a": 1}).arguments({"a": 1}) == {"a": 2}
        fake.scripts["submit"] = [submitted("deny", reason="no")]
        with pytest.raises(GateDenied, match="no"):
            client.require("t", {})
        fake.scripts["submit"] = [httpx.Response(401)]
        with pytest.raises(GateUnavailable):
            client.require("t", {})
        fake.scripts["submit"] = [pending()]
        fake.scripts["wait"] = [state()]
        with pytest.raises(GateTimeout):
            client.require("t", {}, deadline=0.1)


async def test_async_require_raises_typed_errors() -> None:
    fake = Scripted().on("submit", submitted("deny", reason="blocked"))
    async with AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake), **FAST) as client:
        with pytest.raises(GateDenied, match="blocked"):
            await client.require("t", {})


async def test_cancel_of_a_decided_request_reports_its_outcome() -> None:
    fake = (
        Scripted()
        .on("cancel", httpx.Response(409, json={"detail": "already rejected"}))
        .on("get", state("req-1", "rejected", reason="no"))
    )
    async with AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake)) as client:
        decision = await client.cancel("req-1")
    assert not decision.allowed
    assert decision.failure is None
    assert decision.reason == "Rejected: no"


async def test_cancel_returns_the_final_state() -> None:
    fake = Scripted().on("cancel", state("req-1", "cancelled"))
    async with AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake)) as client:
        decision = await client.cancel("req-1")
    assert not decision.allowed
    assert "cancelled" in (decision.reason or "")
    assert fake.requests[0].url.path == "/v1/requests/req-1/cancel"


# --------------------------------------------------------------------------- real HTTP


def test_real_server_approve_after_a_restart_during_the_wait(live: LiveSignoff) -> None:
    """The server restarts while the agent waits; the client re-attaches and gets the decision."""
    results: list[GateDecision] = []
    with GateClient(
        live.url, KEY, poll_timeout=5, backoff_initial=0.05, backoff_max=0.2, deadline=20
    ) as client:
        worker = threading.Thread(
            target=lambda: results.append(
                client.pre_tool_use("pay_invoice", {"amount": 9}, session_id="s", tool_call_id="c")
            )
        )
        worker.start()
        rid = live.wait_for_request()
        live.wait_for_waits(1)  # the client is inside a long-poll now
        live.stop()
        time.sleep(0.3)  # the client sees refused connections
        live.start()
        live.decide(rid, "approved", name="Carol")
        worker.join(10)
    assert not worker.is_alive()
    (decision,) = results
    assert decision.allowed
    assert decision.reason == "Approved by Carol (slack)"
    assert live.waits >= 2, "waited again after the restart"
    asked, again = live.submissions
    assert again == asked, "sent again as it was, once approved"


async def test_real_server_reject_and_idempotent_retry(live: LiveSignoff) -> None:
    async with AsyncGateClient(live.url, KEY, poll_timeout=5, deadline=10) as client:
        task = asyncio.create_task(
            client.pre_tool_use("pay_invoice", {"amount": 9}, session_id="s", tool_call_id="c")
        )
        rid = await asyncio.to_thread(live.wait_for_request)
        live.decide(rid, "rejected", name="Bob", reason="too much")
        first = await task
        again = await client.pre_tool_use("pay_invoice", {"amount": 9}, session_id="s", tool_call_id="c")
    assert not first.allowed
    assert first.reason == "Rejected by Bob (slack): too much"
    assert not again.allowed
    assert again.request_id == rid, "same key → the same, already decided request"
    assert len(live.requests) == 1


def test_real_server_down_denies() -> None:
    server = LiveSignoff().start()
    url = server.url
    server.stop()
    with GateClient(url, KEY, deadline=0.5, **FAST) as client:
        decision = client.pre_tool_use("t", {})
    assert decision.failure is GateFailure.UNAVAILABLE
    assert decision.reason == (
        f"Signoff at {url} refused the connection (nothing is listening there; retried for 0.5s); "
        "denied — check that `signoff serve` is running there and that SIGNOFF_URL is right"
    )


def test_the_submit_deadline_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GateClient(URL, KEY).settings.submit_deadline == 5.0
    monkeypatch.setenv("SIGNOFF_SUBMIT_DEADLINE", "1.5")
    assert GateClient(URL, KEY).settings.submit_deadline == 1.5
    assert GateClient(URL, KEY, submit_deadline=2).settings.submit_deadline == 2
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv("SIGNOFF_SUBMIT_DEADLINE", bad)
        with pytest.raises(GateConfigError, match=r"SIGNOFF_SUBMIT_DEADLINE|must be > 0"):
            GateClient(URL, KEY)


def _raised(exc: BaseException, *, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "refused"),
        (_raised(httpx.ConnectError("[Errno 111]"), cause=ConnectionRefusedError(111, "refused")), "refused"),
        (socket.gaierror(-2, "Name or service not known"), "dns"),
        (_raised(httpx.ConnectError("[Errno -2]"), cause=socket.gaierror(-2, "Name or service")), "dns"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "tls"),
        (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), "tls"),
        (TimeoutError("timed out"), "timeout"),
        (httpx.ReadTimeout("timed out"), "timeout"),
        (ConnectionResetError(104, "reset"), "other"),
    ],
)
def test_transport_failures_are_told_apart(exc: BaseException, kind: str) -> None:
    assert transport_failure(exc).kind == kind


@pytest.mark.parametrize(
    ("failure", "http", "says"),
    [
        (TransportFailure("x", "refused"), "", "refused the connection"),
        (TransportFailure("gaierror", "dns"), "", "could not be resolved"),
        (TransportFailure("SSLError", "tls"), "", "TLS with Signoff at http://s:1 failed"),
        (TransportFailure("ReadTimeout", "timeout"), "", "did not answer within 5s (slow or overloaded)"),
        (TransportFailure("reset", "other"), "", "could not be reached within 5s (reset)"),
        (None, "HTTP 503 from Signoff", "kept answering HTTP 503 from Signoff for 5s"),
    ],
)
def test_unreachable_reasons_name_the_url_and_what_to_check(
    failure: TransportFailure | None, http: str, says: str
) -> None:
    reason = unreachable_reason("http://s:1", 5, failure, http)
    assert says in reason
    assert "\n" not in reason
    assert "denied" in reason


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(3.93929, "3.9s"), (539.6, "540s"), (3300.0, "3300s"), (5.0, "5s"), (0.31234, "0.31s"), (0.05, "0.05s")],
)
def test_durations_in_messages_are_rounded(seconds: float, text: str) -> None:
    assert seconds_text(seconds) == text


def test_a_deadline_left_over_from_a_budget_reads_rounded(ask: Callable[..., Ask]) -> None:
    """What is left of a budget is never round: the deny says 0.31s, not 0.31234s."""
    fake = Scripted().on("submit", httpx.ConnectError("[Errno 111] Connection refused"))
    decision = ask(fake, deadline=0.31234)("pay_invoice", {})
    assert "within 0.31s (" in (decision.reason or "")
    assert "0.312" not in (decision.reason or "")


def test_real_server_bad_key_denies(live: LiveSignoff) -> None:
    with GateClient(live.url, "sk-wrong") as client:
        decision = client.pre_tool_use("t", {})
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "401" in (decision.reason or "")


def test_the_client_imports_nothing_but_httpx_and_the_standard_library() -> None:
    """Agents install the client without the server's dependencies."""
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import sys; before = set(sys.modules);"
        "import signoff.hooks.client, signoff.hooks.decorator, signoff.hooks.adapters.claude_code;"
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.split()
    )
    server_side = {
        "pydantic",
        "cel",
        "fastapi",
        "starlette",
        "sqlalchemy",
        "sqlmodel",
        "yaml",
        "uvicorn",
        "app",
        "channels",
    }
    assert "httpx" in loaded
    assert loaded.isdisjoint(server_side), loaded & server_side


# --------------------------------------------------------------------------- post-tool-use reports

Report = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def report(request: pytest.FixtureRequest) -> Callable[[Scripted], Report]:
    """``report(script)(tool, args, result, **kw)`` through either shell."""

    def bind(script: Scripted) -> Report:
        options = {"url": URL, "api_key": KEY, **FAST}

        def call(*args: Any, **kwargs: Any) -> Any:
            transport = httpx.MockTransport(script)
            if request.param == "sync":
                with GateClient(transport=transport, **options) as client:
                    return client.post_tool_use(*args, **kwargs)

            async def go() -> Any:
                async with AsyncGateClient(transport=transport, **options) as client:
                    return await client.post_tool_use(*args, **kwargs)

            return asyncio.run(go())

        return call

    return bind


def test_a_report_carries_the_call_its_result_and_its_key(report: Callable[[Scripted], Report]) -> None:
    answer = {"decision": "allow", "reason": None, "modified": False, "result": "ok"}
    script = Scripted().on("report", httpx.Response(200, json=answer))
    sent = report(script)(
        "pay_invoice", {"amount": 5}, "ok", session_id="s", idempotency_key="k-1", metadata={"runtime": "mcp"}
    )
    assert sent.delivered
    assert not sent.modified
    (body,) = script.bodies("report")
    assert body == {
        "tool_name": "pay_invoice",
        "arguments": {"amount": 5},
        "result": "ok",
        "session_id": "s",
        "idempotency_key": "k-1",
        "metadata": {"runtime": "mcp"},
    }


def test_a_report_derives_the_key_from_the_ids_as_the_ask_does(report: Callable[[Scripted], Report]) -> None:
    script = Scripted()
    assert report(script)("t", {}, None, session_id="s", tool_call_id="c").delivered
    assert script.bodies("report")[0]["idempotency_key"] == "python:s:c"
    assert "idempotency_key" not in Scripted().bodies("report"), "nothing to derive it from: none sent"


def test_a_report_cuts_a_large_result_and_error_to_fit(report: Callable[[Scripted], Report]) -> None:
    script = Scripted()
    huge = {"rows": ["x" * 100] * 2_000}
    assert report(script)("t", {"q": 1}, huge, error="e" * 20_000).delivered
    (body,) = script.bodies("report")
    assert body["result"]["truncated"] is True
    assert body["result"]["bytes"] > 200_000
    assert body["result"]["head"].startswith('{"rows": ["xxx')
    assert len(body["error"]) == 4000
    assert len(script.sent("report")[0].content) < 24 * 1024, "well within the server's 64 KiB"
    small = Scripted()
    assert report(small)("t", {}, "x" * 10_000).delivered
    assert small.bodies("report")[0]["result"] == "x" * 10_000


def test_a_report_keeps_to_its_deadline(report: Callable[[Scripted], Report]) -> None:
    started = time.monotonic()
    sent = report(Scripted().on("report", httpx.ConnectError("refused")))("t", {}, None, deadline=0.3)
    assert not sent.delivered
    assert time.monotonic() - started < 2
    assert "within 0.3s" in (sent.reason or "")


def test_a_rewritten_result_is_handed_back(report: Callable[[Scripted], Report]) -> None:
    answer = {"decision": "allow", "reason": "truncated", "modified": True, "result": "o…"}
    sent = report(Scripted().on("report", httpx.Response(200, json=answer)))("t", {}, "ok" * 100)
    assert (sent.delivered, sent.modified, sent.result, sent.reason) == (True, True, "o…", "truncated")


def test_a_report_rides_out_a_restart(report: Callable[[Scripted], Report]) -> None:
    answer = {"decision": "allow", "modified": False, "result": None}
    script = Scripted().on(
        "report", httpx.ConnectError("refused"), httpx.Response(503), httpx.Response(200, json=answer)
    )
    assert report(script)("t", {}, None, idempotency_key="same").delivered
    assert [b["idempotency_key"] for b in script.bodies("report")] == ["same"] * 3


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (httpx.Response(401, json={"detail": "bad key"}), "refused the API key"),
        (httpx.Response(200, content=b"<html>"), "malformed answer"),
        (httpx.ConnectError("refused"), "did not take the report"),
    ],
)
def test_a_lost_report_says_why_and_never_raises(
    report: Callable[[Scripted], Report],
    reply: httpx.Response | Exception,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("signoff.hooks._gate.REPORT_DEADLINE", 0.2)
    sent = report(Scripted().on("report", reply))("t", {}, None)
    assert not sent.delivered
    assert says in (sent.reason or "")


def test_a_report_that_cannot_be_encoded_is_lost_not_raised(report: Callable[[Scripted], Report]) -> None:
    sent = report(Scripted())("t", {}, float("nan"))
    assert not sent.delivered
    assert "ValueError" in (sent.reason or "")


# --------------------------------------------------------------------------- the asyncio plain shell


async def test_plain_async_approve_after_a_restart_during_the_wait(live: LiveSignoff) -> None:
    """As the httpx client does: re-attach across a restart, on fresh connections."""
    async with AsyncPlainGateClient(
        live.url, KEY, poll_timeout=5, backoff_initial=0.05, backoff_max=0.2, deadline=20
    ) as client:
        task = asyncio.create_task(
            client.pre_tool_use("pay_invoice", {"amount": 9}, session_id="s", tool_call_id="c")
        )
        rid = await asyncio.to_thread(live.wait_for_request)
        await asyncio.to_thread(live.wait_for_waits, 1)  # the client is inside a long-poll now
        await asyncio.to_thread(live.stop)
        await asyncio.sleep(0.3)  # the client sees refused connections
        live.start()
        live.decide(rid, "approved", name="Carol")
        decision = await asyncio.wait_for(task, 10)
    assert decision.allowed
    assert decision.reason == "Approved by Carol (slack)"
    assert live.waits >= 2
    asked, again = live.submissions
    assert again == asked, "sent again as it was, once approved"


async def test_plain_async_concurrent_calls_and_reports(live: LiveSignoff) -> None:
    live.policy = lambda tool, args: "allow"
    async with AsyncPlainGateClient(live.url, KEY) as client:
        decisions = await asyncio.gather(*(client.pre_tool_use("t", {"i": i}) for i in range(12)))
        answers = await asyncio.gather(*(client.post_tool_use("t", {"i": i}, i) for i in range(12)))
    assert all(d.allowed for d in decisions)
    assert all(a.delivered for a in answers)
    assert sorted(s["arguments"]["i"] for s in live.submissions) == list(range(12))
    assert sorted(r["result"] for r in live.reports) == list(range(12))


async def test_plain_async_down_and_bad_key_deny(live: LiveSignoff) -> None:
    async with AsyncPlainGateClient(live.url, "sk-wrong") as client:
        refused = await client.pre_tool_use("t", {})
    assert refused.failure is GateFailure.UNAVAILABLE
    assert "401" in (refused.reason or "")
    url = live.url
    live.stop()
    async with AsyncPlainGateClient(url, KEY, submit_deadline=0.5, **FAST) as client:
        down = await client.pre_tool_use("t", {})
    assert down.failure is GateFailure.UNAVAILABLE
    assert "refused the connection" in (down.reason or "")


async def test_plain_async_leaves_https_to_httpx() -> None:
    fake = Scripted().on("submit", submitted("allow"))
    async with AsyncPlainGateClient("https://signoff.test", KEY) as client:
        await client._http.aclose()
        client._http = httpx.AsyncClient(transport=httpx.MockTransport(fake))
        decision = await client.pre_tool_use("t", {})
    assert decision.allowed
    assert fake.requests[0].url == "https://signoff.test/v1/hooks/pre-tool-use"


# --------------------------------------------------------------------------- approved with changes


def _changed(**fields: Any) -> list[dict[str, Any]]:
    return [
        {"field": k, "proposed": None, "approved": v, "proposed_absent": False} for k, v in fields.items()
    ]


def test_approved_with_changes_runs_the_call_with_them(ask: Callable[..., Ask]) -> None:
    """The request record names only the changed fields: the client applies them to its own
    call, so the values it never sent in the clear (redacted there) stay its own."""
    approved = state("req-1", "approved", changes=_changed(amount=40_000))
    fake = Scripted().on("submit", pending("req-1")).on("wait", approved)
    decision = ask(fake)("pay_invoice", {"amount": 90_000, "token": "secret-value"})
    assert decision.allowed
    assert decision.modified_arguments == {"amount": 40_000, "token": "secret-value"}
    assert decision.reason == "Approved with changes: amount → 40000"


def test_changes_apply_over_arguments_the_servers_hooks_rewrote(ask: Callable[..., Ask]) -> None:
    approved = state("req-1", "approved", changes=_changed(amount=5))
    fake = (
        Scripted()
        .on("submit", pending("req-1", modified_arguments={"amount": 90_000, "card": "****"}))
        .on("wait", approved)
    )
    decision = ask(fake)("pay_invoice", {"amount": 90_000, "card": "4111"})
    assert decision.modified_arguments == {"amount": 5, "card": "****"}


@pytest.mark.parametrize("changes", ["amount", [{"approved": 1}], [{"field": 3, "approved": 1}], [7]])
def test_malformed_changes_fail_closed(ask: Callable[..., Ask], changes: Any) -> None:
    fake = Scripted().on("submit", pending("req-1")).on("wait", state("req-1", "approved", changes=changes))
    decision = ask(fake)("pay_invoice", {"amount": 1})
    assert not decision.allowed
    assert decision.failure is not None


def test_an_approval_with_changes_that_wins_against_cancel_runs_as_approved(ask: Callable[..., Ask]) -> None:
    fake = (
        Scripted()
        .on("submit", pending("req-1"))
        .on("wait", state("req-1"))
        .on("cancel", state("req-1", "approved", changes=_changed(amount=2)))
    )
    decision = ask(fake, deadline=0.2, cancel_on_deadline=True)("pay_invoice", {"amount": 9, "to": "x"})
    assert decision.allowed
    assert decision.modified_arguments == {"amount": 2, "to": "x"}


async def test_cancel_alone_never_allows_an_approval_with_changes() -> None:
    """Without the call's own arguments the changes cannot be applied: a deny naming them."""
    fake = Scripted().on("cancel", state("req-1", "approved", changes=_changed(amount=40_000)))
    async with AsyncGateClient(URL, KEY, transport=httpx.MockTransport(fake)) as client:
        decision = await client.cancel("req-1")
    assert not decision.allowed
    assert "amount → 40000" in (decision.reason or "")
    assert "not run" in (decision.reason or "")
