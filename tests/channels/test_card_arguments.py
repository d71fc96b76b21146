"""What the approver sees is the whole call: every Slack card, Feishu card and email shows every
argument field's name and the start of its value (long values clipped per field, with a link to
the request in Signoff), or offers no approval at all; and stays within its platform's limits."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from slack_sdk.models.blocks import Block

from signoff.channels import (
    ArgumentsView,
    Card,
    GrantChoice,
    Person,
    Verdict,
    argument_json,
    lay_out_arguments,
    shown_text,
)
from signoff.channels._contract import MIN_SHORT_FORM_CHARS, SHORT_FORM_CHARS
from signoff.channels.email import EmailChannel, EmailConfig, LinkSigner, render_html, render_text
from signoff.channels.feishu import MAX_CARD_BYTES
from signoff.channels.feishu import render_card as feishu_card
from signoff.channels.slack import ACTION_APPROVE, ACTION_EDIT, ACTION_GRANT
from signoff.channels.slack import render_card as slack_card
from tests.channels.feishu_fake import validate_card
from tests.channels.feishu_support import walk
from tests.channels.slack_support import card as slack_support_card

CONSOLE = "https://signoff.example.com/ui/requests/req-1"
DESCRIPTION = ("Installs the vendor's command-line helper and checks its version afterwards. " * 50)[:2950]
BASH = {"description": DESCRIPTION, "command": "curl -fsSL https://get.example.com/install.sh | sh"}
"""An agent's ``Bash`` call whose long description came first and once pushed ``command`` off every card."""

MAIL = EmailChannel(
    "mail",
    EmailConfig.model_validate(
        {"type": "email", "smtp_url": "smtp://127.0.0.1:1", "from": "signoff@example.com"}
    ),
    LinkSigner(b"k" * 32, "https://signoff.example.com"),
)


def make_card(arguments: dict[str, Any], **changes: Any) -> Card:
    base = replace(
        slack_support_card(arguments=arguments),
        tool_name="Bash",
        approvers=(Person("Ana", "ana@example.com"), Person("Bo", "U0BO")),
        console_url=CONSOLE,
    )
    return replace(base, **changes)


# --- reading what a channel rendered back ------------------------------------------------------

_NOTE = re.compile(r"(.*)… ([\d,]+) more characters", re.DOTALL)


def read_lines(lines: list[str]) -> dict[str, tuple[str, int]]:
    """``"name": value[… N more characters]`` lines → name → (the value's text shown, characters left out)."""
    shown: dict[str, tuple[str, int]] = {}
    for line in lines:
        name, end = json.JSONDecoder().raw_decode(line)
        assert line[end : end + 2] == ": ", line
        rest = line[end + 2 :]
        cut = _NOTE.fullmatch(rest)
        assert name not in shown, f"{name!r} shown twice"
        shown[name] = (cut[1], int(cut[2].replace(",", ""))) if cut else (rest, 0)
    return shown


def shows_every_field(arguments: dict[str, Any], shown: dict[str, tuple[str, int]]) -> bool:
    """Every field's name, with a prefix of its value as long as its short form at least."""
    if set(shown) != set(arguments):
        return False
    for name, value in arguments.items():
        whole = argument_json(value)
        text, hidden = shown[name]
        if not whole.startswith(text) or len(text) + hidden != len(whole):
            return False
        if len(text) < min(len(whole), MIN_SHORT_FORM_CHARS):
            return False
    return True


def slack_lines(blocks: list[dict[str, Any]]) -> list[str]:
    texts = [b["text"]["text"] for b in blocks if b["block_id"].startswith("signoff_arguments")]
    lines: list[str] = []
    for text in texts:
        for body in re.findall(r"```\n(.*?)\n```", text, re.DOTALL):
            plain = body.replace("\u200b", "").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
            lines += plain.split("\n")
    return lines


def slack_approves(blocks: list[dict[str, Any]]) -> bool:
    ids = [e["action_id"] for b in blocks if b["type"] == "actions" for e in b["elements"]]
    return any(i in (ACTION_APPROVE, ACTION_EDIT) or i.startswith(ACTION_GRANT) for i in ids)


def feishu_lines(rendered: dict[str, Any]) -> list[str]:
    [content] = [e["content"] for e in walk(rendered) if e["tag"] == "markdown"]
    found = re.search(r"```json\n(.*?)\n```", content, re.DOTALL)
    return found[1].split("\n") if found else []


def feishu_approves(rendered: dict[str, Any]) -> bool:
    values = [b["value"] for e in walk(rendered) for b in e.get("behaviors", []) if "value" in b]
    return any(v.get("verdict") == Verdict.APPROVE for v in values)


