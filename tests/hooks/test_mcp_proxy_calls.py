"""The MCP proxy's command line, per-call bookkeeping and capability checks, with no process or network."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.types import (
    ClientCapabilities,
    CreateMessageRequest,
    CreateMessageRequestParams,
    ElicitationCapability,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    InputRequest,
    ListRootsRequest,
    SamplingCapability,
    SamplingMessage,
    SamplingToolsCapability,
    TextContent,
    Tool,
    UrlElicitationCapability,
)

from signoff.hooks._gate import canonical_json
from signoff.hooks.mcp_proxy import DEFAULT_HOLD, ConfigError, parse_args
from signoff.hooks.mcp_proxy._calls import (
    CallLedger,
    Claim,
    gated_tool_name,
    waiting_text,
)
from signoff.hooks.mcp_proxy._clients import refusal


def test_gated_names_follow_claude_code() -> None:
    assert gated_tool_name("github", "create_issue") == "mcp__github__create_issue"


def test_canonical_arguments_ignore_key_order() -> None:
    assert canonical_json({"b": 1, "a": {"d": 2, "c": 3}}) == '{"a":{"c":3,"d":2},"b":1}'


def test_a_parked_call_is_taken_over_by_its_retry() -> None:
    ledger = CallLedger("up")
    session = ledger.session(None)
    first = ledger.claim("pay", {"amount": 1, "to": "x"}, session)
    ledger.park(first)
    retry = ledger.claim("pay", {"to": "x", "amount": 1}, session)
    assert retry == first
    assert ledger.parked == 0


def test_a_call_that_ended_is_not_reused() -> None:
    ledger = CallLedger("up")
    first = ledger.claim("pay", {"amount": 1}, ledger.session(None))
    again = ledger.claim("pay", {"amount": 1}, ledger.session(None))
    assert again.call == first.call
    assert again.key != first.key


def test_concurrent_identical_calls_get_keys_of_their_own() -> None:
    ledger = CallLedger("up")
    session = ledger.session(None)
    parked = ledger.claim("pay", {"amount": 1}, session)
    ledger.park(parked)
    one = ledger.claim("pay", {"amount": 1}, session)
    two = ledger.claim("pay", {"amount": 1}, session)
    assert one.key == parked.key
    assert two.key != one.key


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("pay", {"amount": 1}, None), ("pay", {"amount": 2}, None)),
        (("pay", {"amount": 1}, None), ("wire", {"amount": 1}, None)),
        (("pay", {"amount": 1}, "s1"), ("pay", {"amount": 1}, "s2")),
        (("pay", {"amount": 1}, None), ("pay", {"amount": 1}, "s1")),
    ],
)
def test_identity_covers_tool_arguments_and_session(
    a: tuple[str, dict[str, int], str | None], b: tuple[str, dict[str, int], str | None]
) -> None:
    ledger = CallLedger("up")
    parked = ledger.claim(a[0], a[1], ledger.session(a[2]))
    ledger.park(parked)
    other = ledger.claim(b[0], b[1], ledger.session(b[2]))
    assert other.call != parked.call
    assert other.key != parked.key
    assert ledger.parked == 1, "a different call does not take over the parked key"


@given(
    tool=st.sampled_from(["pay", "wire"]),
    arguments=st.dictionaries(st.sampled_from("abc"), st.integers(), max_size=3),
    client=st.none() | st.sampled_from(["c1", "c2"]),
    park=st.booleans(),
)
def test_no_two_proxy_processes_share_a_key(
    tool: str, arguments: dict[str, int], client: str | None, park: bool
) -> None:
    """Each process has a ledger of its own: the same call in the same client session is
    another key in another process (refused, run or left waiting in one, asked anew in the
    next), and another server's calls never share one."""
    earlier, later, other = CallLedger("up"), CallLedger("up"), CallLedger("other")
    first = earlier.claim(tool, arguments, earlier.session(client))
    if park:
        earlier.park(first)
    keys = {
        first.key,
        later.claim(tool, arguments, later.session(client)).key,
        other.claim(tool, arguments, other.session(client)).key,
    }
    assert len(keys) == 3
    assert earlier.session(client) != later.session(client)
    assert all(k.startswith("mcp:") and len(k) <= 500 for k in keys)
    assert all(len(ledger.session(client)) <= 200 for ledger in (earlier, later))


def test_a_renewed_key_is_new() -> None:
    ledger = CallLedger("up")
    session = ledger.session(None)
    first = ledger.claim("pay", {"amount": 1}, session)
    after = ledger.renew(first.call)
    assert after.call == first.call
    assert after.key != first.key
    assert ledger.claim("pay", {"amount": 1}, session).key not in {first.key, after.key}


@given(st.lists(st.sampled_from(["claim", "park", "renew"]), max_size=40))
def test_no_two_unparked_claims_share_a_key(steps: list[str]) -> None:
    """Whatever mix of new calls, parked calls and renewed keys: a key is handed out again
    only to the retry of a parked call."""
    ledger = CallLedger("up")
    session = ledger.session(None)
    handed: set[str] = set()
    parked: list[Claim] = []
    last: Claim | None = None
    for step in steps:
        if step == "park" and last is not None:
            ledger.park(last)
            parked.append(last)
            handed.discard(last.key)
            last = None
            continue
        claim = (
            ledger.renew(last.call)
            if step == "renew" and last is not None
            else ledger.claim("pay", {"a": 1}, session)
        )
        if parked and claim.key == parked[0].key:
            parked.pop(0)
        else:
            assert claim.key not in handed
        handed.add(claim.key)
        last = claim


