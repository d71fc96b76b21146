"""Loading the YAML configuration: what loads, and every class of error with file and path."""

from __future__ import annotations

import copy
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, SecretStr
from typer.testing import CliRunner

from signoff.app.builtin_hooks.confirmation_gate import ConfirmationGate
from signoff.app.channel_types import CHANNEL_TYPES, ChannelType
from signoff.app.cli import app as cli_app
from signoff.app.config import ConfigError, SignoffConfig, load_config, parse_config
from signoff.channels import slack
from signoff.channels.fake import FakeChannel
from signoff.hooks import HookContext
from tests.cli import signoff
from tests.conftest import DEFAULT_CONFIG

SIGNOFF = Path(sys.executable).with_name("signoff")

AGENT = "agents.finance-bot.hooks[0]"


class ChatLikeConfig(BaseModel):
    """A channel type whose config holds a secret, registered under a chosen ``type:`` name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    token: SecretStr


@pytest.fixture
def slack_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """A channel type named ``slack`` with Slack's rules for user ids (and no Slack client)."""
    monkeypatch.setitem(
        CHANNEL_TYPES,
        "slack",
        ChannelType(ChatLikeConfig, lambda name, cfg: FakeChannel(name), slack.IDENTITY),
    )


def gate(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "confirmation_gate",
        "tools": ["pay_*"],
        "channel": "chat",
        "approvers": ["alice", "bob"],
    }
    body.update(overrides)
    return body


def doc(*gates: dict[str, Any], **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "channels": {"chat": {"type": "fake"}},
        "people": {"alice": {"fake": "U_ALICE"}, "bob": {"fake": "U_BOB"}},
        "agents": {"finance-bot": {"hooks": list(gates) or [gate()]}},
    }
    body.update(top)
    return body


def write(tmp_path: Path, body: Any, name: str = "signoff.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False), encoding="utf-8"
    )
    return path


def problems_of(tmp_path: Path, body: Any) -> tuple[Path, list[str]]:
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == "\n".join(info.value.problems)
    return path, info.value.problems


def assert_one_problem(tmp_path: Path, body: Any, where: str, *fragments: str) -> str:
    """Exactly one problem, written ``<file>: <where>: …`` and containing ``fragments``."""
    path, problems = problems_of(tmp_path, body)
    assert len(problems) == 1, problems
    problem = problems[0]
    assert problem.startswith(f"{path}: {where}: "), problem
    for fragment in fragments:
        assert fragment in problem, problem
    return problem


# --- what loads ---------------------------------------------------------------------------------


def test_a_valid_file_loads(tmp_path: Path) -> None:
    body = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["finance-bot"]["redact"] = ["iban"]
    body["redact"] = ["Password", "token"]
    path = write(tmp_path, body)

    cfg = load_config(path)

    assert isinstance(cfg, SignoffConfig)
    assert cfg.source == str(path)
    assert set(cfg.channels) == {"web", "chat"}, "the built-in web channel is always there"
    assert cfg.channel_type("chat") == "fake"
    assert cfg.channel_type("web") == "web"
    assert set(cfg.people) == {"alice", "bob", "carol"}
    assert cfg.people["alice"].ids() == {"web": "alice", "fake": "U_ALICE"}
    assert cfg.display_name("alice") == "Alice"
    assert cfg.person_for("fake", "U_BOB") == "bob"
    assert cfg.recognise("U_CAROL") == "carol"
    assert cfg.redact == frozenset({"password", "token"}), "redact words are lower-cased"

    payments, two_person, short = cfg.agents["finance-bot"].hooks
    assert cfg.agents["finance-bot"].redact == ("iban",)
    assert payments.label == "payments"
    assert payments.tools == ("pay_*",)
    assert payments.approvers == ("alice", "bob")
    assert payments.timeout == timedelta(minutes=30)
    assert two_person.quorum == 2
    assert two_person.require_reject_reason is True
    assert short.timeout == timedelta(seconds=1)
    assert short.allow_self_approval is False, "self-approval is off by default"
    # The `when` condition was compiled and works.
    assert payments.matches(
        HookContext(agent_id="finance-bot", tool_name="pay_x", arguments={"amount": 60000})
    )
    assert not payments.matches(
        HookContext(agent_id="finance-bot", tool_name="pay_x", arguments={"amount": 5})
    )
    assert cfg.agents["other-bot"].hooks == ()


def test_no_file_and_an_empty_file_mean_only_the_web_channel(tmp_path: Path) -> None:
    for cfg in (load_config(None), load_config(write(tmp_path, ""))):
        assert set(cfg.channels) == {"web"}
        assert dict(cfg.agents) == {}
        assert dict(cfg.people) == {}


# --- every class of error, with file and path ----------------------------------------------------


def test_unknown_channel_type(tmp_path: Path) -> None:
    body = doc()
    body["channels"]["pager"] = {"type": "carrier-pigeon"}
    assert_one_problem(
        tmp_path, body, "channels.pager.type", "unknown channel type 'carrier-pigeon'", "fake", "web"
    )


def test_channel_without_a_type(tmp_path: Path) -> None:
    body = doc()
    body["channels"]["pager"] = {"url": "x"}
    assert_one_problem(tmp_path, body, "channels.pager.type", "unknown channel type None")


def test_unknown_field_in_a_channel(tmp_path: Path) -> None:
    body = doc()
    body["channels"]["chat"]["colour"] = "blue"
    path, problems = problems_of(tmp_path, body)
    assert problems[0].startswith(f"{path}: channels.chat.colour: unknown key; the keys here are `type`")