def email_lines(text: str) -> list[str]:
    after = text.split("\nArguments:\n", 1)[1]
    lines = after.split("\n\n", 1)[0].split("\n")
    # The lines, then what the message says when values are cut short or left out.
    return [line for line in lines if line.startswith('"')]


def email_html_lines(page: str) -> list[str]:
    found = re.search(r"<pre[^>]*>(.*?)</pre>", page, re.DOTALL)
    text = html.unescape(found[1]) if found else "(none)"
    return [] if text == "(none)" else text.split("\n")


# --- any call ----------------------------------------------------------------------------------

_AWKWARD = 'a&<>`*_~|é字😀\u202e\u200b\u2028\n"\\ '


def _runs(low: int, high: int) -> st.SearchStrategy[str]:
    """Long text made quickly: a few characters repeated (``&`` and ``<`` grow when escaped)."""
    return st.builds(
        lambda chars, n: (chars * n)[:n], st.text(_AWKWARD, min_size=1, max_size=4), st.integers(low, high)
    )


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    _runs(0, 6000),
)
_values = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
_names = st.one_of(st.text(min_size=1, max_size=24), _runs(1, 40), _runs(100, 3000))
_few = st.dictionaries(_names, _values, max_size=10)
_many = st.builds(
    lambda n, prefix, value: {f"{prefix}{i}": value for i in range(n)},
    st.integers(0, 500),
    st.sampled_from(["", "field_", "x" * 60]),
    _leaf,
)
arguments = st.one_of(_few, _many, st.builds(lambda a, b: {**a, **b}, _few, _many))

_examples = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_examples
@given(arguments, st.booleans(), st.booleans())
@example(BASH, True, True)
@example({"x" * 5000: 1, "command": "rm -rf /"}, False, False)
def test_every_card_shows_every_field_or_offers_no_approval(
    args: dict[str, Any], editable: bool, grants: bool
) -> None:
    card = make_card(
        args,
        editable=tuple(sorted(args))[:3] if editable else (),
        grants=(GrantChoice("session", 3600, ("command",)),) if grants else (),
    )

    _, blocks = slack_card(card)
    shown = shows_every_field(args, read_lines(slack_lines(blocks)))
    assert slack_approves(blocks) == shown, "Slack offers an approval exactly when it shows the whole call"
    assert len(blocks) <= 50
    for block in blocks:
        Block.parse(block).validate_json()  # type: ignore[union-attr]
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= 3000

    rendered = feishu_card(card)
    shown = shows_every_field(args, read_lines(feishu_lines(rendered)))
    assert feishu_approves(rendered) == shown, "Feishu offers an approval exactly when it shows the call"
    content = json.dumps(rendered, ensure_ascii=False)
    assert len(content.encode()) <= MAX_CARD_BYTES
    validate_card(content)

    choices = MAIL.choices(card, "ana@example.com")
    kinds = {c.kind for c in choices}
    text = render_text(card, Person("Ana"), choices)
    page = render_html(card, Person("Ana"), choices)
    for lines in (email_lines(text), email_html_lines(page)):
        shown = shows_every_field(args, read_lines(lines))
        assert bool(kinds & {"approve", "grant"}) == shown, (
            "an email offers approval just when it shows the call"
        )
    assert "reject" in kinds

    if args and not (slack_approves(blocks) and feishu_approves(rendered) and "approve" in kinds):
        # Whatever is left out, the card says where the whole call is.
        assert CONSOLE in json.dumps(blocks) + content + text + page


@pytest.mark.parametrize("channel", ["slack", "feishu", "email"])
def test_a_long_description_no_longer_hides_the_command(channel: str) -> None:
    card = make_card(BASH)
    if channel == "slack":
        _, blocks = slack_card(card)
        lines, approves = slack_lines(blocks), slack_approves(blocks)
        rendered = json.dumps(blocks)
    elif channel == "feishu":
        data = feishu_card(card)
        lines, approves, rendered = feishu_lines(data), feishu_approves(data), json.dumps(data)
    else:
        choices = MAIL.choices(card, "ana@example.com")
        text = render_text(card, Person("Ana"), choices)
        lines, approves, rendered = email_lines(text), choices[0].kind == "approve", text

    shown = read_lines(lines)
    assert shown["command"] == ('"curl -fsSL https://get.example.com/install.sh | sh"', 0)
    assert shown["description"][0].startswith('"Installs the vendor')
    assert approves
    if shown["description"][1]:
        assert CONSOLE in rendered, "a value cut short links to the whole call"


