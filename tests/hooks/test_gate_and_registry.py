"""The confirmation gate (globs, CEL conditions, durations) and the hook registry's fail-closed runner."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate, parse_duration
from signoff.hooks import Decision, HookContext, HookRegistry, HookResult


def ctx(tool: str = "pay_invoice", **arguments: Any) -> HookContext:
    return HookContext(agent_id="finance-bot", tool_name=tool, arguments=arguments)


def make_gate(*tools: str, when: str | None = None, **kw: Any) -> ConfirmationGate:
    return ConfirmationGate(tools=tools, when=when, channel="chat", **kw)


# --- tool globs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("globs", "tool", "expected"),
    [
        (("pay_*",), "pay_invoice", True),
        (("pay_*",), "pay_", True),
        (("pay_*",), "pay", False),
        (("pay_*",), "prepay_invoice", False),
        (("pay_*",), "PAY_invoice", True),  # no spelling of a gated tool slips past its gate
        (("*",), "anything_at_all", True),
        (("*",), "mcp__github__create_issue", True),
        (("delete_repo",), "delete_repo", True),
        (("delete_repo",), "delete_repo2", False),
        (("delete_repo",), "xdelete_repo", False),
        (("delete_repo",), "delete_rep", False),
        (("mcp__github__*",), "mcp__github__create_issue", True),
        (("mcp__github__*",), "mcp__gitlab__create_issue", False),
        (("mcp__github__*",), "mcp__github_x", False),
        (("pay_?",), "pay_a", True),
        (("pay_?",), "pay_ab", False),
        (("pay_*", "wire_*"), "wire_money", True),
        (("pay_*", "wire_*"), "send_money", False),
        (("a.b",), "aXb", False),
    ],
)
def test_tool_globs(globs: tuple[str, ...], tool: str, expected: bool) -> None:
    assert make_gate(*globs).matches(ctx(tool)) is expected


# --- CEL conditions ------------------------------------------------------------------------------


def test_when_true_and_false() -> None:
    gate = make_gate("pay_*", when="args.amount >= 50000")
    assert gate.matches(ctx(amount=50000))
    assert gate.matches(ctx(amount=60000.5))
    assert not gate.matches(ctx(amount=49999))


def test_when_is_only_evaluated_for_matching_tools() -> None:
    gate = make_gate("pay_*", when="true")
    assert not gate.matches(ctx("read_file"))


def test_when_sees_tool_agent_user_and_metadata() -> None:
    gate = make_gate(
        "*",
        when='tool.startsWith("pay") && agent == "finance-bot" && user == "carol" && metadata.env == "prod"',
    )
    base = HookContext(
        agent_id="finance-bot", tool_name="pay_x", user_id="carol", metadata={"env": "prod"}, arguments={}
    )
    assert gate.matches(base)
    assert not gate.matches(HookContext(**{**_fields(base), "user_id": "dave"}))
    assert not gate.matches(HookContext(**{**_fields(base), "metadata": {"env": "dev"}}))
    assert not gate.matches(HookContext(**{**_fields(base), "agent_id": "other-bot"}))


def _fields(c: HookContext) -> dict[str, Any]:
    return {
        "agent_id": c.agent_id,
        "tool_name": c.tool_name,
        "arguments": c.arguments,
        "user_id": c.user_id,
        "metadata": c.metadata,
    }


def test_has_guards_a_missing_field() -> None:
    gate = make_gate("pay_*", when="has(args.amount) && args.amount >= 50000")
    assert not gate.matches(ctx())
    assert gate.matches(ctx(amount=90000))


def test_when_over_nested_arguments_and_lists() -> None:
    gate = make_gate("*", when='args.target.env == "prod" || "root" in args.roles')
    assert gate.matches(ctx("deploy", target={"env": "prod"}, roles=[]))
    assert gate.matches(ctx("deploy", target={"env": "dev"}, roles=["user", "root"]))
    assert not gate.matches(ctx("deploy", target={"env": "dev"}, roles=["user"]))


@pytest.mark.parametrize(
    "arguments",
    [
        {},  # missing field, no has()
        {"amount": "a lot"},  # string vs int
        {"amount": None},
        {"amount": True},
        {"amount": [1, 2]},
    ],
    ids=["missing", "string", "null", "bool", "list"],
)
def test_an_unevaluable_condition_counts_as_a_match_and_says_why(arguments: dict[str, Any]) -> None:
    """A match (whatever asks whether the call reaches the gate must hear yes), which the gate
    itself then denies (see test_a_gate_denies_a_call_its_condition_cannot_be_evaluated_for)."""
    gate = make_gate("pay_*", when="args.amount >= 50000")
    assert gate.matches(ctx(**arguments)) is True
    why = gate.condition(ctx(**arguments))
    assert isinstance(why, str)
    if arguments:
        assert why.startswith("No such overload: the operation is not defined for the given operand types")
    else:
        assert why == "no field 'amount' in the call"


@pytest.mark.parametrize(("when", "kind"), [("args.amount", "int"), ("args.memo", "string"), ("args", "map")])
def test_a_condition_that_gives_no_true_or_false_cannot_be_evaluated(when: str, kind: str) -> None:
    gate = make_gate("pay_*", when=when)
    call = ctx(amount=7, memo="the secret")
    assert gate.condition(call) == f"the condition gave a {kind}, not true or false"
    assert gate.matches(call) is True


async def test_a_gate_denies_a_call_its_condition_cannot_be_evaluated_for() -> None:
    recorded: list[tuple[str, dict[str, Any]]] = []

    class Services:
        def redact(self, value: Any) -> Any:
            return value

        async def record(self, c: HookContext, action: str, detail: Mapping[str, Any]) -> None:
            recorded.append((action, dict(detail)))

        async def request_approval(self, c: HookContext, gate: Any) -> HookResult:
            raise AssertionError("nobody is asked")

    gate = make_gate("pay_*", when="args.amount >= 50000", name="large payments")
    call = HookContext(
        agent_id="finance-bot",
        tool_name="pay_x",
        arguments={"amount": "lots"},
        services=Services(),  # type: ignore[arg-type]
    )
    result = await gate.before_tool_use(call)
    assert result.decision is Decision.DENY
    assert result.reason == (
        "gate 'large payments' could not evaluate its condition for this call (No such overload: the "
        "operation is not defined for the given operand types), so the call is denied"
    )
    [(action, detail)] = recorded
    assert action == "condition_error"
    assert detail["gate"] == "large payments"
    assert detail["when"] == "args.amount >= 50000"
    assert detail["error"].startswith("No such overload")
    assert (
        await gate.refusal(HookContext(agent_id="finance-bot", tool_name="pay_x", arguments={"amount": 1}))
        is None
    )


def test_unevaluable_condition_still_needs_the_tool_to_match() -> None:
    gate = make_gate("pay_*", when="args.amount >= 50000")
    assert gate.matches(ctx("read_file")) is False


def test_blank_when_means_always() -> None:
    gate = make_gate("pay_*", when="   ")
    assert gate.when is None
    assert gate.matches(ctx(amount=1))


@pytest.mark.parametrize("when", ["args.amount >=", "args[", "1 +", "'unterminated"])
def test_when_that_does_not_compile_is_refused(when: str) -> None:
    with pytest.raises(ValidationError, match="invalid CEL condition"):
        make_gate("pay_*", when=when)


def test_gate_checks_quorum_against_approvers() -> None:
    with pytest.raises(ValidationError, match="quorum 3 is more than the 2 approver"):
        make_gate("pay_*", approvers=("alice", "bob"), quorum=3)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        make_gate("pay_*", quorum=0)
    assert make_gate("pay_*", approvers=("alice", "bob"), quorum=2).quorum == 2


def test_gate_label() -> None:
    assert make_gate("pay_*", name="payments").label == "payments"
    assert make_gate("pay_*", "wire_*").label == "confirmation_gate[pay_*,wire_*]"


# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90),
        (1.5, 1.5),
        ("90", 90),
        ("45s", 45),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        (" 5 m ", 300),
        (timedelta(minutes=3), 180),
    ],
)
def test_parse_duration(value: Any, seconds: float) -> None:
    assert parse_duration(value) == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["soon", "", "1w", "1.5h", "-5m", "5 minutes", "m", "30M"])
def test_parse_duration_refuses_what_is_not_a_duration(value: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)


@pytest.mark.parametrize("value", [0, "0", "0s", -1, -0.5])
def test_parse_duration_refuses_non_positive(value: Any) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        parse_duration(value)


def test_gate_timeout_default_and_parsed() -> None:
    assert make_gate("x").timeout == timedelta(minutes=30)
    assert make_gate("x", timeout="2h").timeout == timedelta(hours=2)
    with pytest.raises(ValidationError, match="'soon' is not a duration"):
        make_gate("x", timeout="soon")


# --- the gate as a hook ----------------------------------------------------------------------------


async def test_gate_without_an_approvals_broker_denies() -> None:
    gate = make_gate("pay_*", name="payments")
    result = await gate.before_tool_use(ctx(amount=1))
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "payments" in result.reason
    assert "no approval service" in result.reason


async def test_gate_asks_the_broker() -> None:
    seen: list[tuple[HookContext, Any]] = []

    class Broker:
        async def request_approval(self, c: HookContext, gate: Any) -> HookResult:
            seen.append((c, gate))
            return HookResult(decision=Decision.PENDING, reason="waiting", request_id="r1")

    gate = make_gate("pay_*")
    call = HookContext(agent_id="a", tool_name="pay_x", services=Broker())  # type: ignore[arg-type]
    result = await gate.before_tool_use(call)
    assert result.decision is Decision.PENDING
    assert result.request_id == "r1"
    assert seen == [(call, gate)]


async def test_registry_runs_a_gate_without_broker_as_deny() -> None:
    registry = HookRegistry(pre_tool_use=[make_gate("pay_*")])
    assert (await registry.run_pre_tool_use(ctx())).decision is Decision.DENY
    assert (await registry.run_pre_tool_use(ctx("read_file"))).decision is Decision.ALLOW


# --- the registry ----------------------------------------------------------------------------------


@dataclass
class Pre:
    """A PreToolUse hook with a scripted answer; records the arguments it saw."""

    name: str
    priority: int = 100
    answer: Any = field(default_factory=HookResult)
    tools: tuple[str, ...] = ("*",)
    log: list[str] = field(default_factory=list)
    seen: list[Mapping[str, Any]] = field(default_factory=list)

    def matches(self, c: HookContext) -> bool:
        return "*" in self.tools or c.tool_name in self.tools

    async def before_tool_use(self, c: HookContext) -> HookResult:
        self.log.append(self.name)
        self.seen.append(c.arguments)
        answer: Any = self.answer
        return answer(c) if callable(answer) else answer


class Raises(Pre):
    async def before_tool_use(self, c: HookContext) -> HookResult:
        self.log.append(self.name)
        raise RuntimeError("boom")


class Hangs(Pre):
    async def before_tool_use(self, c: HookContext) -> HookResult:
        self.log.append(self.name)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class MatchRaises(Pre):
    def matches(self, c: HookContext) -> bool:
        raise KeyError("nope")


class SyncRaises(Pre):
    """A hook written without ``async`` that raises as soon as it is called."""

    def before_tool_use(self, c: HookContext) -> HookResult:  # type: ignore[override]
        self.log.append(self.name)
        raise RuntimeError("boom")


class SyncReturns(Pre):
    """A hook written without ``async``: returns a result instead of an awaitable."""

    def before_tool_use(self, c: HookContext) -> HookResult:  # type: ignore[override]
        self.log.append(self.name)
        return HookResult()


async def test_hooks_run_in_priority_order_then_configuration_order() -> None:
    log: list[str] = []
    hooks = [
        Pre("late", priority=200, log=log),
        Pre("first-of-100", priority=100, log=log),
        Pre("early", priority=-5, log=log),
        Pre("second-of-100", priority=100, log=log),
    ]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert result.decision is Decision.ALLOW
    assert result.modified_arguments is None
    assert log == ["early", "first-of-100", "second-of-100", "late"]


async def test_hooks_that_do_not_match_are_skipped() -> None:
    log: list[str] = []
    hooks = [Pre("pay", tools=("pay_x",), log=log, answer=HookResult.deny("no")), Pre("all", log=log)]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx("read_file"))
    assert result.decision is Decision.ALLOW
    assert log == ["all"]


async def test_no_hooks_allows() -> None:
    result = await HookRegistry().run_pre_tool_use(ctx())
    assert result == HookResult()


async def test_a_hook_that_raises_denies_naming_it() -> None:
    log: list[str] = []
    hooks = [Raises("exploder", priority=1, log=log), Pre("after", priority=2, log=log)]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'exploder'" in result.reason
    assert "RuntimeError" in result.reason
    assert log == ["exploder"], "nothing runs after a failed hook"


async def test_a_sync_hook_that_raises_denies_naming_it() -> None:
    hooks = [SyncRaises("sync-exploder")]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'sync-exploder'" in result.reason


async def test_a_sync_hook_returning_a_result_denies_naming_it() -> None:
    result = await HookRegistry(pre_tool_use=[SyncReturns("not-async")]).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'not-async'" in result.reason


async def test_a_hook_whose_matches_raises_denies_naming_it() -> None:
    log: list[str] = []
    result = await HookRegistry(pre_tool_use=[MatchRaises("picky", log=log)]).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'picky'" in result.reason
    assert log == []


async def test_a_hook_that_times_out_denies_naming_it() -> None:
    log: list[str] = []
    hooks = [Hangs("sleepy", priority=1, log=log), Pre("after", priority=2, log=log)]
    result = await HookRegistry(pre_tool_use=hooks, timeout=0.05).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'sleepy'" in result.reason
    assert "did not answer within 0.05s" in result.reason
    assert log == ["sleepy"]


@dataclass
class HangsBriefly(Hangs):
    time_limit: float | None = 0.05


async def test_a_hook_with_its_own_time_limit_is_cut_off_at_it() -> None:
    # The registry's default would wait an hour; the hook's own limit answers at once.
    hooks = [HangsBriefly("brief", priority=1)]
    result = await asyncio.wait_for(HookRegistry(pre_tool_use=hooks, timeout=3600).run_pre_tool_use(ctx()), 5)
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'brief' did not answer within 0.05s" in result.reason


@pytest.mark.parametrize("garbage", [None, "allow", {"decision": "allow"}, True, Decision.ALLOW])
async def test_a_hook_returning_garbage_denies_naming_it(garbage: Any) -> None:
    log: list[str] = []
    hooks = [Pre("liar", priority=1, answer=garbage, log=log), Pre("after", priority=2, log=log)]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'liar'" in result.reason
    assert "not a HookResult" in result.reason
    assert log == ["liar"]


async def test_rewritten_arguments_flow_to_later_hooks_and_are_returned() -> None:
    first = Pre(
        "mask", priority=1, answer=lambda c: HookResult(modified_arguments={**c.arguments, "card": "****"})
    )
    second = Pre(
        "cap", priority=2, answer=lambda c: HookResult(modified_arguments={**c.arguments, "amount": 100})
    )
    third = Pre("observer", priority=3)
    original = ctx(amount=5000, card="4111")

    result = await HookRegistry(pre_tool_use=[third, second, first]).run_pre_tool_use(original)

    assert result.decision is Decision.ALLOW
    assert second.seen == [{"amount": 5000, "card": "****"}]
    assert third.seen == [{"amount": 100, "card": "****"}]
    assert result.modified_arguments == {"amount": 100, "card": "****"}
    assert original.arguments == {"amount": 5000, "card": "4111"}, "the caller's snapshot is untouched"


async def test_rewritten_arguments_are_returned_with_a_later_pending() -> None:
    rewrite = Pre("mask", priority=1, answer=HookResult(modified_arguments={"card": "****"}))
    ask = Pre("ask", priority=2, answer=HookResult(decision=Decision.PENDING, reason="wait", request_id="r9"))
    result = await HookRegistry(pre_tool_use=[rewrite, ask]).run_pre_tool_use(ctx(card="4111"))
    assert result.decision is Decision.PENDING
    assert result.request_id == "r9"
    assert result.reason == "wait"
    assert ask.seen == [{"card": "****"}]
    assert result.modified_arguments == {"card": "****"}


async def test_a_deny_does_not_rewrite_arguments() -> None:
    deny = Pre("no", answer=HookResult.deny("nope", modified_arguments={"x": 1}))
    result = await HookRegistry(pre_tool_use=[deny]).run_pre_tool_use(ctx(x=0))
    assert result.decision is Decision.DENY
    assert result.modified_arguments is None


async def test_the_first_deny_stops_the_chain() -> None:
    log: list[str] = []
    hooks = [
        Pre("ok", priority=1, log=log),
        Pre("stopper", priority=2, answer=HookResult.deny("policy says no"), log=log),
        Pre("never", priority=3, answer=HookResult.deny("later"), log=log),
    ]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert log == ["ok", "stopper"]
    assert (result.decision, result.reason) == (Decision.DENY, "policy says no")


@pytest.mark.parametrize("later", ["allow", "pending", "deny"])
async def test_a_pending_answer_does_not_end_the_chain(later: str) -> None:
    """Every hook is asked: a later deny still denies a call a human was asked about."""
    log: list[str] = []
    answers = {
        "allow": HookResult(),
        "pending": HookResult(decision=Decision.PENDING, reason="ask again", request_id="r2"),
        "deny": HookResult.deny("read-only"),
    }
    hooks = [
        Pre(
            "gate",
            priority=1,
            answer=HookResult(decision=Decision.PENDING, reason="ask", request_id="r1"),
            log=log,
        ),
        Pre("later", priority=2, answer=answers[later], log=log),
        Pre("ok", priority=3, log=log),
    ]
    result = await HookRegistry(pre_tool_use=hooks).run_pre_tool_use(ctx())
    assert log == (["gate", "later"] if later == "deny" else ["gate", "later", "ok"])
    if later == "deny":
        assert (result.decision, result.reason) == (Decision.DENY, "read-only")
    else:
        assert (result.decision, result.reason, result.request_id) == (Decision.PENDING, "ask", "r1")


# --- post-tool-use and session-start --------------------------------------------------------------


@dataclass
class Post:
    name: str
    priority: int = 100
    answer: Any = field(default_factory=HookResult)
    seen: list[Any] = field(default_factory=list)

    def matches(self, c: HookContext) -> bool:
        return True

    async def after_tool_use(self, c: HookContext) -> HookResult:
        self.seen.append(c.result)
        answer: Any = self.answer
        return answer(c) if callable(answer) else answer


@dataclass
class Start:
    name: str
    priority: int = 100
    answer: Any = field(default_factory=HookResult)

    async def on_session_start(self, c: HookContext) -> HookResult:
        answer: Any = self.answer
        return answer(c) if callable(answer) else answer


async def test_post_tool_use_rewrites_results_in_order() -> None:
    redact = Post(
        "redact", priority=1, answer=lambda c: HookResult(modified_result=c.result.replace("s3cret", "***"))
    )
    keep = Post("keep", priority=2)
    shout = Post("shout", priority=3, answer=lambda c: HookResult(modified_result=c.result.upper()))
    call = HookContext(agent_id="a", tool_name="read", result="token=s3cret")

    result = await HookRegistry(post_tool_use=[shout, keep, redact]).run_post_tool_use(call)

    assert keep.seen == ["token=***"]
    assert shout.seen == ["token=***"]
    assert result.modified_result == "TOKEN=***"


async def test_post_tool_use_without_rewrites_keeps_the_result() -> None:
    result = await HookRegistry(post_tool_use=[Post("noop")]).run_post_tool_use(
        HookContext(agent_id="a", tool_name="read", result="x")
    )
    assert result.decision is Decision.ALLOW
    assert result.modified_result is None


async def test_post_tool_use_failure_denies_naming_the_hook() -> None:
    result = await HookRegistry(post_tool_use=[Post("bad", answer="garbage")]).run_post_tool_use(
        HookContext(agent_id="a", tool_name="read", result="x")
    )
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'bad'" in result.reason


async def test_session_start_joins_contexts_in_order() -> None:
    hooks = [
        Start("second", priority=2, answer=HookResult(additional_context="Be careful with payments.")),
        Start("empty", priority=3),
        Start("first", priority=1, answer=HookResult(additional_context="You act for ACME.")),
    ]
    result = await HookRegistry(session_start=hooks).run_session_start(HookContext(agent_id="a"))
    assert result.decision is Decision.ALLOW
    assert result.additional_context == "You act for ACME.\n\nBe careful with payments."


async def test_session_start_with_no_context_adds_none() -> None:
    result = await HookRegistry(session_start=[Start("empty")]).run_session_start(HookContext(agent_id="a"))
    assert result.additional_context is None


async def test_session_start_hook_that_raises_denies() -> None:
    def boom(c: HookContext) -> HookResult:
        raise RuntimeError("no")

    hooks = [
        Start("ok", priority=1, answer=HookResult(additional_context="x")),
        Start("bad", priority=2, answer=boom),
    ]
    result = await HookRegistry(session_start=hooks).run_session_start(HookContext(agent_id="a"))
    assert result.decision is Decision.DENY
    assert result.reason is not None
    assert "'bad'" in result.reason