def test_an_invalid_channel_is_not_also_reported_as_missing(tmp_path: Path) -> None:
    """The gate's channel exists but is invalid: report the channel, not "no channel named"."""
    body = doc()
    body["channels"]["chat"]["colour"] = "blue"
    assert_one_problem(tmp_path, body, "channels.chat.colour", "unknown key")


def test_gate_naming_an_unknown_channel(tmp_path: Path) -> None:
    assert_one_problem(tmp_path, doc(gate(channel="ghost")), f"{AGENT}.channel", "no channel named 'ghost'")


def test_gate_may_use_the_builtin_web_channel(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, doc(gate(channel="web"))))
    assert cfg.agents["finance-bot"].hooks[0].channel == "web"


@pytest.mark.parametrize("when", ["args.amount >=", "args.amount >= 'x", "args[", "&& true"])
def test_bad_cel_in_when(tmp_path: Path, when: str) -> None:
    assert_one_problem(tmp_path, doc(gate(when=when)), f"{AGENT}.when", "invalid CEL condition")


READS = "a condition reads args, tool, agent, user and metadata"
CEL_WORDS = {
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
}


def test_config_check_refuses_a_condition_reading_an_undeclared_name(tmp_path: Path) -> None:
    path = write(tmp_path, doc(gate(when="arguments.amount >= 50000")))
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"{path}: {AGENT}.when: unknown name in the condition: 'arguments' (did you mean 'args'?); {READS}\n"
    )


@pytest.mark.parametrize(
    ("when", "named"),
    [
        ("argz.amount > 1 && tol == 'pay'", "'argz' (did you mean 'args'?), 'tol' (did you mean 'tool'?)"),
        ("user_id == 'carol'", "'user_id' (did you mean 'user'?)"),
        ("metdata.env == 'prod'", "'metadata'"),
        ("args.items.all(x, x > limit)", "'limit'"),
        ("amount >= 50000", "'amount'"),
    ],
)
def test_every_unknown_name_of_a_condition_is_named(when: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(gate(when=when)), source="signoff.yaml")
    [problem] = info.value.problems
    assert problem.startswith(f"signoff.yaml: {AGENT}.when: unknown name")
    assert named in problem
    assert problem.endswith(READS)


@pytest.mark.parametrize(
    "when",
    [
        "has(args.amount) && args.amount >= 50000",
        "args.items.all(x, x > 0) && args.tags.exists(t, t == 'urgent')",
        "[1, 2].map(n, n * 2).filter(m, m > 2).size() > 0 && args.xs.exists_one(e, e == tool)",
        'tool.startsWith("pay") && agent == "finance-bot" && user != "" && metadata.env == "prod"',
    ],
)
def test_conditions_over_the_declared_names_load(when: str) -> None:
    hook = parse_config(doc(gate(when=when))).agents["finance-bot"].hooks[0]
    assert isinstance(hook, ConfirmationGate)
    assert hook.when == when


@settings(max_examples=60, deadline=None)
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True))
def test_any_name_but_the_declared_ones_is_refused(name: str) -> None:
    declared = {"args", "tool", "agent", "user", "metadata"}
    try:
        cfg = parse_config(doc(gate(when=f"{name}.amount >= 1")), source="signoff.yaml")
    except ConfigError as exc:
        [problem] = exc.problems
        if name in CEL_WORDS:
            assert "invalid CEL condition" in problem
        else:
            assert problem.startswith(f"signoff.yaml: {AGENT}.when: unknown name in the condition: {name!r}")
    else:
        assert name in declared, cfg


def test_second_hook_of_an_agent_is_named_by_index(tmp_path: Path) -> None:
    body = doc(gate(), gate(tools=["wire_*"], when="args.x >"))
    assert_one_problem(tmp_path, body, "agents.finance-bot.hooks[1].when", "invalid CEL")


def test_quorum_larger_than_the_approvers(tmp_path: Path) -> None:
    assert_one_problem(tmp_path, doc(gate(quorum=3)), AGENT, "quorum 3", "2 approver")


def test_quorum_with_no_approvers_listed_is_allowed(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, doc(gate(approvers=[], quorum=2))))
    assert cfg.agents["finance-bot"].hooks[0].quorum == 2


@pytest.mark.parametrize("quorum", [0, -1])
def test_quorum_below_one(tmp_path: Path, quorum: int) -> None:
    assert_one_problem(tmp_path, doc(gate(quorum=quorum)), f"{AGENT}.quorum", "greater than or equal to 1")


def test_gate_without_tools(tmp_path: Path) -> None:
    assert_one_problem(tmp_path, doc(gate(tools=[])), f"{AGENT}.tools", "at least 1")


def test_unknown_hook_type(tmp_path: Path) -> None:
    assert_one_problem(tmp_path, doc(gate(type="rate_limiter")), AGENT, "unknown hook type 'rate_limiter'")


def test_unknown_field_in_a_gate(tmp_path: Path) -> None:
    assert_one_problem(
        tmp_path, doc(gate(approver=["alice"])), f"{AGENT}.approver", "unknown key; did you mean `approvers`?"
    )


def test_unknown_top_level_key(tmp_path: Path) -> None:
    assert_one_problem(tmp_path, doc(chanels={}), "chanels", "unknown key; did you mean `channels`?")


def test_top_level_that_is_not_a_mapping(tmp_path: Path) -> None:
    path, problems = problems_of(tmp_path, "- a\n- b\n")
    assert problems == [f"{path}: (top level): expected a mapping with channels, people and agents"]


