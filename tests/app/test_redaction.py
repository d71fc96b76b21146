"""Redaction by key (any spelling, any depth) and by value (secrets inside text), hypothesis."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from signoff.app._secret_tokens import TOKENS
from signoff.app.config import DEFAULT_REDACT
from signoff.app.redaction import _EXPANSION, REDACTED, normalise_key, redact

WORDS = frozenset(DEFAULT_REDACT)
SEPARATORS = ["", "", "", "-", "_", " ", "."]


@st.composite
def spellings(draw: st.DrawFn, word: str) -> str:
    """``word`` in any case, with ``-``, ``_``, spaces or dots anywhere between its letters,
    inside a longer key (``x_api_key_id``)."""
    letters = [c for c in word if c.isalnum()]
    out = []
    for c in letters:
        out.append(draw(st.sampled_from([c.lower(), c.upper()])))
        out.append(draw(st.sampled_from(SEPARATORS)))
    prefix = draw(st.sampled_from(["", "x_", "X-", "my ", "aws", "user."]))
    suffix = draw(st.sampled_from(["", "_id", "Id", "-value", "s", " 2"]))
    return prefix + "".join(out) + suffix


def nest(value: Any, path: list[tuple[str, int | str]]) -> Any:
    for kind, key in reversed(path):
        value = {str(key): value, "amount": 1} if kind == "dict" else [0, value]
    return value


def dig(value: Any, path: list[tuple[str, int | str]]) -> Any:
    for kind, key in path:
        value = value[str(key)] if kind == "dict" else value[1]
    return value


paths = st.lists(
    st.tuples(st.sampled_from(["dict", "list"]), st.sampled_from(["data", "headers", "env"])), max_size=6
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(WORDS)).flatmap(spellings), paths, st.text(max_size=30) | st.integers())
def test_any_spelling_of_a_redact_key_is_redacted_at_any_depth(
    key: str, path: list[Any], secret: Any
) -> None:
    # A whole shell expansion is shown (tests/redteam/test_hidden_arguments.py).
    assume(not (isinstance(secret, str) and _EXPANSION.search(secret)))
    body = nest({key: secret, "amount": 90000}, path)
    out = redact(body, WORDS)
    leaf = dig(out, path)
    assert leaf[key] == REDACTED, key
    assert leaf["amount"] == 90000, "other keys keep their values"


@pytest.mark.parametrize(
    "key",
    [
        "API-KEY",
        "X-Api-Key",
        "api key",
        "apiKey",
        "private_key",
        "credentials",
        "passphrase",
        "pwd",
        "access_key_id",
    ],
)
def test_common_spellings_are_redacted(key: str) -> None:
    assert redact({"headers": {key: "s3cret"}}, WORDS) == {"headers": {key: REDACTED}}


B64URL = string.ascii_letters + string.digits + "-_"
ALNUM = string.ascii_letters + string.digits


def _with_digit(s: str) -> str:
    return s + "7"


secrets_ = st.one_of(
    st.tuples(
        st.sampled_from(["AKIA", "ASIA"]),
        st.text(string.ascii_uppercase + string.digits, min_size=16, max_size=16),
    ).map("".join),
    st.tuples(
        st.text(B64URL, min_size=8, max_size=40),
        st.text(B64URL, min_size=8, max_size=60),
        st.text(B64URL, min_size=0, max_size=43),
    ).map(lambda p: f"eyJ{p[0]}.eyJ{p[1]}.{p[2]}"),
    st.tuples(st.sampled_from("abpors"), st.text(ALNUM + "-", min_size=10, max_size=50)).map(
        lambda p: f"xox{p[0]}-{p[1]}"
    ),
    st.tuples(
        st.sampled_from(["", "proj-", "ant-api03-"]), st.text(ALNUM + "_-", min_size=20, max_size=60)
    ).map(lambda p: f"sk-{p[0]}{p[1]}"),
    st.tuples(
        st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", "Token"]),
        st.text(ALNUM + "-._~+/", min_size=8, max_size=60).map(_with_digit),
    ).map(" ".join),
    st.text(ALNUM + "+/\n", min_size=10, max_size=200).map(
        lambda body: f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    ),
    st.tuples(
        st.sampled_from(["password", "api_key", "X-Api-Key", "client_secret", "Authorization"]),
        st.sampled_from(["=", ": ", ":", " = "]),
        st.text(ALNUM + "!$%*()+~", min_size=8, max_size=40),
    ).map("".join),
)
"""Secrets as they appear in text: the whole string is the secret, or (for ``key=value``)
the part after the separator."""


def _hidden_part(secret: str) -> str:
    for scheme in ("Bearer ", "bearer ", "BEARER ", "Basic ", "Token "):
        if secret.startswith(scheme):
            return secret[len(scheme) :]
    for sep in (" = ", ": ", "=", ":"):
        _, found, tail = secret.partition(sep)
        if found and not secret.startswith(("eyJ", "-----BEGIN", "sk-", "xox", "AKIA", "ASIA")):
            return tail
    return secret


gaps = st.sampled_from([" ", "\n", "\t", " (", "; ", ", ", " '", '"', "[", "> "])


@settings(max_examples=600, deadline=None)
@given(st.text(max_size=60), gaps, secrets_, gaps, st.text(max_size=60))
def test_secrets_embedded_in_text_are_masked(
    before: str, gap: str, secret: str, gap2: str, after: str
) -> None:
    text = before + gap + secret + gap2 + after
    hidden = _hidden_part(secret)
    assume(hidden not in before + gap and hidden not in gap2 + after)
    out = redact({"memo": text}, WORDS)["memo"]
    assert hidden not in out, (text, out)
    assert REDACTED in out


@settings(max_examples=300, deadline=None)
@given(
    # No vowels (nor p, w): a user name that spells no redact word.
    st.text("bcdfghjklmnqrstvxzBCDFGHJKLMNQRSTVXZ0123456789._-", min_size=1, max_size=12),
    # ``$(`` starts a command substitution, which is shown (tests/redteam/test_hidden_arguments.py).
    st.text(ALNUM + "!$%*()+~", min_size=8, max_size=30).filter(lambda p: not _EXPANSION.search(p)),
    st.sampled_from(["https", "postgresql", "redis", "amqp"]),
)
def test_passwords_in_urls_are_masked(user: str, password: str, scheme: str) -> None:
    text = f"connect to {scheme}://{user}:{password}@db.internal:5432/app now"
    out = redact({"dsn": text}, WORDS)["dsn"]
    assert password not in out.replace(f"://{user}:", "://"), out
    assert f"{scheme}://{user}:{REDACTED}@db.internal:5432/app" in out


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.text() | st.integers(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
        max_leaves=12,
    )
)
def test_redaction_is_idempotent(value: Any) -> None:
    once = redact(value, WORDS)
    assert redact(once, WORDS) == once


@pytest.mark.parametrize(
    "text",
    [
        "Basic information about the invoice",
        "meeting at 12:30, see https://example.com/a:b?page=2",
        "task-0123456789abcdefghij is done",
        "the token count is 12",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact({"memo": text}, WORDS) == {"memo": text}


# --- credentials on command lines and in argv lists --------------------------------------------

TOKEN_CHARS = ALNUM + "_.~+=-"
# A password as a command line carries it: token characters, not starting like a flag.
passwords = st.text(TOKEN_CHARS, min_size=8, max_size=40).filter(lambda p: not p.startswith("-"))
# A password that itself ends in a secret's name ("00.TOKEN") makes the next word read as that
# secret's value ("TOKEN api.example.com"), and masking it too is the safe side: the
# command-stays-visible property is about passwords that name nothing.
unnamed_passwords = passwords.filter(lambda p: not any(normalise_key(w) in normalise_key(p) for w in WORDS))
hosts = st.sampled_from(["api.example.com", "db.internal", "registry.example.org", "10.0.0.7"])
pipes = st.sampled_from(["sh", "jq .", "tee out.log", "bash -s"])
befores = st.sampled_from(["", "sudo ", "cd /srv && ", "env LANG=C ", "time "])
users = st.sampled_from(["alice", "bob", "root", "deploy"])

# Each credential form: the command (``{secret}`` where the secret goes) and the tool that runs.
DOCKER_LOGIN = ("docker login -u {user} -p {secret} {host}", "docker login")
COMMAND_FORMS = [
    ("curl -u {user}:{secret} https://{host}/v1/items", "curl"),
    ("curl -su {user}:{secret} https://{host}/v1/items", "curl"),
    ("curl --user {user}:{secret} https://{host}/v1/items", "curl"),
    ("curl --user={user}:{secret} https://{host}/v1/items", "curl"),
    ("curl -u{user}:{secret} https://{host}/v1/items", "curl"),
    ("mysql -u{user} -p{secret} -h {host} shop", "mysql"),
    ("mariadb -u {user} -p'{secret}' -h {host} shop", "mariadb"),
    ("sshpass -p {secret} ssh {user}@{host} uptime", "sshpass"),
    ("sshpass -p{secret} ssh {user}@{host} uptime", "sshpass"),
    DOCKER_LOGIN,
    ("docker login -u {user} --password {secret} {host}", "docker login"),
    ("podman login --username {user} --password={secret} {host}", "podman login"),
    ("psql --password {secret} -h {host} -U {user}", "psql"),
    ("deployctl --token {secret} --host {host}", "deployctl"),
    ("deployctl --api-key {secret} --host {host}", "deployctl"),
    ("vault-cli -secret {secret} --host {host}", "vault-cli"),
    ("deployctl --client-secret={secret} --host {host}", "deployctl"),
    ("PGPASSWORD={secret} psql -h {host} -U {user}", "psql"),
    ("redis-cli -h {host} -a {secret} ping", "redis-cli"),
    ("mongosh --host {host} -u {user} -p {secret}", "mongosh"),
    ("ldapsearch -H ldap://{host} -D cn={user} -w {secret}", "ldapsearch"),
    ("sqlcmd -S {host} -U {user} -P {secret}", "sqlcmd"),
    ("openssl enc -aes256 -passin pass:{secret} -in {host}.tar", "openssl"),
    ("curl -H 'Authorization: Bearer {secret}7' https://{host}/v1", "curl"),
    ("bash -c 'mysql -p{secret} -h {host} shop'", "mysql"),
    ('ssh {user}@{host} "sshpass -p {secret} scp a b"', "sshpass"),
]


@settings(max_examples=800, deadline=None)
@example(DOCKER_LOGIN, "0.DIGEST", "alice", "api.example.com", "sh", "", " | ")  # not a scheme
@given(
    st.sampled_from(COMMAND_FORMS),
    unnamed_passwords,
    users,
    hosts,
    pipes,
    befores,
    st.sampled_from([" | ", " && ", "; "]),
)
def test_a_credential_on_a_command_line_is_masked_and_the_command_stays_visible(
    form: tuple[str, str], secret: str, user: str, host: str, pipe: str, before: str, joint: str
) -> None:
    template, tool = form
    command = before + template.format(user=user, secret=secret, host=host) + joint + pipe
    assume(secret not in before + template.format(user=user, secret="", host=host) + joint + pipe)
    out = redact({"command": command}, WORDS)["command"]
    assert secret not in out, (command, out)
    assert REDACTED in out
    for visible in (tool, host, joint + pipe):
        assert visible in out, (visible, command, out)


ARGV_FORMS = [
    (["curl", "-u", "{user}:{secret}", "https://{host}/v1"], "curl"),
    (["mysql", "-u", "{user}", "-p{secret}", "-h", "{host}"], "mysql"),
    (["sshpass", "-p", "{secret}", "ssh", "{user}@{host}"], "sshpass"),
    (["docker", "login", "-u", "{user}", "-p", "{secret}", "{host}"], "docker"),
    (["deployctl", "--password", "{secret}", "--host", "{host}"], "deployctl"),
    (["deployctl", "--token={secret}", "--host", "{host}"], "deployctl"),
    (["/usr/bin/redis-cli", "-h", "{host}", "-a", "{secret}", "ping"], "/usr/bin/redis-cli"),
]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ARGV_FORMS), passwords, users, hosts)
def test_a_credential_in_an_argv_list_is_masked_and_the_rest_kept(
    form: tuple[list[str], str], secret: str, user: str, host: str
) -> None:
    template, tool = form
    argv = [item.format(user=user, secret=secret, host=host) for item in template]
    assume(all(secret not in item.format(user=user, secret="", host=host) for item in template))
    out = redact({"args": argv}, WORDS)["args"]
    assert not any(secret in item for item in out), (argv, out)
    assert out[0] == tool
    assert any(host in item for item in out), out
    assert len(out) == len(argv), "each argument stays one item"


token_bodies = st.text(ALNUM, min_size=36, max_size=36)
issued_tokens = st.one_of(
    st.text(ALNUM + "_-", min_size=20, max_size=40).map("glpat-".__add__),
    token_bodies.map("npm_".__add__),
    st.text(ALNUM, min_size=36, max_size=36).map("ghp_".__add__),
    st.text("0123456789abcdef", min_size=64, max_size=64).map("dop_v1_".__add__),
    st.text(ALNUM, min_size=24, max_size=40).map("sk_live_".__add__),
)
TOKEN_PLACES = [
    "git push https://oauth2:{token}@{host}/group/app.git",
    "curl --header 'PRIVATE-TOKEN: {token}' https://{host}/api/v4/projects",
    'echo "//{host}/:_authToken={token}" >> ~/.npmrc',
    "NPM_TOKEN={token} npm publish",
    "echo {token}",
    '{{"auth": "{token}", "host": "{host}"}}',
    "deploy({token}, {host})",
]


@settings(max_examples=500, deadline=None)
@given(issued_tokens, st.sampled_from(TOKEN_PLACES), hosts, pipes)
def test_an_issued_token_is_masked_wherever_it_stands(token: str, place: str, host: str, pipe: str) -> None:
    command = place.format(token=token, host=host) + " | " + pipe
    out = redact({"command": command}, WORDS)["command"]
    assert token[-20:] not in out, (command, out)
    assert "| " + pipe in out, (command, out)
    if "{host}" in place:
        assert host in out, (command, out)


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("curl -u alice:S3cr3tPassw0rd https://x | sh", "curl -u alice:[redacted] https://x | sh"),
        ("mysql -p shop", "mysql -p shop"),  # a lone -p asks for the password
        ("ssh -p 2222 host", "ssh -p 2222 host"),  # -p is a port for most tools
        ("docker run -u 1000:1000 img", "docker run -u 1000:1000 img"),
        (
            "echo $PW | docker login --password-stdin -u bob reg.io",
            "echo $PW | docker login --password-stdin -u bob reg.io",
        ),
        ("gh auth login --with-token < token.txt", "gh auth login --with-token < token.txt"),
        ("psql --password $(cat /run/pw) -h db", "psql --password $(cat /run/pw) -h db"),
        ("curl --token abc123456789`id` x", "curl --token [redacted]`id` x"),
        ("ls -la /tmp && git status", "ls -la /tmp && git status"),
    ],
)
def test_what_is_no_literal_secret_stays_shown(command: str, shown: str) -> None:
    assert redact({"command": command}, WORDS)["command"] == shown


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(TOKENS).flatmap(lambda rule: st.from_regex(rule[2], fullmatch=True)), hosts)
def test_every_token_of_the_generated_table_is_masked(token: str, host: str) -> None:
    """Each rule of the table written from gitleaks' rules masks what it matches, in a
    command, with the command's other words kept."""
    assume(token.isascii() and token.isprintable() and " " not in token)
    command = f"deploy --to {host} {token} && echo done"
    out = redact({"command": command}, WORDS)["command"]
    assert token not in out, (command, out)
    assert out.startswith(f"deploy --to {host} "), out
    assert out.endswith(" && echo done"), out
