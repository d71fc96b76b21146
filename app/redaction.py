"""Secrets out of everything stored, logged, shown or sent.

Three ways a value is masked:

- **by key**: a value under a key that contains a redact word, whatever the key's
  spelling — case, ``-``, ``_``, spaces, dots and camelCase are ignored on both sides, so
  ``API-KEY``, ``X-Api-Key``, ``api key`` and ``apiKey`` all meet ``api_key``;
- **by value**: inside any string, text that is a secret by its form — tokens known by their
  issuer's prefix (``glpat-…``, ``npm_…``, ``ghp_…``, ``xoxb-…``, ``sk_live_…`` and the
  rest of gitleaks' prefixed rules, in :mod:`signoff.app._secret_tokens`), Signoff's own agent
  keys (``sk_signoff_…``) and personal tokens (``sop_…``), AWS access key
  ids, JWTs, PEM private-key blocks, bearer and basic credentials, the password in
  ``scheme://user:password@host`` — and ``key=value`` / ``key: value`` pairs whose key
  contains a redact word (query strings, headers and commands quoted in an argument);
- **by argument**: in a shell command (a string) and in an argv list, the value of a flag
  whose name holds a redact word (``--password X``, ``--token=X``, ``-api-key X``), and the
  flags that carry a password for a known tool: ``mysql -pX``, ``sshpass -p X``,
  ``docker login -p X`` (any ``login`` command), ``curl -u user:X``, ``redis-cli -a X``,
  ``mongosh -p X``, ``ldapsearch -w X``, ``sqlcmd -P X``, ``openssl -passin pass:X``.

A secret is literal text: a mask ends where a shell expansion begins (``$(``, ``${``,
backticks, ``<(``), so ``token=$(curl …|sh)`` shows the approvers the command it runs, and
an argument's mask covers that one word: ``curl -u alice:[redacted] https://x | sh``.

Why a generated table and not a dependency: ``detect-secrets`` (Yelp; last release 1.5.0,
May 2024) yields matched values, not spans; its GitLab plugin yields only the ``glpat``
prefix, its npm plugin only an ``.npmrc`` line; it found none of the credentials in
``bench/redaction.py``'s calls (``curl -u``, ``mysql -p``, ``--password X``, a bearer
header), needs ``requests``, and took 4 to 13 times this module's time on them. gitleaks'
rule set is maintained and MIT licensed; ``scripts/gen_secret_tokens.py`` keeps the rules
that are safe to apply to any text (see its docstring) and writes them out. What it costs
per call is in docs/benchmarks.md ("Redaction per call").

Everything is compiled once; key spellings are normalised once per distinct key.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from signoff.app._secret_tokens import TOKENS

__all__ = ["REDACTED", "Redactor", "normalise_key", "redact", "redactor"]

REDACTED = "[redacted]"

_NOT_ALNUM = re.compile(r"[\W_]+")


@functools.lru_cache(maxsize=16384)
def normalise_key(key: str) -> str:
    """``X-Api-Key``, ``x_api_key``, ``x api key``, ``xApiKey`` → ``xapikey``."""
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", key).casefold())


def _alternation(words: Iterable[str]) -> str:
    """One expression matching any of ``words``, as a trie (``gl(?:c_|pat-)``): the engine
    tries a handful of branches at each position instead of every word."""
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def branch(node: dict[str, Any]) -> str:
        ends = "" in node
        parts = [re.escape(c) + branch(sub) for c, sub in sorted(node.items()) if c]
        if not parts:
            return ""
        body = parts[0] if len(parts) == 1 and not ends else f"(?:{'|'.join(parts)})"
        return body + ("?" if ends else "")

    return branch(trie)


_SCHEME = r"(?i:bearer|basic|token|digest)"
# A credential after a scheme: 8 characters or more, with a digit or a symbol in them unless
# long (so that "Basic information" is prose, not a credential).
_CREDENTIAL = r"(?=[A-Za-z0-9\-._~+/]{8})(?:[A-Za-z]*[0-9\-._~+/][A-Za-z0-9\-._~+/]*|[A-Za-z]{20,})=*"


@dataclass(frozen=True, slots=True)
class _Form:
    """A secret known by its form: the lowercased texts every match starts with (a quick
    test), the expression (its group 1, when it has one, is the secret), whether it only
    counts where no letter or digit stands right before it, and whether the mask runs on
    over the token characters that follow (a rule of fixed length still masks a longer
    token whole)."""

    heads: tuple[str, ...]
    pattern: re.Pattern[str]
    boundary: bool = True
    to_token_end: bool = True


_FORMS = (
    # The block's body only: base64 lines, their line breaks (real, or escaped as ``\n``)
    # and an encrypted key's ``Proc-Type`` and ``DEK-Info`` headers. Text no key holds (a
    # space, punctuation) ends the mask: a BEGIN line cannot hide from the approvers what the
    # call carries after it.
    _Form(
        ("-----begin",),
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----"
            r"(?:(?:Proc-Type|DEK-Info):[ \t]*[A-Za-z0-9,-]*|[A-Za-z0-9+/=\r\n\\])*"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY-----)?"
        ),
        False,
        False,
    ),
    # Looser than gitleaks' forms of the same secrets: a lookalike is masked too.
    _Form(("eyj",), re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), False),
    _Form(
        tuple(p.lower() for p in "AKIA ASIA ABIA ACCA AGPA AIDA AIPA ANPA ANVA APKA AROA ASCA".split()),
        re.compile(r"A(?:KIA|SIA|BIA|CCA|GPA|IDA|IPA|NPA|NVA|PKA|ROA|SCA)[A-Z0-9]{16}"),
        False,
    ),
    _Form(("xox",), re.compile(r"xox[abeoprs]-[A-Za-z0-9-]{8,}")),
    _Form(("xapp-",), re.compile(r"xapp-[0-9]+-[A-Za-z0-9-]{8,}")),
    _Form(("sk-",), re.compile(r"sk-[A-Za-z0-9_-]{16,}")),
    _Form(
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        re.compile(r"gh(?:[pousr]_[A-Za-z0-9]{30,}|ithub_pat_[A-Za-z0-9_]{30,})"),
    ),
    # Signoff's own: an agent's key (signoff.app.keys) and a personal token (the console's
    # Token page: a signed payload, compressed when long, then its signature).
    _Form(("sk_signoff_",), re.compile(r"sk_signoff_[A-Za-z0-9_-]{8,}")),
    _Form(("sop_",), re.compile(r"sop_\.?[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    *(_Form(heads, re.compile(expression)) for _, heads, expression in TOKENS),
)
# One pass finds which heads occur. A head found stands for the heads that can start inside
# its match, which that pass steps over: a shorter head it starts with (``xoxb-`` for
# ``xox``), and a head that starts with one of its proper suffixes.
_OF_HEAD: dict[str, list[_Form]] = {}
for _form in _FORMS:
    for _h in _form.heads:
        _OF_HEAD.setdefault(_h, []).append(_form)
_BY_HEAD = {
    h: [
        f
        for g, fs in _OF_HEAD.items()
        if h.startswith(g) or any(g.startswith(h[i:]) for i in range(1, len(h)))
        for f in fs
    ]
    for h in _OF_HEAD
}
_HEADS = re.compile(_alternation(_BY_HEAD))
_TOKEN_END = re.compile(r"[A-Za-z0-9_-]*")
_SCHEME_WORDS = ("bearer", "basic", "token", "digest")
# The scheme is a word of its own: not the end of a longer token (a password ``0.DIGEST`` is no
# scheme, and the host after it no credential).
_SCHEMED = re.compile(rf"(?<![A-Za-z0-9\-._~+/]){_SCHEME}\s+(?P<credential>{_CREDENTIAL})")
_USERINFO = re.compile(r"://([^/\s:@]*):([^/\s@]+)(?=@)")
# A ``key: value`` or ``key=value`` pair read backwards: the separator, then the key (two
# words joined by a space, as in ``api key``, count as one key).
_REVERSED_PAIR = re.compile(r"[:=][ \t]*[\"']?(?P<key>[A-Za-z0-9_.-]+(?: [A-Za-z0-9_.-]+)?)")
_PAIR_VALUE = re.compile(rf"[ \t]*[\"']?[ \t]*(?P<value>(?:{_SCHEME}\s+)?[^\s\"'&,;]+)")
# Where a shell would run or expand something: a secret is literal text, so a mask ends
# before the first of these and the command or expansion stays in front of the approvers.
# Only whole ones count: a lone backtick or ``$(`` runs nothing.
_EXPANSION = re.compile(r"\$\([^)]*\)|\$\{[^}]*\}|`[^`]*`|[<>]\([^)]*\)")

# How a flag carries a secret: as its whole value, as the password of ``user:password``, or
# as OpenSSL's ``pass:password``.
_Carries = Literal["value", "user:password", "pass:"]
# A tool's flags that carry a password: the way, and whether the next word is the value
# (``sshpass -p X``) or only a value glued to the flag is (``mysql -pX``: a lone ``-p`` asks).
_ToolFlags = Mapping[str, tuple[_Carries, bool]]
_USER_PASSWORD: tuple[_Carries, bool] = ("user:password", True)
_VALUE: tuple[_Carries, bool] = ("value", True)
_TOOL_GROUPS: tuple[tuple[str, _ToolFlags], ...] = (
    (
        "mysql mariadb mysqldump mysqladmin mysqlimport mysqlshow mysqlcheck mysqlpump mysqlslap "
        "mariadb-dump mariadb-admin mariadb-import mariadb-check mariadb-show",
        {"-p": ("value", False)},
    ),
    # ``login``: any login command (docker, podman, nerdctl, buildah, skopeo, oras, helm
    # registry, az, oc, cf).
    ("sshpass login", {"-p": _VALUE}),
    (
        "mongo mongosh mongodump mongorestore mongoexport mongoimport mongostat mongotop mongofiles",
        {"-p": _VALUE},
    ),
    ("redis-cli valkey-cli keydb-cli", {"-a": _VALUE}),
    ("sqlcmd bcp osql", {"-P": _VALUE}),
    ("ldapsearch ldapadd ldapmodify ldapdelete ldapmodrdn ldappasswd ldapwhoami ldapcompare", {"-w": _VALUE}),
    (
        "curl",
        {
            "-u": _USER_PASSWORD,
            "--user": _USER_PASSWORD,
            "-U": _USER_PASSWORD,
            "--proxy-user": _USER_PASSWORD,
            "--oauth2-bearer": _VALUE,
        },
    ),
    ("http https httpie", {"-a": _USER_PASSWORD, "--auth": _USER_PASSWORD}),
    (
        "openssl",
        {"-passin": ("pass:", True), "-passout": ("pass:", True), "-pass": ("pass:", True), "-k": _VALUE},
    ),
)
_TOOLS: Mapping[str, _ToolFlags] = {name: flags for names, flags in _TOOL_GROUPS for name in names.split()}
# Flag names that mean a password in many tools without holding a redact word.
_SECRET_FLAG_NAMES = frozenset({"pass", "pw"})
# A flag that names where a secret is, not the secret: ``--password-stdin``, ``--token-file``.
_WHERE_SUFFIXES = ("stdin", "file", "path", "env", "cmd", "command")
_URL_SCHEMES = frozenset({"http", "https"})
_TOOL_NAMES = re.compile(_alternation([*_TOOLS, *_SECRET_FLAG_NAMES]))
_LONG_FLAG = re.compile(r"--?([A-Za-z][A-Za-z0-9_.-]+)")
# Flags as they stand in text (a quick test: whether any names a secret).
_FLAGS = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]+")
# A shell word (quoted parts, escapes and plain characters up to a space or an operator), a
# redirection (the word after it is a file, never a flag's value), or an operator that ends a
# command.
_SHELL_TOKEN = re.compile(
    r"""(?P<word>(?:[^\s;|&<>(){}`\\'"]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.|['"])+)"""
    r"""|(?P<redirect>[<>]+)|[;|&\n(){}`]"""
)
_REDIRECT = "<"
_QUOTED = re.compile(r"""'([^']*)'|"((?:[^"\\]|\\.)*)\"""")
# A quoted word is read as a command of its own when a flag stands in it.
_COMMAND_INSIDE = re.compile(r"\s-")
_QUOTES = "'\""