@pytest.mark.parametrize("timeout", ["soon", "1w", "1.5h", "", "0", "-5m"])
def test_bad_timeout(tmp_path: Path, timeout: str) -> None:
    assert_one_problem(tmp_path, doc(gate(timeout=timeout)), f"{AGENT}.timeout")


def test_bad_timeout_says_what_to_write(tmp_path: Path) -> None:
    assert_one_problem(
        tmp_path, doc(gate(timeout="soon")), f"{AGENT}.timeout", "'soon' is not a duration", "30m"
    )


@pytest.mark.parametrize(
    ("timeout", "expected"), [("45s", 45), ("2h", 7200), ("1d", 86400), (90, 90), ("90", 90)]
)
def test_timeouts_that_load(tmp_path: Path, timeout: Any, expected: int) -> None:
    cfg = load_config(write(tmp_path, doc(gate(timeout=timeout))))
    assert cfg.agents["finance-bot"].hooks[0].timeout == timedelta(seconds=expected)


OTHER_HOOKS = [
    {"type": "readonly_guard"},
    {"type": "rate_limit", "limit": 5},
    {"type": "result_truncate"},
    {"type": "audit_log"},
    {"type": "context_inject", "text": "Be brief."},
]


@pytest.mark.parametrize("hook", OTHER_HOOKS, ids=lambda h: str(h["type"]))
def test_every_other_hook_takes_a_timeout_of_its_own(tmp_path: Path, hook: dict[str, Any]) -> None:
    default = load_config(write(tmp_path, doc(hook))).agents["finance-bot"].hooks[0]
    assert default.time_limit is None, "the hook registry's default"
    two = load_config(write(tmp_path, doc({**hook, "timeout": "2s"}))).agents["finance-bot"].hooks[0]
    assert two.time_limit == 2.0
    assert_one_problem(tmp_path, doc({**hook, "timeout": "2m"}), f"{AGENT}.timeout", "at most 60s")
    assert_one_problem(tmp_path, doc({**hook, "timeout": "0"}), f"{AGENT}.timeout", "must be positive")


def test_a_gates_timeout_is_its_approvers_deadline_not_its_own(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, doc(gate(timeout="2h"))))
    hook = cfg.agents["finance-bot"].hooks[0]
    assert hook.timeout == timedelta(hours=2)
    assert hook.time_limit is None, "the gate asks within the hook registry's default"


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    body = doc(gate(quorum=0, timeout="soon"), gate(tools=["x"], when="(("))
    body["surprise"] = 1
    path, problems = problems_of(tmp_path, body)
    wheres = sorted(p.removeprefix(f"{path}: ").split(": ")[0] for p in problems)
    assert wheres == [f"{AGENT}.quorum", f"{AGENT}.timeout", "agents.finance-bot.hooks[1].when", "surprise"]


def test_several_channel_and_gate_problems_are_reported_together(tmp_path: Path) -> None:
    body = doc(gate(channel="ghost"), gate(channel="pager"))
    body["channels"]["pager"] = {"type": "nope"}
    path, problems = problems_of(tmp_path, body)
    known = ", ".join(sorted(CHANNEL_TYPES))
    assert f"{path}: channels.pager.type: unknown channel type 'nope' (known: {known})" in problems
    assert (
        f"{path}: {AGENT}.channel: no channel named 'ghost' under channels; "
        "name one of chat, web or declare it" in problems
    )
    assert all(p.startswith(f"{path}: ") for p in problems)


# --- approvers on a channel type with raw user ids (slack) ---------------------------------------


def slack_doc(approvers: list[str], people: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "channels": {"ops": {"type": "slack", "token": "xoxb-1"}},
        "people": people if people is not None else {"alice": {"slack": "U0ALICE"}},
        "agents": {"finance-bot": {"hooks": [gate(channel="ops", approvers=approvers, quorum=1)]}},
    }


@pytest.mark.usefixtures("slack_type")
def test_slack_approvers_may_be_people_or_raw_user_ids(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, slack_doc(["alice", "U0BOB123", "W0ENTERPRISE"])))
    assert cfg.agents["finance-bot"].hooks[0].approvers == ("alice", "U0BOB123", "W0ENTERPRISE")


@pytest.mark.usefixtures("slack_type")
@pytest.mark.parametrize("approver", ["mallory", "u0lower", "U0", "C0CHANNEL"])
def test_slack_approver_neither_a_person_nor_a_user_id(tmp_path: Path, approver: str) -> None:
    assert_one_problem(
        tmp_path,
        slack_doc(["alice", approver]),
        f"{AGENT}.approvers[1]",
        f"{approver!r} is neither in people nor a slack user id",
    )


@pytest.mark.usefixtures("slack_type")
def test_slack_approver_from_people_without_a_slack_id(tmp_path: Path) -> None:
    people = {"alice": {"slack": "U0ALICE"}, "bob": {"feishu": "ou_bob"}}
    assert_one_problem(
        tmp_path,
        slack_doc(["alice", "bob"], people),
        f"{AGENT}.approvers[1]",
        "'bob' has no slack id",
        "people.bob",
    )


def feishu_doc(approvers: list[str]) -> dict[str, Any]:
    return {
        "channels": {
            "finance": {
                "type": "feishu",
                "app_id": "cli_x",
                "app_secret": "${SIGNOFF_TEST_FEISHU_SECRET}",
                "verification_token": "vt",
                "encrypt_key": "ek",
                "chat_id": "oc_x",
            }
        },
        "people": {"alice": {"feishu": "ou_alice1"}, "bob": {"slack": "U0BOB"}},
        "agents": {"finance-bot": {"hooks": [gate(channel="finance", approvers=approvers, quorum=1)]}},
    }


