"""``signoff-hook claude-code`` reads its options without argparse when they are plainly
given, and then reads them exactly as argparse does (which reads every other command line)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from signoff.hooks.adapters.claude_code import _arguments, _parsed, _Refused

TOKENS = st.sampled_from(
    [
        "--timeout",
        "--deadline",
        "--submit-deadline",
        "--url",
        "--user-id",
        "--allow-unmatched",
        "-h",
        "--help",
        "--timeout=5",
        "--url=http://x",
        "3600",
        "0.5",
        "-1",
        "soon",
        "",
        "--",
        "--bogus",
        "x=y",
        "--time",
        "http://127.0.0.1:8000",
        "inf",
    ]
)


@given(st.lists(TOKENS, max_size=6))
def test_options_are_read_as_argparse_reads_them(argv: list[str]) -> None:
    try:
        expected: object = vars(_parsed(argv))
    except _Refused as refused:
        expected = str(refused)
    try:
        got: object = vars(_arguments(argv))
    except _Refused as refused:
        got = str(refused)
    assert got == expected