def _literal_end(text: str, start: int, stop: int) -> int:
    """Where the literal text in ``text[start:stop]`` ends: at the first shell expansion that
    begins there (a whole one: ``$(…)``, ``${…}``, ```…```, ``<(…)``; it may end later)."""
    m = _EXPANSION.search(text, start)
    return stop if m is None or m.start() >= stop else m.start()


def _form_cuts(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that are secrets known by their form."""
    found = set(_HEADS.findall(text.lower()))
    if not found:
        return []
    cuts = []
    for form in {id(f): f for head in found for f in _BY_HEAD[head]}.values():
        grouped = form.pattern.groups > 0
        for m in form.pattern.finditer(text):
            start, stop = m.span(1) if grouped else m.span()
            if start < 0 or (form.boundary and text[start - 1 : start].isalnum()):
                continue
            if form.to_token_end:
                stop = _TOKEN_END.match(text, stop).end()  # type: ignore[union-attr]
            cuts.append((start, stop))
    return cuts


def _masked_forms(text: str) -> str:
    """``text`` with every secret known by its form masked."""
    text = _cut(text, _form_cuts(text))
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
    """``text`` with each span in ``cuts`` replaced by the mask (overlapping and touching
    spans are one mask)."""
    if not cuts:
        return text
    out: list[str] = []
    done = 0
    for start, stop in sorted(cuts):
        if out and start <= done:
            done = max(done, stop)
        elif stop > start:
            out += (text[done:start], REDACTED)
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


def _carried(word: str, start: int, how: _Carries) -> tuple[int, int] | None:
    """The span of the secret in ``word[start:]``, a value carried the way ``how`` says."""
    if how == "user:password":
        colon = word.find(":", start)
        start = colon + 1 if colon >= 0 else len(word)
    elif how == "pass:":
        start = start + 5 if word.startswith("pass:", start) else len(word)
    return (start, len(word)) if start < len(word) else None


def _may_carry_a_tool_flag(text: str) -> bool:
    """Whether ``text`` names a tool of :data:`_TOOLS` or a flag of :data:`_SECRET_FLAG_NAMES`
    (a quick test: the words decide). ``http`` and ``https`` begin every URL: for them, one of
    their flags must occur too."""
    for name in _TOOL_NAMES.findall(text.lower()):
        if name not in _URL_SCHEMES or any(f in text for f in _TOOLS[name]):
            return True
    return False


def _is_flag(word: str) -> bool:
    """Whether ``word`` reads as a flag rather than a value (``--x``, ``-x``)."""
    return word.startswith("--") or (len(word) == 2 and word[0] == "-" and word[1].isalpha())


class Redactor:
    """Redaction for one set of redact words."""

    def __init__(self, words: Iterable[str]) -> None:
        normalised = sorted({normalise_key(w) for w in words} - {""}, key=len, reverse=True)
        self._plain_words = tuple(normalised)
        self._words = re.compile("|".join(map(re.escape, normalised))) if normalised else None
        self._secret_keys: dict[str, bool] = {}
        self._secret_flags: dict[str, bool] = {}

    def secret_key(self, key: str) -> bool:
        """Whether values under ``key`` are redacted."""
        known = self._secret_keys.get(key)
        if known is None:
            known = self._words is not None and self._words.search(normalise_key(key)) is not None
            if len(self._secret_keys) < 16384:
                self._secret_keys[key] = known
        return known

    def secret_flag(self, flag: str) -> bool:
        """Whether the value of the command-line flag ``flag`` (``--db-password``) is a secret:
        its name holds a redact word and does not name where the secret is (``-stdin``,
        ``-file``)."""
        known = self._secret_flags.get(flag)
        if known is None:
            m = _LONG_FLAG.fullmatch(flag)
            name = normalise_key(m[1]) if m else ""
            known = (
                m is not None
                and (name in _SECRET_FLAG_NAMES or self.secret_key(m[1]))
                and not name.endswith(_WHERE_SUFFIXES)
            )
            if len(self._secret_flags) < 16384:
                self._secret_flags[flag] = known
        return known

    def text(self, text: str) -> str:
        """``text`` with the secrets in it masked: by their form, as the value of a flag that
        carries one, and as the value of a ``key=value`` or ``key: value`` pair whose key
        holds a redact word."""
        if len(text) < 5:  # "pwd=x" is the shortest secret there is
            return text
        text = _masked_forms(text)
        if "-" in text and (
            _may_carry_a_tool_flag(text) or any(self.secret_flag(f) for f in _FLAGS.findall(text))
        ):
            text = _cut(text, self._command_cuts(text, 0, len(text), 0))
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

    def _command_cuts(self, text: str, start: int, stop: int, depth: int) -> list[tuple[int, int]]:
        """The secrets carried by flags in the shell text ``text[start:stop]``: each command
        (words up to an operator) is read as an argv list; a quoted word that holds a command
        (``sh -c '…'``, ``ssh host "…"``) is read too."""
        cuts: list[tuple[int, int]] = []
        words: list[str] = []
        offsets: list[int] = []

        def command_done() -> None:
            for i, a, b in self._argument_cuts(words):
                at = offsets[i]
                b = _literal_end(text, at + a, at + b)
                if b > at + a:
                    cuts.append((at + a, b))
            words.clear()
            offsets.clear()

        for m in _SHELL_TOKEN.finditer(text, start, stop):
            word = m["word"]
            if word is None:
                if m["redirect"] is None:
                    command_done()
                else:
                    words.append(_REDIRECT)
                    offsets.append(m.start())
                continue
            at = m.start()
            if len(word) > 1 and word[0] == word[-1] and word[0] in _QUOTES:
                words.append(word[1:-1])
                offsets.append(at + 1)
            else:
                words.append(word)
                offsets.append(at)
            if depth < 3 and ("'" in word or '"' in word):
                for q in _QUOTED.finditer(word):
                    inner = q.start() + 1
                    if _COMMAND_INSIDE.search(word, inner, q.end() - 1):
                        cuts += self._command_cuts(text, at + inner, at + q.end() - 1, depth + 1)
        command_done()
        return cuts

    def _argument_cuts(self, words: Sequence[str]) -> list[tuple[int, int, int]]:
        """In one command's argv ``words``: ``(word index, start, stop)`` of each secret a
        flag carries."""
        cuts: list[tuple[int, int, int]] = []
        flags: dict[str, tuple[_Carries, bool]] = {}
        value_of: _Carries | None = None  # the last word was a flag whose value is this one
        for i, word in enumerate(words):
            if value_of is not None:
                how, value_of = value_of, None
                if word == _REDIRECT:
                    continue
                if not _is_flag(word):
                    if (span := _carried(word, 0, how)) is not None:
                        cuts.append((i, *span))
                    continue
            if not word.startswith("-"):
                tool = _TOOLS.get(word.strip("\\" + _QUOTES).rsplit("/", 1)[-1])
                if tool is not None:
                    flags.update(tool)
                continue
            flag, equals, _ = word.partition("=")
            if equals and (flag in flags or self.secret_flag(flag)):
                how = flags[flag][0] if flag in flags else "value"
                if (span := _carried(word, len(flag) + 1, how)) is not None:
                    cuts.append((i, *span))
            elif word in flags:
                if flags[word][1]:
                    value_of = flags[word][0]
            elif not word.startswith("--") and word[:2] in flags:  # a value glued on: -pX
                if (span := _carried(word, 2, flags[word[:2]][0])) is not None:
                    cuts.append((i, *span))
            elif word.isascii() and word[1:].isalpha() and flags.get("-" + word[-1], ("", False))[1]:
                value_of = flags["-" + word[-1]][0]  # a cluster ending in one: curl -su
            elif self.secret_flag(word):
                value_of = "value"
        return cuts

    def _masked_argv(self, items: list[Any]) -> list[Any]:
        """An argv-like list with the secrets its flags carry masked."""
        cuts = self._argument_cuts(items)
        for i, a, b in cuts:
            item = items[i]
            b = _literal_end(item, a, b)
            if b > a:
                items[i] = item[:a] + REDACTED + item[b:]
        return items

    def _masked_value(self, value: Any) -> Any:
        """A value under a secret key: masked whole, except a string's shell expansions
        (``$(…)``, backticks), which are code to run, not a secret to keep."""
        if isinstance(value, str) and _EXPANSION.search(value):
            return self.text(_masked_literal(value))
        return REDACTED

    def value(self, value: Any) -> Any:
        """``value`` (JSON-like) with secrets masked by key, by value and by argument, at any
        depth."""
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
            items = [self.value(v) for v in value]
            if len(items) > 1 and all(type(v) is str for v in items):
                return self._masked_argv(items)
            return items
        return value


@functools.lru_cache(maxsize=64)
def redactor(words: frozenset[str]) -> Redactor:
    """The redactor for ``words`` (built once per set)."""
    return Redactor(words)


def redact(value: Any, words: frozenset[str]) -> Any:
    """``value`` with secrets masked: under keys containing one of ``words`` (any spelling),
    by their form inside strings, and as the values of flags that carry them."""
    return redactor(words).value(value)