@pytest.fixture
def feishu_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNOFF_TEST_FEISHU_SECRET", "feishu-app-secret")


@pytest.mark.usefixtures("feishu_secret")
def test_feishu_approvers_may_be_people_or_open_ids(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, feishu_doc(["alice", "ou_abc123", "on_def456"])))
    assert cfg.channel_type("finance") == "feishu"
    secret = cfg.channels["finance"].app_secret  # type: ignore[attr-defined]
    assert secret.get_secret_value() == "feishu-app-secret"
    assert cfg.agents["finance-bot"].hooks[0].approvers == ("alice", "ou_abc123", "on_def456")


@pytest.mark.usefixtures("feishu_secret")
def test_feishu_approver_problems(tmp_path: Path) -> None:
    path, problems = problems_of(tmp_path, feishu_doc(["alice", "bob", "mallory", "U0SLACKID"]))
    assert problems == [
        f"{path}: {AGENT}.approvers[1]: 'bob' has no feishu id in people; "
        "add `feishu: <user id>` to people.bob",
        f"{path}: {AGENT}.approvers[2]: 'mallory' is neither in people nor a feishu user id; "
        "add them under people",
        f"{path}: {AGENT}.approvers[3]: 'U0SLACKID' is neither in people nor a feishu user id; "
        "add them under people",
    ]


# --- approvers on every channel type: people, operators or ids of that type ----------------------

CHANNEL_BODIES: dict[str, dict[str, Any]] = {
    "web": {"type": "web"},
    "fake": {"type": "fake"},
    "slack": {"type": "slack", "bot_token": "xoxb-1", "signing_secret": "s" * 20, "channel": "C0OPS"},
    "feishu": {
        "type": "feishu",
        "app_id": "cli_x",
        "app_secret": "feishu-app-secret",
        "verification_token": "vt",
        "encrypt_key": "ek",
        "chat_id": "oc_x",
    },
    "email": {"type": "email", "smtp_url": "smtps://u:p@mail.example.com:465", "from": "signoff@example.com"},
    "teams": {
        "type": "teams",
        "app_id": "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f",
        "app_password": "teams-secret",
        "tenant_id": "72f988bf-86f1-41af-91ab-2d7cd011db47",
        "conversation_id": "19:ops@thread.tacv2",
    },
    "ntfy": {"type": "ntfy", "server": "https://ntfy.example.com"},
}
"""A valid channel of each registered type (a new type must be added here)."""
RAW_IDS = {
    "slack": "U0BOB123",
    "feishu": "ou_bob1",
    "email": "bob@example.com",
    "teams": "0b0b0000-0000-4000-8000-0000000000b1",
}
"""A raw user id of each type that gives its ids a form (ntfy's topics are people's only)."""
EVERYONE = {
    "alice": {
        "slack": "U0ALICE",
        "feishu": "ou_alice1",
        "fake": "U_ALICE",
        "email": "alice@example.com",
        "teams": "0a11ce00-0000-4000-8000-0000000000a1",
        "ntfy": "alice-7Qm2",
    },
    "bob": {
        "slack": "U0BOB",
        "feishu": "ou_bob",
        "fake": "U_BOB",
        "email": "bob@example.com",
        "teams": "0b0b0000-0000-4000-8000-0000000000b0",
        "ntfy": "bob-9Xk4",
    },
}
OPERATORS = {
    "ops": {"password_hash": "$argon2id$x"},
    "al": {"password_hash": "$argon2id$y", "person": "alice"},
}


def test_every_channel_type_is_covered() -> None:
    assert set(CHANNEL_BODIES) == set(CHANNEL_TYPES)
    assert set(RAW_IDS) == {
        k for k, t in CHANNEL_TYPES.items() if t.identity.user_id is not None and not t.identity.personal
    }


def on_type(kind: str, approvers: list[str], *, escalated: bool = False) -> dict[str, Any]:
    """A gate on a ``kind`` channel listing ``approvers`` (or a web gate escalating to that
    channel with them)."""
    listed = {"approvers": ["bob"], "escalate": [{"after": "5m", "channel": "here", "approvers": approvers}]}
    return {
        "channels": {"here": CHANNEL_BODIES[kind]},
        "people": EVERYONE,
        "operators": OPERATORS,
        "agents": {
            "finance-bot": {
                "hooks": [
                    gate(channel="web", quorum=1, **listed)
                    if escalated
                    else gate(channel="here", approvers=approvers, quorum=1)
                ]
            }
        },
    }


def one_edit(word: str) -> st.SearchStrategy[str]:
    """``word`` with one letter dropped, doubled, swapped with the next or replaced."""
    letters = st.sampled_from("abcdefghijklmnopqrstuvwxyz")
    at = st.integers(0, len(word) - 1)
    return st.one_of(
        at.map(lambda i: word[:i] + word[i + 1 :]),
        at.map(lambda i: word[:i] + word[i] + word[i:]),
        st.integers(0, len(word) - 2).map(lambda i: word[:i] + word[i + 1] + word[i] + word[i + 2 :]),
        st.tuples(at, letters).map(lambda p: word[: p[0]] + p[1] + word[p[0] + 1 :]),
    ).filter(lambda typo: typo != word)