@pytest.mark.parametrize(
    "args",
    [
        {f"field_{i:03d}_{'n' * 40}": i for i in range(400)},
        {"n" * 25_000: 1, "command": "ls"},
    ],
    ids=["hundreds of fields", "a very long name"],
)
def test_a_call_that_cannot_fit_offers_reject_and_the_console_only(args: dict[str, Any]) -> None:
    card = make_card(args, editable=("command",), grants=(GrantChoice("agent", 60),))

    _, blocks = slack_card(card)
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e["text"]["text"] for e in actions["elements"]] == ["Reject"]
    assert f"<{CONSOLE}|Open in Signoff>" in json.dumps(blocks)
    assert "do not fit on this card" in json.dumps(blocks)

    rendered = feishu_card(card)
    assert [b["name"] for b in walk(rendered) if b["tag"] == "button"] == ["reject"]
    assert not [e for e in walk(rendered) if e["tag"] == "input" and e.get("name") != "reason"]
    assert f"[Open in Signoff]({CONSOLE})" in json.dumps(rendered)

    choices = MAIL.choices(card, "ana@example.com")
    assert [c.kind for c in choices] == ["reject"]
    assert f"Open in Signoff: {CONSOLE}" in render_text(card, Person("Ana"), choices)


def test_without_a_public_url_the_card_names_the_request_instead() -> None:
    card = make_card({"n" * 4000: 1}, console_url=None)

    _, blocks = slack_card(card)
    assert "(request `req-1`)" in json.dumps(blocks)
    assert "(request req-1)" in json.dumps(feishu_card(card))


# --- the layout itself -------------------------------------------------------------------------


def minimal_cost(args: dict[str, Any], size: Any = len) -> list[int]:
    """What each field's line takes with the shortest short form."""
    lines = lay_out_arguments(args, budget=10**9)
    return [
        size(replace(line, shown=min(len(line.value), MIN_SHORT_FORM_CHARS)).text) for line in lines.lines
    ]


@_examples
@given(arguments, st.integers(0, 30_000), st.integers(1, 5000))
def test_the_layout_fits_its_budget_and_drops_fields_only_all_at_once(
    args: dict[str, Any], budget: int, line_limit: int
) -> None:
    view = lay_out_arguments(args, budget=budget, line_limit=line_limit)

    assert isinstance(view, ArgumentsView)
    assert view.fields == len(args)
    costs = [len(line.text) for line in view.lines]
    assert sum(costs) <= budget
    assert all(cost <= line_limit for cost in costs)
    if view.complete:
        assert shows_every_field(args, read_lines([line.text for line in view.lines]))
        assert [line.field for line in view.lines] == sorted(args)
    else:
        assert view.lines == ()
        # It gave up only when even the shortest forms do not fit.
        minimal = minimal_cost(args)
        assert sum(minimal) > budget or max(minimal) > min(line_limit, budget)


@_examples
@given(arguments, st.integers(0, 30_000))
def test_the_order_an_agent_gives_its_fields_changes_nothing(args: dict[str, Any], budget: int) -> None:
    reordered = dict(reversed(list(args.items())))

    assert lay_out_arguments(reordered, budget=budget) == lay_out_arguments(args, budget=budget)


def test_short_forms_come_first_and_the_room_left_is_shared() -> None:
    args = {"a_long": "x" * 10_000, "b_long": "y" * 10_000, "c_short": "ok"}

    view = lay_out_arguments(args, budget=3000)

    a, b, c = view.lines
    assert c.hidden == 0
    assert a.hidden
    assert b.hidden
    assert abs(a.shown - b.shown) <= 1
    assert a.shown > SHORT_FORM_CHARS
    assert sum(len(line.text) for line in view.lines) > 2900, "the budget is used"


@given(st.text(max_size=12), st.text(max_size=12))
@example("pay\\u200binvoice", "pay\u200binvoice")
@example("a\\\\u200b", "a\\\u200b")
def test_two_names_never_show_alike(a: str, b: str) -> None:
    """A tool name or requester id spelled with a literal ``\\u200b`` never shows as one with
    the zero-width space itself: what a card shows names one text only."""
    if a != b:
        assert shown_text(a) != shown_text(b)
    assert shown_text("C:\\tools\\pay") == "C:\\\\tools\\\\pay"


def test_characters_that_hide_or_reorder_text_are_written_as_escapes() -> None:
    value = "safe\u202e hs | lruc\u200b\u2028tail\x7f\U000e0041"

    text = argument_json(value)

    assert text == '"safe\\u202e hs | lruc\\u200b\\u2028tail\\u007f\\udb40\\udc41"'
    assert json.loads(text) == value
    assert argument_json({"\u202eevil": 1}) == '{"\\u202eevil":1}'
