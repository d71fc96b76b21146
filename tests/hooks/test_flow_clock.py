"""The gate's flow on a clock of the test's own: every client drives the same flow
(``signoff.hooks._gate.gate_flow``) and hands it its clock, so how the flow spends its deadline
is checked here without waiting for one. Each exchange takes as long as the test says (at most
its own timeout, as the clients' bounds make it); the flow must never ask for an exchange or a
pause that outlives the caller's deadline, and must end with a deny that says nobody decided,
by the deadline, never after it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from signoff.hooks._gate import (
    FlowSettings,
    GateFailure,
    HttpCall,
    HttpReply,
    Pause,
    ToolCall,
    TransportFailure,
    gate_flow,
)
from tests.hooks.signoff_fakes import pending, record, state, submitted


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _reply(response: Any) -> HttpReply:
    return HttpReply(response.status_code, response.content)


WAIT_ANSWERS = st.sampled_from(["pending", "503", "refused", "timeout"])


@settings(max_examples=200, deadline=None)
@given(
    deadline=st.floats(min_value=0.2, max_value=600),
    poll_timeout=st.integers(min_value=1, max_value=60),
    answers=st.lists(st.tuples(WAIT_ANSWERS, st.floats(min_value=0, max_value=1)), min_size=1, max_size=50),
)
def test_a_flow_never_outlives_its_deadline_and_ends_in_a_timeout(
    deadline: float, poll_timeout: int, answers: list[tuple[str, float]]
) -> None:
    clock = VirtualClock()
    started = clock.now
    end = started + deadline
    flow = gate_flow(
        ToolCall.build("pay_invoice", {"amount": 90000}, runtime="python"),
        FlowSettings(deadline=deadline, poll_timeout=poll_timeout, backoff_initial=0.05, backoff_max=2.0),
        clock,
    )
    step = next(flow)
    assert isinstance(step, HttpCall)
    assert step.method == "POST"
    step = flow.send(_reply(pending()))
    turn = 0
    try:
        while True:
            assert clock.now <= end
            if isinstance(step, Pause):
                assert step.seconds >= 0
                assert clock.now + step.seconds <= end + 1e-9, "a pause past the deadline"
                clock.now += step.seconds
                step = flow.send(None)
                continue
            assert clock.now + step.timeout <= end + 1e-9, "an exchange allowed past the deadline"
            kind, share = answers[turn % len(answers)]
            turn += 1
            if kind == "pending":
                # A long-poll answered "still pending" after part of the wait it asked for.
                clock.now += step.timeout * share
                outcome: HttpReply | TransportFailure = _reply(state())
            elif kind == "503":
                clock.now += step.timeout * share
                outcome = HttpReply(503, b'{"detail": "unavailable"}', retry_after=1.0)
            elif kind == "refused":
                outcome = TransportFailure("connection refused", "refused")
            else:
                clock.now += step.timeout  # the client's bound: the whole exchange's timeout
                outcome = TransportFailure("no complete answer", "timeout")
            step = flow.send(outcome)
    except StopIteration as stop:
        decision = stop.value
    assert not decision.allowed
    assert decision.failure is GateFailure.TIMEOUT, decision
    assert clock.now <= end + 1e-9, "answered after the deadline"
    assert "No decision on pay_invoice" in decision.reason


@settings(max_examples=200, deadline=None)
@given(
    deadline=st.floats(min_value=0.2, max_value=120),
    poll_timeout=st.integers(min_value=1, max_value=60),
    pendings=st.lists(st.floats(min_value=0, max_value=1), max_size=20),
    approved_after=st.floats(min_value=0, max_value=1),
    confirm_takes=st.floats(min_value=0, max_value=1),
)
def test_an_approval_is_confirmed_within_the_deadline_or_denied_by_it(
    deadline: float, poll_timeout: int, pendings: list[float], approved_after: float, confirm_takes: float
) -> None:
    """Once ``/wait`` says approved the call is sent again (Signoff's answer to it is the
    decision): that exchange, too, ends by the deadline; an approval too late for it is a
    timeout deny that says to call again, never an allow the server did not give."""
    clock = VirtualClock()
    end = clock.now + deadline
    flow = gate_flow(
        ToolCall.build("pay_invoice", {"amount": 90000}, runtime="python"),
        FlowSettings(deadline=deadline, poll_timeout=poll_timeout, backoff_initial=0.05, backoff_max=2.0),
        clock,
    )
    next(flow)
    step = flow.send(_reply(pending()))
    polls = iter(pendings)
    confirmed = False
    try:
        while True:
            if isinstance(step, Pause):
                assert clock.now + step.seconds <= end + 1e-9, "a pause past the deadline"
                clock.now += step.seconds
                step = flow.send(None)
                continue
            assert clock.now + step.timeout <= end + 1e-9, "an exchange allowed past the deadline"
            if step.method == "POST":  # the call sent again, once approved
                confirmed = True
                clock.now += step.timeout * confirm_takes
                step = flow.send(
                    _reply(submitted("allow", request_id="req-1", request=record("req-1", "approved")))
                )
                continue
            share = next(polls, None)
            if share is None:  # decided during this poll
                clock.now += step.timeout * approved_after
                step = flow.send(_reply(state("req-1", "approved")))
            else:
                clock.now += step.timeout * share
                step = flow.send(_reply(state()))
    except StopIteration as stop:
        decision = stop.value
    assert clock.now <= end + 1e-9, "answered after the deadline"
    if decision.allowed:
        assert confirmed, "allowed without Signoff's answer to the call sent again"
    else:
        assert decision.failure is GateFailure.TIMEOUT, decision


@given(refusals=st.integers(min_value=1, max_value=5))
def test_a_last_attempt_cut_short_by_the_deadline_does_not_hide_a_refused_connection(refusals: int) -> None:
    """On a loaded machine the connection refused again and again may end in an attempt the
    deadline cut short timing out: the deny still says the connection was refused."""
    clock = VirtualClock()
    flow = gate_flow(
        ToolCall.build("pay_invoice", {}, runtime="python"),
        FlowSettings(deadline=0.5, submit_deadline=0.5, backoff_initial=0.01, backoff_max=0.02),
        clock,
        url="http://127.0.0.1:1",
    )
    step = next(flow)
    refused = 0
    try:
        while True:
            if isinstance(step, Pause):
                clock.now += step.seconds
                step = flow.send(None)
                continue
            if refused < refusals:
                refused += 1
                step = flow.send(TransportFailure("ConnectError: refused", "refused"))
                continue
            clock.now += step.timeout  # times out at the end of what was left
            step = flow.send(TransportFailure("ConnectTimeout", "timeout"))
    except StopIteration as stop:
        decision = stop.value
    assert decision.failure is GateFailure.UNAVAILABLE
    assert "refused the connection" in (decision.reason or ""), decision.reason