@pytest.mark.parametrize("escalated", [False, True], ids=["gate", "escalation"])
@pytest.mark.parametrize("kind", sorted(CHANNEL_BODIES))
@settings(max_examples=25, deadline=None)
@given(typo=one_edit("alice"))
def test_a_misspelt_approver_is_refused_on_every_channel_type_with_the_name_meant(
    kind: str, escalated: bool, typo: str
) -> None:
    where = f"{AGENT}.escalate[0].approvers[0]" if escalated else f"{AGENT}.approvers[0]"
    with pytest.raises(ConfigError) as info:
        parse_config(on_type(kind, [typo, "bob"], escalated=escalated), source="signoff.yaml")
    what = f"{'an' if kind == 'email' else 'a'} {kind} user id" if kind in RAW_IDS else "an operator"
    assert info.value.problems == [
        f"signoff.yaml: {where}: {typo!r} is neither in people nor {what}; did you mean 'alice'?"
    ]


@pytest.mark.parametrize("escalated", [False, True], ids=["gate", "escalation"])
@pytest.mark.parametrize("kind", sorted(CHANNEL_BODIES))
def test_people_and_operators_are_approvers_on_every_channel_type(kind: str, escalated: bool) -> None:
    approvers = ["alice", "bob", "ops"]
    cfg = parse_config(on_type(kind, approvers, escalated=escalated))
    hook = cfg.agents["finance-bot"].hooks[0]
    assert isinstance(hook, ConfirmationGate)
    assert (hook.escalate[0].approvers if escalated else hook.approvers) == tuple(approvers)


@pytest.mark.parametrize("kind", sorted(CHANNEL_BODIES))
def test_a_raw_id_is_an_approver_only_where_it_has_the_types_form(kind: str) -> None:
    if kind in RAW_IDS:
        hook = parse_config(on_type(kind, [RAW_IDS[kind]])).agents["finance-bot"].hooks[0]
        assert isinstance(hook, ConfirmationGate)
        assert hook.approvers == (RAW_IDS[kind],)
    for raw in ["U0BOB123", "ou_bob1", "someone-else"]:
        if kind in RAW_IDS and CHANNEL_TYPES[kind].identity.is_user_id(raw):
            continue
        with pytest.raises(ConfigError) as info:
            parse_config(on_type(kind, [raw]), source="signoff.yaml")
        [problem] = info.value.problems
        assert problem.startswith(f"signoff.yaml: {AGENT}.approvers[0]: {raw!r} is neither in people nor ")


@pytest.mark.parametrize(
    ("approver", "meant"),
    [
        ("Alice", "'alice'"),  # another spelling of a key: the key is what to write
        ("alice@example.com", "'alice'"),
        ("U_ALICE", "'alice'"),
        ("opz", "'ops'"),
        ("al", None),
        ("zed", None),
    ],
)
def test_on_web_a_person_is_named_by_their_key(approver: str, meant: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(on_type("web", [approver]), source="signoff.yaml")
    [problem] = info.value.problems
    where = f"signoff.yaml: {AGENT}.approvers[0]: "
    if approver == "al":
        assert problem == f"{where}'al' is an operator who decides as 'alice'; list 'alice' instead"
    elif meant is None:
        assert problem == f"{where}{approver!r} is neither in people nor an operator; add them under people"
    else:
        assert problem == f"{where}{approver!r} is neither in people nor an operator; did you mean {meant}?"


def test_config_check_refuses_a_misspelt_approver_in_one_line(tmp_path: Path) -> None:
    body = doc(gate(channel="web", approvers=["alcie", "bob"]))
    path = write(tmp_path, body)
    done = signoff("config", "check", str(path))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"{path}: {AGENT}.approvers[0]: 'alcie' is neither in people nor an operator; did you mean 'alice'?\n"
    )


# --- ${ENV_VAR} ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("slack_type")
def test_env_vars_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNOFF_TEST_BOT_TOKEN", "xoxb-from-env")
    monkeypatch.setenv("SIGNOFF_TEST_ALICE", "U0ALICE")
    monkeypatch.setenv("SIGNOFF_TEST_ZONE", "eu")
    body = slack_doc(["alice"], {"alice": {"slack": "${SIGNOFF_TEST_ALICE}"}})
    body["channels"]["ops"]["token"] = "${SIGNOFF_TEST_BOT_TOKEN}"
    body["agents"]["finance-bot"]["hooks"][0]["tools"] = ["pay_${SIGNOFF_TEST_ZONE}_*"]

    cfg = load_config(write(tmp_path, body))

    token = cfg.channels["ops"].token  # type: ignore[attr-defined]
    assert isinstance(token, SecretStr)
    assert token.get_secret_value() == "xoxb-from-env"
    assert cfg.people["alice"].ids() == {"slack": "U0ALICE"}
    assert cfg.agents["finance-bot"].hooks[0].tools == ("pay_eu_*",)


def test_unset_env_var_names_the_path_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIGNOFF_TEST_UNSET", raising=False)
    body = doc()
    body["people"]["alice"]["fake"] = "${SIGNOFF_TEST_UNSET}"
    assert_one_problem(
        tmp_path, body, "people.alice.fake", "environment variable SIGNOFF_TEST_UNSET is not set"
    )


def test_unset_env_var_inside_a_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIGNOFF_TEST_UNSET", raising=False)
    assert_one_problem(
        tmp_path,
        doc(gate(tools=["pay_*", "x_${SIGNOFF_TEST_UNSET}"])),
        f"{AGENT}.tools[1]",
        "SIGNOFF_TEST_UNSET",
    )


def test_env_var_set_to_empty_is_expanded_not_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIGNOFF_TEST_EMPTY", "")
    body = doc()
    body["people"]["alice"]["email"] = "a${SIGNOFF_TEST_EMPTY}@example.com"
    assert load_config(write(tmp_path, body)).people["alice"].email == "a@example.com"


