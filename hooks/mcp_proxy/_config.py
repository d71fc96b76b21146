"""The proxy's command line, read into a :class:`ProxyConfig` (standard library only)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from signoff.hooks._base import ENV_API_KEY
from signoff.hooks.mcp_proxy._calls import NAME_PATTERN

__all__ = ["DEFAULT_HOLD", "PROG", "ConfigError", "ProxyConfig", "parse_args"]

PROG = "signoff-mcp-proxy"
DEFAULT_HOLD = 50.0
"""Seconds a gated call is held waiting for a person: below the common 60 s client timeout."""

USAGE = f"""\
{PROG} --name NAME [--hold S] [--submit-deadline S] [--listen HOST:PORT] -- COMMAND [ARG ...]
       {PROG} --name NAME --url URL [--header-env HEADER=VAR ...] [...]"""

_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(Exception):
    """The command line or the environment cannot make a working proxy (exit 2, one line)."""


class ProxyConfig(NamedTuple):
    """What one proxy serves, and how."""

    name: str
    """The upstream's name in gated tool names: ``mcp__<name>__<tool>``."""
    command: tuple[str, ...] = ()
    """A stdio upstream: the command the proxy starts (and stops with itself)."""
    url: str | None = None
    """A streamable-HTTP upstream."""
    headers: Mapping[str, str] = {}
    """HTTP headers for a streamable-HTTP upstream, their values read from the environment."""
    hold: float = DEFAULT_HOLD
    submit_deadline: float | None = None
    """Seconds to retry an unreachable Signoff (default ``$SIGNOFF_SUBMIT_DEADLINE``, else 5)."""
    listen: tuple[str, int] | None = None
    """Serve streamable HTTP on this address instead of stdio."""
    listen_token: str | None = None
    """The bearer token HTTP clients of the proxy must send, if any."""
    secret_vars: frozenset[str] = frozenset()
    """Environment variables a stdio upstream must not inherit."""

    def describe_upstream(self) -> str:
        if self.url is not None:
            return f"the MCP server at {self.url}"
        return f"the MCP server `{' '.join(self.command)}`"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=USAGE,
        description=(
            "Serve one MCP server's tools, resources and prompts unchanged, and ask Signoff before "
            "each tools/call (as tool mcp__NAME__TOOL). SIGNOFF_URL and SIGNOFF_API_KEY come from "
            "the environment."
        ),
    )
    p.add_argument("--name", required=True, help="the server's name in gated tool names (mcp__NAME__TOOL)")
    p.add_argument(
        "--hold",
        type=float,
        default=DEFAULT_HOLD,
        metavar="S",
        help=f"seconds to hold a call waiting for approval, then say it waits (default {DEFAULT_HOLD:g})",
    )
    p.add_argument(
        "--submit-deadline",
        type=float,
        metavar="S",
        help="seconds to retry an unreachable Signoff, then refuse (default $SIGNOFF_SUBMIT_DEADLINE or 5)",
    )
    p.add_argument("--url", help="a streamable-HTTP upstream (instead of -- COMMAND ...)")
    p.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="HEADER=VAR",
        help="send HEADER with the value of environment variable VAR to the --url upstream (repeatable)",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp (default: stdio)"
    )
    p.add_argument(
        "--listen-token-env",
        metavar="VAR",
        help="require `Authorization: Bearer $VAR` from HTTP clients (needed to listen beyond loopback)",
    )
    return p


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen takes HOST:PORT (e.g. 127.0.0.1:8765), got {value!r}")
    return host, int(port)


def loopback(host: str) -> bool:
    """Whether ``host`` (as ``--listen`` gives it) is a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _env_value(var: str, env: Mapping[str, str], option: str) -> str:
    if not _ENV_VAR.fullmatch(var):
        raise ConfigError(f"{option}: {var!r} is not an environment variable name")
    value = env.get(var, "").strip()
    if not value:
        raise ConfigError(f"{option}: environment variable {var} is not set (or empty); set it and retry")
    return value


def _headers(specs: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for spec in specs:
        header, sep, var = spec.partition("=")
        header, var = header.strip(), var.strip()
        if not sep or not _HEADER.fullmatch(header):
            raise ConfigError(f"--header-env takes HEADER=VAR (e.g. Authorization=GITHUB_AUTH), got {spec!r}")
        headers[header] = _env_value(var, env, f"--header-env {spec}")
    return headers


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProxyConfig:
    """Read the command line; raise :class:`ConfigError` (or exit 2 from argparse) when unusable."""
    env = os.environ if env is None else env
    argv = list(argv)
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    args = _parser().parse_args(argv)
    if not NAME_PATTERN.fullmatch(args.name):
        raise ConfigError(
            f"--name must be 1-64 letters, digits, '-' or '_' (as in mcp__NAME__TOOL), got {args.name!r}"
        )
    if bool(command) == (args.url is not None):
        raise ConfigError(
            "name one upstream: `-- COMMAND [ARG ...]` (stdio) or `--url URL` (streamable HTTP)"
        )
    if args.url is not None and not args.url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must start with http:// or https://, got {args.url!r}")
    if args.header_env and args.url is None:
        raise ConfigError("--header-env is for a --url upstream; a stdio upstream inherits the environment")
    if not args.hold >= 0:
        raise ConfigError(f"--hold must be >= 0 seconds, got {args.hold:g}")
    if args.submit_deadline is not None and not args.submit_deadline > 0:
        raise ConfigError(f"--submit-deadline must be > 0 seconds, got {args.submit_deadline:g}")
    listen = _listen(args.listen) if args.listen is not None else None
    token = None
    if args.listen_token_env is not None:
        if listen is None:
            raise ConfigError("--listen-token-env goes with --listen")
        token = _env_value(args.listen_token_env, env, "--listen-token-env")
    if listen is not None and token is None and not loopback(listen[0]):
        raise ConfigError(
            f"--listen {args.listen} is reachable beyond this machine: anyone who reaches it could call "
            "the upstream's tools under this agent's Signoff key; add --listen-token-env VAR"
        )
    secret = {ENV_API_KEY} | ({args.listen_token_env} if args.listen_token_env else set())
    return ProxyConfig(
        name=args.name,
        command=tuple(command),
        url=args.url,
        headers=_headers(args.header_env, env),
        hold=args.hold,
        submit_deadline=args.submit_deadline,
        listen=listen,
        listen_token=token,
        secret_vars=frozenset(secret),
    )
