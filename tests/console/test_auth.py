"""Passwords, the hash-password command, signed sessions and CSRF tokens (no server needed)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from signoff.app.config import Operator
from signoff.app.console.auth import ConsoleSession, Keys, fingerprint, safe_next
from signoff.app.console.passwords import hash_password, verify_password
from signoff.app.settings import Settings

SIGNOFF = Path(sys.executable).with_name("signoff")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}


def test_hash_password_reads_stdin_and_prints_an_argon2id_hash() -> None:
    done = subprocess.run(
        [str(SIGNOFF), "operators", "hash-password"],
        input="a long enough passphrase\n",
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip()
    assert hashed.startswith("$argon2id$")
    assert done.stdout.count("\n") == 1, "the hash alone on stdout"
    assert verify_password(hashed, "a long enough passphrase")
    assert not verify_password(hashed, "a long enough passphrase ")
    assert "operators.NAME.password_hash" in done.stderr


@pytest.mark.parametrize(("typed", "warning"), [("\n", None), ("short\n", "shorter than 12")])
def test_hash_password_refuses_empty_and_warns_on_short(typed: str, warning: str | None) -> None:
    done = subprocess.run(
        [str(SIGNOFF), "operators", "hash-password"],
        input=typed,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        check=False,
    )
    if warning is None:
        assert done.returncode == 2
        assert "empty" in done.stderr
        assert done.stdout == ""
    else:
        assert done.returncode == 0
        assert warning in done.stderr
        assert verify_password(done.stdout.strip(), "short")


def test_hash_password_on_a_terminal_prompts_twice_without_echo() -> None:
    master, slave = pty.openpty()
    # A new session has no controlling terminal, so the prompt uses the pty on stdin.
    proc = subprocess.Popen(
        [str(SIGNOFF), "operators", "hash-password"],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=_env(),
        start_new_session=True,
    )
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, timeout: float = 30) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while marker not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    seen += os.read(master, 1024)
                except OSError:
                    return

    def type_when_echo_is_off(text: bytes) -> None:
        # getpass flushes unread input as it turns echo off: type only after that.
        deadline = time.monotonic() + 30
        while termios.tcgetattr(master)[3] & termios.ECHO and time.monotonic() < deadline:
            time.sleep(0.02)
        os.write(master, text)

    try:
        read_until(b"Password:")
        type_when_echo_is_off(b"typed on a terminal\n")
        read_until(b"Repeat for confirmation:")
        type_when_echo_is_off(b"typed on a terminal\n")
        out, _ = proc.communicate(timeout=60)
        read_until(b"password_hash", timeout=2)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen
    assert b"typed on a terminal" not in seen, "the password was echoed"
    assert verify_password(out.decode().strip(), "typed on a terminal")


def test_verify_password_never_raises() -> None:
    hashed = hash_password("pw-123456789012")
    assert verify_password(hashed, "pw-123456789012")
    assert not verify_password(hashed, "")
    assert not verify_password("not-a-hash", "pw")
    assert not verify_password("$argon2id$v=19$m=65536,t=3,p=4$garbage", "pw")


def test_sessions_are_signed_and_expire() -> None:
    keys = Keys("k" * 32, max_age=60)
    session = ConsoleSession.start(60, operator="alice", fingerprint="f")
    raw = keys.encode(session)
    assert keys.decode(raw) == session
    flipped = raw[:-5] + ("A" if raw[-5] != "A" else "B") + raw[-4:]
    assert keys.decode(flipped) is None
    assert Keys("other" * 8, max_age=60).decode(raw) is None, "another secret"
    assert keys.decode("") is None
    assert keys.decode("garbage") is None
    expired = ConsoleSession("n", time.time() - 1, "alice", "f")
    assert keys.decode(keys.encode(expired)) is None


def test_csrf_tokens_are_bound_to_the_session() -> None:
    keys = Keys("k" * 32, max_age=60)
    one, two = ConsoleSession.start(60), ConsoleSession.start(60)
    token = keys.csrf_token(one)
    assert keys.csrf_ok(one, token)
    assert not keys.csrf_ok(two, token)
    assert not keys.csrf_ok(None, token)
    assert not keys.csrf_ok(one, "")
    assert not keys.csrf_ok(one, None)
    assert not keys.csrf_ok(one, token.upper())
    assert not Keys("x" * 32, max_age=60).csrf_ok(one, token)


def test_a_new_password_ends_old_sessions() -> None:
    old = Operator(password_hash=SecretStr(hash_password("first-password-1")))
    new = Operator(password_hash=SecretStr(hash_password("second-password-2")))
    assert fingerprint(old) != fingerprint(new)
    assert fingerprint(old) == fingerprint(old)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/ui/history?status=approved", "/ui/history?status=approved"),
        ("/ui/", "/ui/"),
        ("https://evil.example/ui", "/ui/"),
        ("//evil.example", "/ui/"),
        ("/v1/admin/config", "/ui/"),
        ("/ui\\evil", "/ui/"),
        (None, "/ui/"),
    ],
)
def test_safe_next(value: object, expected: str) -> None:
    assert safe_next(value) == expected


def test_weak_session_secret_is_refused() -> None:
    with pytest.raises(ValidationError, match="SIGNOFF_SESSION_SECRET is too short"):
        Settings(session_secret="short")
    assert Settings(session_secret="short", environment="development").session_secret is not None
    assert Settings(session_secret="x" * 32).session_max_age_seconds == 12 * 3600
    with pytest.raises(ValidationError):
        Settings(session_max_age_seconds=0)


@pytest.mark.parametrize("token", ["x", "abcdefghijklmnopqrstuvw", "  " + "a" * 23 + "  "])
def test_a_short_admin_token_is_refused_outside_development(token: str) -> None:
    with pytest.raises(ValidationError, match="SIGNOFF_ADMIN_TOKEN is too short") as caught:
        Settings(admin_token=token)  # type: ignore[arg-type]
    assert "secrets.token_urlsafe(32)" in str(caught.value)
    assert Settings(admin_token=token, environment="development").admin_token is not None  # type: ignore[arg-type]
    assert Settings(admin_token="a" * 24).admin_token is not None  # type: ignore[arg-type]


def test_the_server_will_not_start_with_a_short_admin_token(tmp_path: Path) -> None:
    from tests.conftest import free_port

    env = {**_env(), "SIGNOFF_ADMIN_TOKEN": "x", "SIGNOFF_DATABASE_URL": f"sqlite:///{tmp_path / 's.db'}"}
    done = subprocess.run(
        [str(SIGNOFF), "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "SIGNOFF_ADMIN_TOKEN is too short (1 of the 24 characters needed outside development)" in line
    assert "secrets.token_urlsafe(32)" in line
    assert not (tmp_path / "s.db").exists()  # refused before touching anything