# --- the file itself ------------------------------------------------------------------------------


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    text = "channels:\n  chat:\n    type: fake\npeople: [alice\nagents: {}\n"
    path, problems = problems_of(tmp_path, text)
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}: line ")
    assert "not valid YAML" in problems[0]
    line = int(problems[0].removeprefix(f"{path}: line ").split(",")[0])
    assert line in (4, 5), problems[0]


def test_tab_indentation_names_the_line(tmp_path: Path) -> None:
    path, problems = problems_of(tmp_path, "channels:\n  chat:\n\ttype: fake\n")
    assert problems[0].startswith(f"{path}: line 3, column 1: not valid YAML"), problems


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: cannot read the file: No such file or directory"]


def test_a_directory_is_not_readable_as_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{tmp_path}: cannot read the file: ")


def test_parse_config_uses_the_given_source_name() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(gate(quorum=0)), source="inline.yaml")
    assert info.value.problems[0].startswith(f"inline.yaml: {AGENT}.quorum: ")


# --- `signoff config check FILE` ------------------------------------------------------------------


def test_config_check_ok(tmp_path: Path) -> None:
    path = write(tmp_path, DEFAULT_CONFIG)
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines() == [f"{path}: ok (2 channels, 3 people, 2 agents, 3 gates)"]
    assert result.stderr.strip().splitlines() == [
        f"warning: {path}: agents.finance-bot.hooks[2].approvers: none listed, so anyone in the "
        "channel 'chat' may approve; list the people who may",
    ]


def test_config_check_warns_of_gates_anyone_may_approve(tmp_path: Path) -> None:
    body = copy.deepcopy(DEFAULT_CONFIG)
    body["agents"]["other-bot"]["hooks"] = [
        {"type": "confirmation_gate", "tools": ["*"], "channel": "web"},
        {"type": "confirmation_gate", "tools": ["x"], "channel": "chat", "approvers": ["alice"]},
    ]
    path = write(tmp_path, body)
    done = signoff("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{path}: ok")
    assert done.stderr.splitlines() == [
        f"warning: {path}: agents.finance-bot.hooks[2].approvers: none listed, so anyone in the "
        "channel 'chat' may approve; list the people who may",
        f"warning: {path}: agents.other-bot.hooks[0].approvers: none listed, so any operator may "
        "approve; list the people who may",
    ]


def test_config_check_lists_every_problem_on_stderr(tmp_path: Path) -> None:
    body = doc(gate(quorum=0), gate(timeout="soon"))
    body["bogus"] = True
    path = write(tmp_path, body)
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3
    assert f"{path}: {AGENT}.quorum: Input should be greater than or equal to 1" in lines
    assert any(line.startswith(f"{path}: agents.finance-bot.hooks[1].timeout: 'soon'") for line in lines)
    assert any(line.startswith(f"{path}: bogus: unknown key; the keys here are `channels`") for line in lines)


@pytest.mark.usefixtures("feishu_secret")
def test_config_check_refuses_token_only_feishu_unless_asked_for_and_then_warns(tmp_path: Path) -> None:
    body = feishu_doc(["alice"])
    del body["channels"]["finance"]["encrypt_key"]
    refused = CliRunner().invoke(cli_app, ["config", "check", str(write(tmp_path, body, "token.yaml"))])
    assert refused.exit_code == 1
    assert "channels.finance: " in refused.stderr
    assert "allow_unsigned: true" in refused.stderr

    body["channels"]["finance"]["allow_unsigned"] = True
    path = write(tmp_path, body, "unsigned.yaml")
    warned = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert warned.exit_code == 0, warned.output
    assert warned.stdout.startswith(f"{path}: ok")
    [line] = warned.stderr.strip().splitlines()
    assert line.startswith(f"warning: {path}: channels.finance.allow_unsigned: ")
    assert "verification token alone" in line


