"""Secrets out of everything stored, logged, shown or sent.

Two ways a value is masked:

- **by key**: a value under a key that contains a redact word, whatever the key's
  spelling — case, ``-``, ``_``, spaces, dots and camelCase are ignored on both sides, so
  ``API-KEY``, ``X-Api-Key``, ``api key`` and ``apiKey`` all meet ``api_key``;
- **by value**: inside any string, text that is a secret by its form — bearer and basic
  credentials, JWTs, AWS access key ids, Slack, OpenAI/Anthropic (``sk-…``), Stripe,
  GitHub and Google API keys, PEM private-key blocks, the password in
  ``scheme://user:password@host`` — and ``key=value`` / ``key: value`` pairs whose key
  contains a redact word (query strings, headers and commands quoted in an argument).

A secret is literal text: a mask ends where a shell expansion begins (``$(``, ``${``,
backticks, ``<(``), so ``token=$(curl …|sh)`` shows the approvers the command it runs.

Everything is compiled once; key spellings are normalised once per distinct key.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["REDACTED", "Redactor", "normalise_key", "redact", "redactor"]

REDACTED = "[redacted]"

_NOT_ALNUM = re.compile(r"[\W_]+")


@functools.lru_cache(maxsize=16384)
def normalise_key(key: str) -> str:
    """``X-Api-Key``, ``x_api_key``, ``x api key``, ``xApiKey`` → ``xapikey``."""
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", key).casefold())


_SCHEME = r"(?i:bearer|basic|token|digest)"
# A credential after a scheme: 8 characters or more, with a digit or a symbol in them unless
# long (so that "Basic information" is prose, not a credential).
_CREDENTIAL = r"(?=[A-Za-z0-9\-._~+/]{8})(?:[A-Za-z]*[0-9\-._~+/][A-Za-z0-9\-._~+/]*|[A-Za-z]{20,})=*"


@dataclass(frozen=True, slots=True)
class _Form:
    """A secret known by its form: a literal every match starts with (a quick test, and
    what lets the regular expression engine skip ahead), the expression, and whether it
    only counts where no letter or digit stands right before it."""

    literal: str
    pattern: re.Pattern[str]
    boundary: bool = True


_FORMS = (
    # The block's body only: base64 lines, their line breaks (real, or escaped as ``\n``)
    # and an encrypted key's ``Proc-Type`` and ``DEK-Info`` headers. Text no key holds (a
    # space, punctuation) ends the mask: a BEGIN line cannot hide from the approvers what the
    # call carries after it.
    _Form(
        "-----BEGIN",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----"
            r"(?:(?:Proc-Type|DEK-Info):[ \t]*[A-Za-z0-9,-]*|[A-Za-z0-9+/=\r\n\\])*"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY-----)?"
        ),
        False,
    ),
    _Form("eyJ", re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), False),
    _Form("A", re.compile(r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|PKA|ROA|SCA)[A-Z0-9]{16}"), False),
    _Form("xox", re.compile(r"xox[abeoprs]-[A-Za-z0-9-]{8,}")),
    _Form("xapp-", re.compile(r"xapp-[0-9]+-[A-Za-z0-9-]{8,}")),
    _Form("sk-", re.compile(r"sk-[A-Za-z0-9_-]{16,}")),
    _Form("k_", re.compile(r"[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    _Form("gh", re.compile(r"gh(?:[pousr]_[A-Za-z0-9]{30,}|ithub_pat_[A-Za-z0-9_]{30,})")),
    _Form("AIza", re.compile(r"AIza[0-9A-Za-z_-]{35}")),
)
_FORM_TESTS = tuple((f.literal, f.pattern, f.boundary) for f in _FORMS)
_SCHEME_WORDS = ("bearer", "basic", "token", "digest")
_SCHEMED = re.compile(rf"(?<![A-Za-z0-9]){_SCHEME}\s+(?P<credential>{_CREDENTIAL})")
_USERINFO = re.compile(r"://([^/\s:@]*):([^/\s@]+)(?=@)")
# A ``key: value`` or ``key=value`` pair read backwards: the separator, then the key (two
# words joined by a space, as in ``api key``, count as one key).
_REVERSED_PAIR = re.compile(r"[:=][ \t]*[\"']?(?P<key>[A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)?)")
_PAIR_VALUE = re.compile(rf"[ \t]*[\"']?[ \t]*(?P<value>(?:{_SCHEME}\s+)?[^\s\"'&,;]+)")
# Where a shell would run or expand something: a secret is literal text, so a mask ends
# before the first of these and the command or expansion stays in front of the approvers.
# Only whole ones count: a lone backtick or ``$(`` runs nothing.
_EXPANSION = re.compile(r"\$\([^)]*\)|\$\{[^}]*\}|`[^`]*`|[<>]\([^)]*\)")


def _literal_end(text: str, start: int, stop: int) -> int:
    """Where the literal text in ``text[start:stop]`` ends: at the first shell expansion that
    begins there (a whole one: ``$(…)``, ``${…}``, ```…```, ``<(…)``; it may end later)."""
    m = _EXPANSION.search(text, start)
    return stop if m is None or m.start() >= stop else m.start()


def _masked_forms(text: str) -> str:
    """``text`` with every secret known by its form masked."""
    for literal, pattern, boundary in _FORM_TESTS:
        if literal in text:
            text = pattern.sub(_bounded if boundary else REDACTED, text)
    if " " in text or "\t" in text or "\n" in text:
        text = _masked_schemes(text)
    if "://" in text and "@" in text:
        text = _USERINFO.sub(_userinfo, text)
    return text


def _masked_schemes(text: str) -> str:
    """``Bearer <token>``, ``Basic <credentials>`` … with the credential masked."""
    low = text.lower()
    if not any(w in low for w in _SCHEME_WORDS):
        return text
    if not text.isascii():  # lower() may change lengths; let the expression find them
        return _SCHEMED.sub(_schemed, text)
    cuts = []
    for word in _SCHEME_WORDS:
        at = low.find(word)
        while at >= 0:
            if (m := _SCHEMED.match(text, at)) is not None:
                cuts.append((m.start("credential"), m.end()))
            at = low.find(word, at + len(word))
    return _cut(text, cuts)


def _cut(text: str, cuts: list[tuple[int, int]]) -> str:
    """``text`` with each span in ``cuts`` replaced by the mask (overlaps merged)."""
    if not cuts:
        return text
    out, done = [], 0
    for start, stop in sorted(cuts):
        if start >= done:
            out.append(text[done:start] + REDACTED)
            done = stop
    out.append(text[done:])
    return "".join(out)


def _schemed(m: re.Match[str]) -> str:
    return m.group()[: m.start("credential") - m.start()] + REDACTED


def _userinfo(m: re.Match[str]) -> str:
    return f"://{m[1]}:{_masked_literal(m[2])}"


def _masked_literal(text: str) -> str:
    """``text`` masked up to its first shell expansion (``$(…)``, backticks), which stays."""
    stop = _literal_end(text, 0, len(text))
    return (REDACTED if stop else "") + text[stop:]


def _bounded(m: re.Match[str]) -> str:
    """The mask, unless a letter or digit stands right before the match (``task-…`` is no key)."""
    return m.group() if m.string[m.start() - 1 : m.start()].isalnum() else REDACTED


class Redactor:
    """Redaction for one set of redact words."""

    def __init__(self, words: Iterable[str]) -> None:
        normalised = sorted({normalise_key(w) for w in words} - {""}, key=len, reverse=True)
        self._plain_words = tuple(normalised)
        self._words = re.compile("|".join(map(re.escape, normalised))) if normalised else None
        self._secret_keys: dict[str, bool] = {}

    def secret_key(self, key: str) -> bool:
        """Whether values under ``key`` are redacted."""
        known = self._secret_keys.get(key)
        if known is None:
            known = self._words is not None and self._words.search(normalise_key(key)) is not None
            if len(self._secret_keys) < 16384:
                self._secret_keys[key] = known
        return known

    def text(self, text: str) -> str:
        """``text`` with the secrets in it masked: by their form, and as the value of a
        ``key=value`` or ``key: value`` pair whose key holds a redact word."""
        if len(text) < 5:  # "pwd=x" is the shortest secret there is
            return text
        text = _masked_forms(text)
        if (":" in text or "=" in text) and self._mentions_a_word(text):
            return self._masked_pairs(text)
        return text

    def _mentions_a_word(self, text: str) -> bool:
        """Whether a redact word occurs in ``text`` at all (else no pair in it is a secret)."""
        flat = _NOT_ALNUM.sub("", text.casefold())
        return any(w in flat for w in self._plain_words)

    def _masked_pairs(self, text: str) -> str:
        # Keys are found backwards from each separator: read in the reversed text, a pair
        # starts with its separator, which the expression engine finds quickly.
        end, cuts = len(text), []
        for m in _REVERSED_PAIR.finditer(text[::-1]):
            if self.secret_key(m["key"][::-1]):
                value = _PAIR_VALUE.match(text, end - m.start())
                if value is not None:
                    start = value.start("value")
                    stop = _literal_end(text, start, value.end())
                    if stop > start:
                        cuts.append((start, stop))
        return _cut(text, cuts)

    def _masked_value(self, value: Any) -> Any:
        """A value under a secret key: masked whole, except a string's shell expansions
        (``$(…)``, backticks), which are code to run, not a secret to keep."""
        if isinstance(value, str) and _EXPANSION.search(value):
            return self.text(_masked_literal(value))
        return REDACTED

    def value(self, value: Any) -> Any:
        """``value`` (JSON-like) with secrets masked by key and by value, at any depth."""
        kind = type(value)
        if kind is int or kind is float or kind is bool or value is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                k: self._masked_value(v) if self.secret_key(str(k)) else self.value(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


@functools.lru_cache(maxsize=64)
def redactor(words: frozenset[str]) -> Redactor:
    """The redactor for ``words`` (built once per set)."""
    return Redactor(words)


def redact(value: Any, words: frozenset[str]) -> Any:
    """``value`` with secrets masked: under keys containing one of ``words`` (any spelling),
    and by their form inside strings."""
    return redactor(words).value(value)