def test_parked_calls_are_bounded() -> None:
    ledger = CallLedger("up", limit=3)
    for i in range(10):
        ledger.park(ledger.claim("pay", {"i": i}, ledger.session(None)))
    assert ledger.parked == 3


def test_the_waiting_text_says_how_to_keep_waiting() -> None:
    text = waiting_text("mcp__up__pay", "r1", 50)
    assert "r1" in text
    assert "same arguments" in text
    assert "has not run" in text


# --------------------------------------------------------------------------- the command line

ENV = {"GITHUB_AUTH": "Bearer ghp_x", "TOKEN": "t0k3n"}


def test_a_stdio_upstream() -> None:
    config = parse_args(["--name", "github", "--", "npx", "-y", "server-github", "--flag"], ENV)
    assert config.command == ("npx", "-y", "server-github", "--flag")
    assert config.url is None
    assert config.hold == DEFAULT_HOLD
    assert config.listen is None
    assert "SIGNOFF_API_KEY" in config.secret_vars


def test_an_http_upstream_takes_its_headers_from_the_environment() -> None:
    config = parse_args(
        ["--name", "gh", "--url", "https://example.com/mcp", "--header-env", "Authorization=GITHUB_AUTH"], ENV
    )
    assert config.url == "https://example.com/mcp"
    assert dict(config.headers) == {"Authorization": "Bearer ghp_x"}


def test_listening_over_http() -> None:
    config = parse_args(["--name", "x", "--listen", "127.0.0.1:8765", "--hold", "5", "--", "srv"], ENV)
    assert config.listen == ("127.0.0.1", 8765)
    assert config.hold == 5
    assert parse_args(["--name", "x", "--listen", "[::1]:9", "--", "srv"], ENV).listen == ("::1", 9)
    beyond = ["--name", "x", "--listen", "0.0.0.0:8765", "--listen-token-env", "TOKEN", "--", "srv"]
    config = parse_args(beyond, ENV)
    assert config.listen_token == "t0k3n"
    assert "TOKEN" in config.secret_vars


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--name", "x"], "name one upstream"),
        (["--name", "x", "--url", "http://h/mcp", "--", "srv"], "name one upstream"),
        (["--name", "has space", "--", "srv"], "--name must be"),
        (["--name", "x", "--url", "ftp://h"], "must start with http"),
        (["--name", "x", "--url", "http://h", "--header-env", "Authorization"], "HEADER=VAR"),
        (["--name", "x", "--url", "http://h", "--header-env", "Authorization=MISSING"], "MISSING is not set"),
        (["--name", "x", "--header-env", "A=GITHUB_AUTH", "--", "srv"], "for a --url upstream"),
        (["--name", "x", "--hold", "-1", "--", "srv"], "--hold"),
        (["--name", "x", "--submit-deadline", "0", "--", "srv"], "--submit-deadline"),
        (["--name", "x", "--listen", "8765", "--", "srv"], "HOST:PORT"),
        (["--name", "x", "--listen", "0.0.0.0:8765", "--", "srv"], "--listen-token-env"),
        (["--name", "x", "--listen-token-env", "TOKEN", "--", "srv"], "goes with --listen"),
    ],
)
def test_unusable_command_lines_are_refused_with_the_fix(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_args(argv, ENV)


FORM = ElicitRequest(params=ElicitRequestFormParams(message="ok?", requested_schema={"type": "object"}))
URL = ElicitRequest(
    params=ElicitRequestURLParams(message="go", url="https://example.com", elicitation_id="e")
)
TOOLS = CreateMessageRequest(
    params=CreateMessageRequestParams(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))],
        max_tokens=5,
        tools=[Tool(name="t", input_schema={"type": "object"})],
    )
)


@pytest.mark.parametrize(
    ("request_", "capabilities", "refused"),
    [
        (FORM, ClientCapabilities(elicitation=ElicitationCapability()), None),
        (URL, ClientCapabilities(elicitation=ElicitationCapability()), "URL-mode elicitation not supported"),
        (URL, ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())), None),
        (
            FORM,
            ClientCapabilities(elicitation=ElicitationCapability(url=UrlElicitationCapability())),
            "Form-mode elicitation not supported",
        ),
        (
            TOOLS,
            ClientCapabilities(sampling=SamplingCapability()),
            "Client does not support sampling tools capability",
        ),
        (TOOLS, ClientCapabilities(sampling=SamplingCapability(tools=SamplingToolsCapability())), None),
        (ListRootsRequest(), ClientCapabilities(), "List roots not supported"),
        (ListRootsRequest(), None, "List roots not supported"),
    ],
)
def test_a_question_a_client_did_not_offer_to_answer_is_refused_as_it_would(
    request_: InputRequest, capabilities: ClientCapabilities | None, refused: str | None
) -> None:
    answer = refusal(request_, capabilities)
    assert (answer.message if answer else None) == refused