def test_config_check_real_command(tmp_path: Path) -> None:
    good = write(tmp_path, DEFAULT_CONFIG, "good.yaml")
    bad = write(tmp_path, doc(gate(channel="ghost")), "bad.yaml")
    ok = subprocess.run(
        [str(SIGNOFF), "config", "check", str(good)], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"{good}: ok")
    failed = subprocess.run(
        [str(SIGNOFF), "config", "check", str(bad)], capture_output=True, text=True, check=False
    )
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert failed.stderr.strip() == (
        f"{bad}: {AGENT}.channel: no channel named 'ghost' under channels; "
        "name one of chat, web or declare it"
    )
    missing = subprocess.run(
        [str(SIGNOFF), "config", "check", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1
    assert "cannot read the file" in missing.stderr


@pytest.mark.parametrize(
    ("gate", "problem"),
    [
        (
            {"grants": [{"scope": "forever", "for": "1h"}]},
            "grants[0].scope: Input should be 'session' or 'agent'",
        ),
        ({"grants": [{"scope": "session", "for": "1 hour"}]}, "grants[0].for: '1 hour' is not a duration"),
        ({"grants": [{"scope": "session"}]}, "grants[0].for: missing: this key is required"),
        (
            {"grants": [{"scope": "session", "for": "1h", "same": ["to", "to"]}]},
            "grants[0].same: to named more than once",
        ),
        (
            {"grants": [{"scope": "session", "for": "1h", "same": [""]}]},
            "grants[0].same: '' is not an argument field name",
        ),
        (
            {"grants": [{"scope": "agent", "for": "1h"}, {"scope": "agent", "for": "60m"}]},
            "grants: grants[1] offers the same grant as grants[0]",
        ),
        (
            {"grants": [{"scope": "agent", "for": f"{i}h"} for i in range(1, 6)]},
            "grants: a gate offers at most 4 grants",
        ),
        ({"grants": {"scope": "agent", "for": "1h"}}, "grants: a list of grants"),
        (
            {"grants": [{"scope": "agent", "for": "1h", "until": "x"}]},
            "grants[0].until: unknown key",
        ),
        ({"approval_valid_for": "soon"}, "approval_valid_for: 'soon' is not a duration"),
    ],
)
def test_grant_offers_and_approval_valid_for_are_checked(gate: dict[str, Any], problem: str) -> None:
    raw = {
        "channels": {"chat": {"type": "fake"}},
        "agents": {
            "bot": {"hooks": [{"type": "confirmation_gate", "tools": ["x"], "channel": "chat", **gate}]}
        },
    }
    with pytest.raises(ConfigError) as exc:
        parse_config(raw, source="s.yaml")
    [found] = exc.value.problems
    assert found.startswith(f"s.yaml: agents.bot.hooks[0].{problem}"), found


def test_a_gate_offering_grants_loads() -> None:
    raw = {
        "channels": {"chat": {"type": "fake"}},
        "agents": {
            "bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "tools": ["x"],
                        "channel": "chat",
                        "approval_valid_for": "5m",
                        "grants": [
                            {"scope": "session", "for": "1h", "same": ["to"]},
                            {"scope": "agent", "for": 1800},
                        ],
                    }
                ]
            }
        },
    }
    [gate] = parse_config(raw).agents["bot"].hooks
    assert isinstance(gate, ConfirmationGate)
    assert gate.approval_valid_for.total_seconds() == 300
    assert [o.choice.as_dict() for o in gate.grants] == [
        {"scope": "session", "seconds": 3600, "same": ["to"]},
        {"scope": "agent", "seconds": 1800, "same": []},
    ]


def test_config_check_names_a_bad_grant(tmp_path: Path) -> None:
    path = tmp_path / "signoff.yaml"
    raw = {
        "channels": {"chat": {"type": "fake"}},
        "agents": {
            "bot": {
                "hooks": [
                    {
                        "type": "confirmation_gate",
                        "tools": ["x"],
                        "channel": "chat",
                        "approvers": ["U0X"],
                        "grants": [{"scope": "team", "for": "1h"}],
                    }
                ]
            }
        },
    }
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert (
        f"{path}: agents.bot.hooks[0].grants[0].scope: Input should be 'session' or 'agent'" in result.output
    )


# --- reminders and escalation -------------------------------------------------------------------


def with_pager(*gates: dict[str, Any]) -> dict[str, Any]:
    body = doc(*gates)
    body["channels"]["pager"] = {"type": "fake"}
    body["people"]["carol"] = {"fake": "U_CAROL"}
    return body


def test_reminders_and_escalations_load() -> None:
    config = parse_config(
        with_pager(
            gate(
                timeout="30m",
                remind=["50%", "90%", "10m", 60],
                escalate=[{"after": "15m", "channel": "pager", "approvers": ["carol"]}],
            )
        )
    )
    [loaded] = config.agents["finance-bot"].hooks
    assert isinstance(loaded, ConfirmationGate)
    assert [p.due(loaded.timeout) for p in loaded.remind] == [
        timedelta(minutes=15),
        timedelta(minutes=27),
        timedelta(minutes=10),
        timedelta(minutes=1),
    ]
    assert [str(p) for p in loaded.remind] == ["50%", "90%", "10m", "1m"]
    [step] = loaded.escalate
    assert (step.after, step.channel, step.approvers) == (timedelta(minutes=15), "pager", ("carol",))


@pytest.mark.parametrize(
    ("overrides", "where", "fragments"),
    [
        ({"remind": ["0%"]}, f"{AGENT}.remind[0]", ("between 0% and 100%", "50%")),
        ({"remind": ["50%", "100%"]}, f"{AGENT}.remind[1]", ("between 0% and 100%",)),
        ({"remind": ["150 %"]}, f"{AGENT}.remind[0]", ("between 0% and 100%",)),
        ({"remind": ["half"]}, f"{AGENT}.remind[0]", ("not a duration", "50%")),
        ({"remind": [True]}, f"{AGENT}.remind[0]", ("share of the timeout",)),
        (
            {"remind": ["30m"]},
            f"{AGENT}.remind[0]",
            ("at or after the gate's timeout (30m)", "remind before it"),
        ),
        ({"remind": ["45m"]}, f"{AGENT}.remind[0]", ("at or after the gate's timeout",)),
        ({"remind": ["50%", "15m"]}, f"{AGENT}.remind[1]", ("same time as remind[0]", "drop one")),
        ({"remind": ["1m"] * 11}, f"{AGENT}.remind", ("at most 10",)),
        (
            {"escalate": [{"after": "30m", "channel": "pager", "approvers": ["carol"]}]},
            f"{AGENT}.escalate[0].after",
            ("at or after the gate's timeout (30m)", "escalate earlier or raise the timeout"),
        ),
        (
            {"escalate": [{"after": "10m", "channel": "mail", "approvers": ["carol"]}]},
            f"{AGENT}.escalate[0].channel",
            ("no channel named 'mail'", "name one of chat, pager, web"),
        ),
        (
            {"escalate": [{"after": "10m", "channel": "pager", "approvers": ["zed"]}]},
            f"{AGENT}.escalate[0].approvers[0]",
            ("'zed' is neither in people nor an operator", "add them under people"),
        ),
        (
            {"escalate": [{"after": "soon", "channel": "pager"}]},
            f"{AGENT}.escalate[0].after",
            ("not a duration",),
        ),
        (
            {"escalate": [{"after": "10m", "channel": "pager", "to": ["carol"]}]},
            f"{AGENT}.escalate[0].to",
            ("unknown key",),
        ),
    ],
)
def test_reminder_and_escalation_problems(
    tmp_path: Path, overrides: dict[str, Any], where: str, fragments: tuple[str, ...]
) -> None:
    problem = assert_one_problem(tmp_path, with_pager(gate(timeout="30m", **overrides)), where, *fragments)
    assert "\n" not in problem


@pytest.mark.usefixtures("slack_type")
def test_an_escalation_approver_needs_an_id_on_the_escalation_channel(tmp_path: Path) -> None:
    body = with_pager(gate(escalate=[{"after": "5m", "channel": "oncall", "approvers": ["carol", "Uxyz"]}]))
    body["channels"]["oncall"] = {"type": "slack", "token": "t"}
    path, problems = problems_of(tmp_path, body)
    assert problems == [
        f"{path}: {AGENT}.escalate[0].approvers[0]: 'carol' has no slack id in people; "
        "add `slack: <user id>` to people.carol",
        f"{path}: {AGENT}.escalate[0].approvers[1]: 'Uxyz' is neither in people nor a slack user id; "
        "add them under people",
    ]


def test_config_check_names_a_bad_reminder_and_escalation(tmp_path: Path) -> None:
    body = with_pager(
        gate(
            timeout="10m", remind=["120%"], escalate=[{"after": "1h", "channel": "nowhere", "approvers": []}]
        )
    )
    path = write(tmp_path, body)
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"{path}: {AGENT}.remind[0]: '120%' is not a share of the timeout between 0% and 100% (both "
        "excluded); write e.g. 50%, or a duration such as 10m",
    ]
    body = with_pager(gate(timeout="10m", escalate=[{"after": "1h", "channel": "nowhere", "approvers": []}]))
    path = write(tmp_path, body)
    result = CliRunner().invoke(cli_app, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"{path}: {AGENT}.escalate[0].after: 1h is at or after the gate's timeout (10m), so it could never "
        "happen; escalate earlier or raise the timeout",
        f"{path}: {AGENT}.escalate[0].channel: no channel named 'nowhere' under channels; name one of chat, "
        "pager, web or declare it",
    ]


def test_an_unset_variable_is_one_problem_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIGNOFF_TEST_UNSET_SMTP", raising=False)
    raw = {
        "channels": {
            "mail": {"type": "email", "smtp_url": "${SIGNOFF_TEST_UNSET_SMTP}", "from": "x@example.com"}
        }
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="s.yaml")
    assert caught.value.problems == [
        "s.yaml: channels.mail.smtp_url: environment variable SIGNOFF_TEST_UNSET_SMTP is not set; "
        "export SIGNOFF_TEST_UNSET_SMTP=… where the server (and signoff) runs"
    ]


def test_a_misspelt_channel_lists_the_channels_and_an_email_id_takes_its_article() -> None:
    raw = {
        "people": {"alice": {"name": "A", "email": "a@example.com"}},
        "channels": {
            "mail": {"type": "email", "smtp_url": "smtp://127.0.0.1:25?starttls=false", "from": "x@e.com"}
        },
        "agents": {
            "bot": {
                "hooks": [
                    {"type": "confirmation_gate", "tools": ["x"], "channel": "slak", "approvers": ["alice"]},
                    {"type": "confirmation_gate", "tools": ["x"], "channel": "mail", "approvers": ["alcie"]},
                ]
            }
        },
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, source="s.yaml")
    assert caught.value.problems == [
        "s.yaml: agents.bot.hooks[0].channel: no channel named 'slak' under channels; "
        "name one of mail, web or declare it",
        "s.yaml: agents.bot.hooks[1].approvers[0]: 'alcie' is neither in people nor an email user id; "
        "did you mean 'alice'?",
    ]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_misspelt_key_is_named_with_the_key_it_misspells(data: st.DataObject) -> None:
    """Any key of a gate, the top level or an agent with one letter dropped or doubled is
    refused as an unknown key, naming the key it misspells and listing those allowed there."""
    spots: list[tuple[list[str], str, list[str]]] = [
        (
            ["agents", "finance-bot", "hooks", "0"],
            "agents.finance-bot.hooks[0]",
            sorted(ConfirmationGate.model_fields),
        ),
        ([], "", ["agents", "channels", "operators", "people", "redact", "version", "webhooks"]),
        (["agents", "finance-bot"], "agents.finance-bot", ["hooks", "redact"]),
    ]
    path, where, keys = data.draw(st.sampled_from(spots))
    key = data.draw(st.sampled_from([k for k in keys if len(k) > 4]))
    i = data.draw(st.integers(1, len(key) - 1))
    typo = data.draw(st.sampled_from([key[:i] + key[i + 1 :], key[:i] + key[i] + key[i:]]))
    assume(typo not in keys)
    body = doc()
    node: Any = body
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[typo] = node.get(key, 1)
    with pytest.raises(ConfigError) as info:
        parse_config(body)
    [problem] = [p for p in info.value.problems if f"{typo}:" in p]
    assert problem.startswith(
        f"<config>: {where + '.' if where else ''}{typo}: unknown key; did you mean `{key}`?"
    )
    assert all(f"`{k}`" in problem for k in keys)
