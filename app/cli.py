"""The ``signoff`` command line.

It works on the database directly (the same ``SIGNOFF_DATABASE_URL`` and ``SIGNOFF_CONFIG``
as the server), not through the server's API. Every failure is one line on stderr that
names the cause and the fix, with a non-zero exit; ``SIGNOFF_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperOption

if TYPE_CHECKING:  # imported where used: `signoff --help` loads nothing of the server
    import socket

    from sqlmodel.ext.asyncio.session import AsyncSession

    from signoff.app.audit import BrokenLink
    from signoff.app.config import ConfigError, SignoffConfig
    from signoff.app.models import AgentKey, ConfirmationRequest, Grant, PersonalToken
    from signoff.app.settings import Settings
    from signoff.channels import Verdict

# Help in click's plain form (rich_markup_mode=None): typer's rich help imports rich and
# markdown-it, which cost `signoff --help` more than the rest of its start together.
app = typer.Typer(
    help="Signoff: human approval for AI agents' tool calls.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _group(help: str) -> typer.Typer:
    return typer.Typer(help=help, no_args_is_help=True, rich_markup_mode=None)


db_app = _group("The database.")
config_app = _group("The YAML configuration.")
keys_app = _group("Agent API keys.")
requests_app = _group("Confirmation requests.")
audit_app = _group("The audit log.")
hook_app = _group("Agent runtime hooks.")
operators_app = _group("Console operators.")
grants_app = _group("Grants: who may act without asking.")
tokens_app = _group("Personal tokens: the command line deciding as the person who made one in the console.")
receipts_app = _group("Signed receipts and their keys.")
readonly_app = _group("The read-only switch that `readonly_guard` hooks watch.")
for sub, name in [
    (db_app, "db"),
    (config_app, "config"),
    (keys_app, "keys"),
    (requests_app, "requests"),
    (audit_app, "audit"),
    (readonly_app, "readonly"),
    (hook_app, "hook"),
    (operators_app, "operators"),
    (grants_app, "grants"),
    (tokens_app, "tokens"),
    (receipts_app, "receipts"),
]:
    app.add_typer(sub, name=name)

T = TypeVar("T")
STATUSES = ("pending", "approved", "rejected", "expired", "cancelled")
"""A request's statuses (signoff.app.models.Status), for ``requests list --status``."""


def _cli_actor(name: str | None = None) -> Any:
    from signoff.app.audit import Actor

    return Actor("cli", name, name or "command line")


def _print_version(wanted: bool) -> None:
    if wanted:
        from signoff.app import version

        typer.echo(f"signoff {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the release and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    pass


class CliError(Exception):
    """A failure to report as one ``error: …`` line (exit code ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _settings() -> Settings:
    from signoff.app.settings import Settings

    try:
        return Settings()
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        detail = "; ".join(str(e.get("msg", e)) for e in errors()) if callable(errors) else str(exc)
        raise CliError(detail.removeprefix("Value error, "), 2) from None


def _config(settings: Settings, *, needed_for: str) -> SignoffConfig:
    from signoff.app.config import ConfigError, load_config

    if settings.config is None:
        raise CliError(
            f"SIGNOFF_CONFIG is not set, and {needed_for} needs the server's configuration: "
            "set SIGNOFF_CONFIG=/path/to/signoff.yaml",
            2,
        )
    try:
        return load_config(settings.config)
    except ConfigError as exc:
        raise CliError(_config_problems(settings.config, exc), 2) from None


def _config_problems(path: Path, exc: ConfigError) -> str:
    count = len(exc.problems)
    first = exc.problems[0] if exc.problems else str(exc)
    more = f" (and {count - 1} more: run `signoff config check {path}`)" if count > 1 else ""
    return f"the configuration is invalid: {first}{more}"


def _safe_url(url: str) -> str:
    """The database URL without its password."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def _database_error(exc: BaseException, url: str) -> CliError | None:
    """Name the database failures a user can fix: not migrated, not reachable, and behind a
    transaction pooler the settings do not declare."""
    import sqlalchemy.exc

    from signoff.app.readiness import POOLED, is_pooled

    text = str(getattr(exc, "orig", None) or exc)
    where = _safe_url(url)
    if is_pooled(exc):
        return CliError(f"{POOLED} (the database at {where} said: {text.strip().splitlines()[0]})", 2)
    if "no such table" in text or ("does not exist" in text and "relation" in text):
        return CliError(
            f"the database at {where} has no Signoff tables yet: run `signoff db upgrade` "
            "(or start `signoff serve`, which migrates it) with the same SIGNOFF_DATABASE_URL"
        )
    if isinstance(exc, OSError | sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        reason = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return CliError(
            f"cannot reach the database at {where} ({reason}): "
            "check SIGNOFF_DATABASE_URL and that the database is running"
        )
    return None


def _with_session(
    work: Callable[[AsyncSession, Settings], Awaitable[T]], *, config: SignoffConfig | None = None
) -> T:
    """Run ``work`` in one transaction; the events it causes (a decision, a revoked grant) are
    owed to ``config``'s webhooks, as the server's are."""
    settings = _settings()
    routes = config.subscribers if config is not None else None

    async def run() -> T:
        from signoff.app import webhooks
        from signoff.app.db import create_engine, sessionmaker, transaction

        engine = create_engine(
            settings.database_url, sync=settings.sqlite_sync, pooling=settings.database_pooling
        )
        try:
            async with transaction(sessionmaker(engine, webhooks=routes, events=webhooks.owe)) as session:
                return await work(session, settings)
        finally:
            await engine.dispose()

    import asyncio

    with _database(settings):
        return asyncio.run(run())


@contextmanager
def _database(settings: Settings) -> Iterator[None]:
    """Turn the database failures a user can fix into one line that says how."""
    from signoff.app.db import SchemaError

    try:
        yield
    except CliError:
        raise
    except SchemaError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:
        known = _database_error(exc, settings.database_url)
        if known is None:
            raise
        raise known from exc


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on.")] = None,
    migrate_first: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="Apply migrations first.")
    ] = True,
) -> None:
    """Apply the migrations, then serve the API."""
    import gc

    import uvicorn

    from signoff.app import serverlock
    from signoff.app.db import migrate
    from signoff.app.drain import Server
    from signoff.app.logs import configure_logging
    from signoff.app.main import create_app
    from signoff.app.runtime import missing_link_settings

    settings = _settings()
    if settings.config is not None:
        config = _config(settings, needed_for="serve")  # refuse to start on a file with problems
        problem = missing_link_settings(settings, config)
        if problem is not None:
            raise CliError(problem, 2)
    else:
        sys.stderr.write(
            "warning: SIGNOFF_CONFIG is not set, so no agent is configured and EVERY agent's call "
            "will be denied; set SIGNOFF_CONFIG=/path/to/signoff.yaml (examples/signoff.yaml to try)\n"
        )
    listener = _listen(host or settings.host, port or settings.port, given=port is not None)
    configure_logging(settings.log_format, settings.log_level)
    try:
        serverlock.hold(settings.database_url)  # one SQLite file, one server
    except serverlock.ServerLockHeld as exc:
        raise CliError(str(exc)) from None
    _refuse_undeclared_pooling(settings)
    if migrate_first and settings.migrate_on_start:
        with _database(settings):
            migrate(settings.database_url, pooling=settings.database_pooling)
    _receipt_key_in_use(settings)
    application = create_app(settings=settings)
    # What start-up made (modules, schemas, compiled queries) lives as long as the process:
    # kept out of the collector's passes, a full collection walks only what serving made
    # (about twice as fast, and no pause of a tenth of a second under load).
    gc.collect()
    gc.freeze()
    listening = uvicorn.Config(
        application,
        host=host or settings.host,
        port=port or settings.port,
        log_config=None,  # keep the logging configured above
        log_level=settings.log_level.lower(),
        access_log=False,
        # On SIGTERM waiting agents are answered at once (to wait again elsewhere); requests
        # in flight and the outbox's sends get this long (signoff.app.drain).
        timeout_graceful_shutdown=settings.shutdown_seconds,
        # Thousands of agents re-attach at once after a restart; a short accept queue drops
        # their SYNs into seconds-long retries (the kernel caps this at net.core.somaxconn).
        backlog=8192,
    )
    Server(listening, application.state.drain).run(sockets=[listener])


def _receipt_key_in_use(settings: Settings) -> None:
    """Refuse to serve when the receipts' key in use is the operator's and was not given."""
    from signoff.app import receipt_keys

    secret = settings.receipt_key.get_secret_value() if settings.receipt_key is not None else None
    operator = receipt_keys.operator_key(secret, settings.receipt_key_file)

    async def work(session: AsyncSession, settings: Settings) -> None:
        if operator is None:
            await receipt_keys.signing_key(session)

    try:
        _with_session(work)
    except receipt_keys.KeyUnavailable as exc:
        raise CliError(str(exc), 2) from None
    except Exception:
        # The database is not ready (behind, read-only, unreachable): the server starts all the
        # same and says why on /readyz; each decision signs its receipt or fails closed then.
        return


def _refuse_undeclared_pooling(settings: Settings) -> None:
    """Refuse to serve through a transaction pooler the settings do not declare (see
    signoff.app.pooling): there keys would fail, and some calls be answered by other statements."""
    from signoff.app.db import is_sqlite

    if is_sqlite(settings.database_url) or settings.database_pooling == "transaction":
        return
    from signoff.app import pooling

    try:
        pid = pooling.shared_server_process(settings.database_url)
    except Exception:
        return  # unreachable: the migration, or the first request, says so in its own words
    if pid is not None:
        raise CliError(pooling.undeclared(settings.database_url, pid), 2)


def _listen(host: str, port: int, *, given: bool) -> socket.socket:
    """The listening socket, bound before anything starts, so that a port in use is one line."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = "--port" if given else "SIGNOFF_PORT"
        fix = f"stop what listens there or choose another port ({where}={port + 1})"
        if isinstance(exc, socket.gaierror):
            raise CliError(f"cannot listen on {host}: {exc.strerror}; check SIGNOFF_HOST", 2) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {fix}", 2) from None
    sock.set_inheritable(True)
    return sock


def _at(revision: str | None) -> str:
    from signoff.app.db import head_revision

    if revision is None:
        return "no revision"
    return f"head ({revision})" if revision == head_revision() else revision


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply the migrations to SIGNOFF_DATABASE_URL, up to REVISION (default: head)."""
    from signoff.app.db import migrate

    settings = _settings()
    with _database(settings):
        left = migrate(settings.database_url, revision, pooling=settings.database_pooling)
    typer.echo(f"database at {_safe_url(settings.database_url)} is at {_at(left)}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision (`base`: before the first).")],
) -> None:
    """Undo the migrations after REVISION. Refused, with nothing changed, if that would drop
    data the database holds."""
    from signoff.app.db import downgrade

    settings = _settings()
    with _database(settings):
        left = downgrade(settings.database_url, revision, pooling=settings.database_pooling)
    typer.echo(f"database at {_safe_url(settings.database_url)} is at {_at(left)}")


@db_app.command("backup")
def db_backup(path: Annotated[Path, typer.Argument(help="The file to write (it must not exist).")]) -> None:
    """Copy the SQLite database to PATH, consistent while the server writes; on PostgreSQL,
    print the pg_dump line to run."""
    from signoff.app.backup import BackupError, backup

    try:
        done = backup(_settings().database_url, path)
    except BackupError as exc:
        raise CliError(str(exc)) from None
    typer.echo(done.output)
    if done.note:
        typer.echo(done.note, err=True)


@config_app.command("check")
def config_check(file: Annotated[Path, typer.Argument(help="The YAML file.")]) -> None:
    """Validate a configuration file; print each problem with its path (and each warning)."""
    from signoff.app.config import ConfigError, load_config

    try:
        cfg = load_config(file)
    except ConfigError as exc:
        for problem in exc.problems:
            typer.echo(problem, err=True)
        raise typer.Exit(1) from None
    for warning in cfg.warnings():
        typer.echo(f"warning: {warning}", err=True)
    gates = sum(len(a.hooks) for a in cfg.agents.values())
    counts = [
        _count(len(cfg.channels), "channel"),
        _count(len(cfg.people), "person", "people"),
        _count(len(cfg.agents), "agent"),
        _count(gates, "gate"),
    ]
    typer.echo(f"{file}: ok ({', '.join(counts)})")


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


@config_app.command("reload")
def config_reload(
    url: Annotated[
        str | None, typer.Option(help="The running server (default http://SIGNOFF_HOST:SIGNOFF_PORT).")
    ] = None,
) -> None:
    """Ask the running server to reload SIGNOFF_CONFIG (POST /v1/admin/config/reload).

    The server validates the whole file first: with any problem nothing changes and each
    problem is printed. With replicas, run it against each (or send each one SIGHUP).
    """
    import httpx

    settings = _settings()
    if settings.admin_token is None:
        raise CliError("SIGNOFF_ADMIN_TOKEN is not set: the reload needs the server's operator token", 2)
    base = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
    try:
        answer = httpx.post(
            f"{base}/v1/admin/config/reload",
            headers={"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"},
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise CliError(
            f"cannot reach Signoff at {base} ({exc}): is `signoff serve` running there? (--url)"
        ) from None
    if answer.status_code in (401, 403):
        raise CliError(f"Signoff at {base} refused the operator token (HTTP {answer.status_code})")
    try:
        body = answer.json()
    except ValueError:
        raise CliError(f"Signoff at {base} answered HTTP {answer.status_code}, not a reload result") from None
    if answer.status_code == 422 and isinstance(body, dict) and body.get("problems"):
        for problem in body["problems"]:
            typer.echo(f"error: {problem}", err=True)
        raise CliError(f"the configuration was not reloaded; {body.get('version')} stays in force")
    if answer.status_code != 200:
        raise CliError(f"Signoff at {base} answered HTTP {answer.status_code}: {str(body)[:200]}")
    rebuilt = ", ".join(body.get("rebuilt") or []) or "none"
    typer.echo(f"configuration {body['version']} in force (channels rebuilt: {rebuilt})")


@keys_app.command("create")
def keys_create(
    agent: Annotated[str, typer.Argument(help="The agent's name in the configuration.")],
    force: Annotated[
        bool, typer.Option("--force", help="Create it even if SIGNOFF_CONFIG names no such agent.")
    ] = False,
) -> None:
    """Create an API key for AGENT; the key is printed once, alone on the last line."""
    from signoff.app.keys import create_key

    settings = _settings()
    if settings.config is None:
        typer.echo(
            f"warning: SIGNOFF_CONFIG is not set, so nothing says whether {agent!r} is configured; "
            "an agent the server's file does not name is denied on every call",
            err=True,
        )
    elif not force:
        config = _config(settings, needed_for="`signoff keys create`")
        if agent not in config.agents:
            from signoff.app.spelling import did_you_mean

            known = ", ".join(sorted(config.agents)) or "none"
            hint = did_you_mean(agent, config.agents)
            raise CliError(
                f"{settings.config} names no agent {agent!r}{'; ' + hint if hint else ''} "
                f"(its agents: {known}); a key for it would be denied on every call. "
                "Add the agent to the file, or pass --force to create the key anyway",
                2,
            )

    async def work(session: AsyncSession, settings: Settings) -> str:
        row, token = await create_key(session, agent, actor=_cli_actor())
        return f"created key {row.id} for agent {agent}; store it now, it is not shown again:\n{token}"

    typer.echo(_with_session(work))


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str | None, typer.Argument(help="The key id (see `signoff keys list`).")] = None,
    agent: Annotated[str | None, typer.Option(help="Revoke every key of this agent.")] = None,
) -> None:
    """Revoke one key, or all keys of an agent."""
    if (key_id is None) == (agent is None):
        raise CliError("name a key id or --agent AGENT (see `signoff keys list`)", 2)
    from signoff.app.keys import revoke_keys

    async def work(session: AsyncSession, settings: Settings) -> list[str]:
        return await revoke_keys(session, key_id=key_id, agent_id=agent, actor=_cli_actor())

    revoked = _with_session(work)
    if not revoked:
        raise CliError("no live key matched (see `signoff keys list`)")
    typer.echo(f"revoked {', '.join(revoked)}")


@keys_app.command("list")
def keys_list() -> None:
    """List keys (ids and agents; never the keys themselves)."""
    from sqlmodel import col, select

    from signoff.app.models import AgentKey

    async def work(session: AsyncSession, settings: Settings) -> list[AgentKey]:
        return list((await session.exec(select(AgentKey).order_by(col(AgentKey.created_at)))).all())

    for k in _with_session(work):
        state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "live"
        typer.echo(f"{k.id}  {k.agent_id}  created {k.created_at:%Y-%m-%d %H:%M}  {state}")


@requests_app.command("list")
def requests_list(
    status: Annotated[
        str | None, typer.Option(help="Only this status: pending, approved, rejected, expired or cancelled.")
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 50,
) -> None:
    """A table of requests, newest first: one per line after the header, id first."""
    if status is not None and status.strip().lower() not in STATUSES:
        raise CliError(f"--status {status!r}: one of {', '.join(STATUSES)}", 2)
    wanted = status.strip().lower() if status is not None else None

    async def work(session: AsyncSession, settings: Settings) -> list[ConfirmationRequest]:
        from signoff.app import queries
        from signoff.app.models import Status

        return await queries.list_requests(
            session,
            queries.RequestFilter(status=Status(wanted) if wanted else None, agent=agent),
            limit=limit,
        )

    found = _with_session(work)
    if not found:
        of = f" of agent {agent}" if agent else ""
        typer.echo(f"no {wanted + ' ' if wanted else ''}requests{of}")
        return
    rows = [("ID", "STATUS", "AGENT", "TOOL", "WHEN", "DECIDED BY")]
    for r in found:
        if r.decided_at is not None:
            when = f"decided {r.decided_at:%Y-%m-%d %H:%M:%S}Z"
        elif r.status == "pending":
            when = f"expires {r.expires_at:%Y-%m-%d %H:%M:%S}Z"
        else:
            when = f"created {r.created_at:%Y-%m-%d %H:%M:%S}Z"
        by = r.decided_by_name or r.decided_by_user_id or "-"
        rows.append((r.id, str(r.status), r.agent_id, r.tool_name, when, by))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        typer.echo("  ".join([*(v.ljust(w) for v, w in zip(row, widths, strict=False)), row[-1]]))


@requests_app.command("show")
def requests_show(request_id: str) -> None:
    """A request with its votes, as JSON."""
    from signoff.app.queries import request_out
    from signoff.app.requests.states import get_request

    async def work(session: AsyncSession, settings: Settings) -> str | None:
        req = await get_request(session, request_id)
        if req is None:
            return None
        return (await request_out(session, req)).model_dump_json(indent=2)

    out = _with_session(work)
    if out is None:
        raise CliError(f"no request {request_id} (see `signoff requests list`)")
    typer.echo(out)


def _grant_option(text: str) -> tuple[str, int, list[str] | None]:
    """``session:1h`` or ``agent:30m:to,memo`` → scope, seconds and the ``same`` fields (if named)."""
    from signoff.app.builtin_hooks.confirmation_gate import parse_duration

    scope, _, rest = text.strip().partition(":")
    duration, _, fields = rest.partition(":")
    try:
        seconds = int(parse_duration(duration).total_seconds())
    except ValueError as exc:
        raise CliError(f"--grant {text!r}: {exc} (write e.g. --grant session:1h)", 2) from None
    if scope not in ("session", "agent"):
        raise CliError(f"--grant {text!r}: the scope is session or agent (write e.g. --grant session:1h)", 2)
    same = [f.strip() for f in fields.split(",") if f.strip()] if fields else None
    return scope, seconds, same


def _set_options(texts: list[str]) -> dict[str, Any] | None:
    """``--set amount=40000 --set memo=rent`` → the changed arguments (each value read as JSON,
    else as text); None when there are none."""
    from signoff.channels import edit_problem, parse_edit_value

    if not texts:
        return None
    arguments: dict[str, Any] = {}
    for text in texts:
        name, eq, value = text.partition("=")
        if not eq or not name.strip():
            raise CliError(f"--set {text!r}: write FIELD=VALUE (e.g. --set amount=40000)", 2)
        arguments[name.strip()] = parse_edit_value(value)
    if (problem := edit_problem(arguments)) is not None:
        raise CliError(f"--set: {problem}", 2)
    return arguments


def _verdict(name: str) -> Verdict:
    from signoff.channels import Verdict

    return Verdict(name)


def _decide_with_token(request_id: str, verdict: Verdict, reason: str | None, token: str) -> str:
    """Decide through the server at ``SIGNOFF_URL`` as the person of the personal token: the
    outcome's message, or :class:`CliError` with the server's reason."""
    import httpx

    base = os.environ.get("SIGNOFF_URL", "").strip().rstrip("/")
    if not base:
        raise CliError("SIGNOFF_TOKEN is set but SIGNOFF_URL is not: set it to the server (https://…)", 2)
    body = {"verdict": verdict.value, **({"reason": reason} if reason else {})}
    try:
        answer = httpx.post(
            f"{base}/v1/me/requests/{request_id}/decision",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {base} ({type(exc).__name__}); check SIGNOFF_URL") from None
    try:
        shown: Any = answer.json()
    except ValueError:
        shown = {}
    detail = shown.get("detail") if isinstance(shown, dict) else None
    if answer.status_code == 404:
        raise CliError(f"no request {request_id} at {base}")
    if answer.status_code != 200:
        raise CliError(str(detail or f"{base} answered {answer.status_code}"))
    status = shown.get("status") if isinstance(shown, dict) else None
    if status == "pending":
        return f"Vote recorded; request {request_id} is still pending."
    decided = (shown.get("decided_by") or {}) if isinstance(shown, dict) else {}
    return f"Request {request_id} is {status} by {decided.get('name') or decided.get('user_id')}."


def _decide(
    request_id: str,
    verdict: Verdict,
    reason: str | None,
    as_: str | None,
    grant: str | None = None,
    changes: list[str] | None = None,
) -> None:
    from signoff.app.operators import GrantNamed, decide
    from signoff.app.requests.eligibility import gates_of
    from signoff.app.requests.states import get_request

    token = os.environ.get("SIGNOFF_TOKEN", "").strip()
    if token and (as_ is None or not as_.strip()):
        if grant is not None or changes:
            raise CliError("--grant and --set need the database (--as NAME); a token approves once", 2)
        typer.echo(_decide_with_token(request_id, verdict, reason, token))
        return
    settings = _settings()
    config = _config(settings, needed_for=f"`signoff requests {verdict.value}`")
    wanted = _grant_option(grant) if grant is not None else None
    arguments = _set_options(changes or [])

    async def work(session: AsyncSession, settings: Settings) -> tuple[bool, str] | None:
        req = await get_request(session, request_id)
        if req is None:
            return None
        gated = next((g.config_version for g in gates_of(req) if g.config_version), None)
        if gated is not None and gated != config.version:
            sys.stderr.write(
                f"note: request {request_id} was gated under configuration {gated}; "
                f"{settings.config} is {config.version}. Who may decide it is the request's own "
                f"gates' (as of {gated}), and an approval must suit the file's gates too\n"
            )
        if as_ is None or not as_.strip():
            listed = dict.fromkeys(a for g in gates_of(req) for a in g.approvers)
            approvers = ", ".join(listed) or "anyone listed in people"
            raise CliError(
                f"say who decides: `signoff requests {verdict.value} {request_id} --as NAME` "
                f"(approvers of this request: {approvers})",
                2,
            )
        choice = GrantNamed(*wanted) if wanted is not None else None
        result = await decide(
            session,
            request_id,
            verdict=verdict,
            operator=as_.strip(),
            config=config,
            reason=reason,
            grant=choice,
            arguments=arguments,
            via="cli",
        )
        return None if result is None else (result.accepted, result.message)

    out = _with_session(work, config=config)
    if out is None:
        raise CliError(f"no request {request_id} (see `signoff requests list`)")
    accepted, message = out
    if not accepted:
        raise CliError(message)
    typer.echo(message)


@requests_app.command("approve")
def requests_approve(
    request_id: str,
    reason: Annotated[str | None, typer.Option(help="Why.")] = None,
    as_: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="NAME",
            help="Operator name (a person in the directory), deciding on the database; without it, "
            "SIGNOFF_TOKEN (a personal token from the console) decides through SIGNOFF_URL.",
        ),
    ] = None,
    grant: Annotated[
        str | None,
        typer.Option(
            metavar="SCOPE:DURATION",
            help="Approve with a grant the gate offers instead of once: SCOPE:DURATION[:FIELD,…] "
            "(session:1h, agent:30m:to).",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            help="Approve with an argument changed: FIELD=VALUE, the value read as JSON, else as "
            "text (--set amount=40000 --set memo=rent); only fields the gate lists as editable.",
        ),
    ] = None,
) -> None:
    """Approve a request as an operator (once, with a grant the gate offers, or with changes)."""
    _decide(request_id, _verdict("approve"), reason, as_, grant, set_)


@requests_app.command("reject")
def requests_reject(
    request_id: str,
    reason: Annotated[str | None, typer.Option(help="Why (shown to the agent).")] = None,
    as_: Annotated[
        str | None,
        typer.Option(
            "--as",
            metavar="NAME",
            help="Operator name (a person in the directory), deciding on the database; without it, "
            "SIGNOFF_TOKEN (a personal token from the console) decides through SIGNOFF_URL.",
        ),
    ] = None,
) -> None:
    """Reject a request as an operator."""
    _decide(request_id, _verdict("reject"), reason, as_)


@grants_app.command("list")
def grants_list(
    all_: Annotated[bool, typer.Option("--all", help="Expired and revoked ones too.")] = False,
    agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
) -> None:
    """One grant per line, id first, newest first: active ones unless --all."""
    from signoff.app.models import utcnow
    from signoff.app.requests import grants

    now = utcnow()

    async def work(session: AsyncSession, settings: Settings) -> list[Grant]:
        return await grants.list_grants(
            session, active=None if all_ else True, agent=agent, now=now, limit=1000
        )

    for g in _with_session(work):
        where = f"session {g.session_id}" if g.scope == "session" else "agent"
        same = ",".join(sorted(g.same_shown)) or "-"
        state = (
            f"revoked {g.revoked_at:%Y-%m-%d %H:%M} by {g.revoked_by}"
            if g.revoked_at
            else ("expired" if g.expires_at <= now else "active")
        )
        typer.echo(
            f"{g.id}  {g.agent_id}  {g.tool_name}  {where}  same={same}  by {g.granted_by}  "
            f"until {g.expires_at:%Y-%m-%d %H:%M:%S}Z  uses={g.uses}  {state}"
        )


@grants_app.command("revoke")
def grants_revoke(
    grant_id: Annotated[str, typer.Argument(help="The grant id (see `signoff grants list`).")],
    as_: Annotated[str | None, typer.Option("--as", metavar="NAME", help="Operator name (audited).")] = None,
) -> None:
    """Revoke a grant: from the next call on, on every server, it allows nothing."""
    from signoff.app.requests import grants

    async def work(session: AsyncSession, settings: Settings) -> tuple[bool, bool, str | None]:
        grant, revoked = await grants.revoke(session, grant_id, actor=_cli_actor(as_))
        return grant is not None, revoked, grant.revoked_by if grant else None

    settings = _settings()
    config = _config(settings, needed_for="`signoff grants revoke`") if settings.config is not None else None
    exists, revoked, by = _with_session(work, config=config)
    if not exists:
        raise CliError(f"no grant {grant_id} (see `signoff grants list --all`)")
    if not revoked:
        raise CliError(f"grant {grant_id} was already revoked (by {by})")
    typer.echo(f"revoked grant {grant_id}")


@tokens_app.command("list")
def tokens_list(
    all_: Annotated[bool, typer.Option("--all", help="Revoked ones too.")] = False,
    person: Annotated[str | None, typer.Option(help="Only this person's.")] = None,
) -> None:
    """One personal token per line, id first, newest first: those not revoked nor expired
    unless --all (expired ones are forgotten). Never a token's text."""
    from signoff.app import tokens

    async def work(session: AsyncSession, settings: Settings) -> list[PersonalToken]:
        return await tokens.list_tokens(session, person=person, live=not all_)

    for t in _with_session(work):
        used = f"{t.last_used_at:%Y-%m-%d %H:%M:%S}Z" if t.last_used_at else "never"
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M} by {t.revoked_by}" if t.revoked_at else "active"
        label = f"  label={t.label!r}" if t.label else ""
        typer.echo(
            f"{t.id}  {t.person}  as {t.operator}  made {t.created_at:%Y-%m-%d %H:%M:%S}Z  "
            f"until {t.expires_at:%Y-%m-%d %H:%M:%S}Z  used {used}  {state}{label}"
        )


@tokens_app.command("revoke")
def tokens_revoke(
    token_id: Annotated[str, typer.Argument(help="The token id (see `signoff tokens list`).")],
    as_: Annotated[str | None, typer.Option("--as", metavar="NAME", help="Operator name (audited).")] = None,
) -> None:
    """Revoke anyone's personal token: from then on, on every server, it decides nothing."""
    from signoff.app import tokens

    async def work(session: AsyncSession, settings: Settings) -> tuple[bool, bool, str | None]:
        token, revoked = await tokens.revoke(session, token_id, actor=_cli_actor(as_))
        return token is not None, revoked, token.revoked_by if token else None

    exists, revoked, by = _with_session(work)
    if not exists:
        raise CliError(f"no token {token_id} (see `signoff tokens list --all`)")
    if not revoked:
        raise CliError(f"token {token_id} was already revoked (by {by})")
    typer.echo(f"revoked token {token_id}")


@audit_app.command("verify")
def audit_verify(
    anchor: Annotated[
        Path | None,
        typer.Option(help="Also check against an anchor `signoff audit anchor` wrote (kept elsewhere)."),
    ] = None,
) -> None:
    """Check the audit log's hash chain; report the first broken link."""
    import json

    from signoff.app.audit import check_anchor, verify_chain

    anchored: Any = None
    if anchor is not None:
        try:
            anchored = json.loads(anchor.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(
                f"{anchor} cannot be read as JSON ({exc}); give a file `signoff audit anchor` wrote"
            ) from None

    async def work(session: AsyncSession, settings: Settings) -> tuple[int, BrokenLink | None]:
        count, broken = await verify_chain(session)
        if broken is None and anchor is not None:
            try:
                broken = await check_anchor(session, anchored)
            except ValueError as exc:
                raise CliError(f"{anchor}: {exc}") from None
        return count, broken

    count, broken = _with_session(work)
    if broken is None:
        held = f"; the anchor {anchor} holds" if anchor is not None else ""
        typer.echo(f"audit chain intact: {count} events{held}")
        return
    at = f" at event {broken.seq}" if broken.seq else ""
    raise CliError(f"audit chain broken{at}: {broken.problem} ({count} events verified before it)")


@audit_app.command("anchor")
def audit_anchor() -> None:
    """Print each chain's length and last hash (JSON) once the log verifies: keep it outside
    the database, and `signoff audit verify --anchor FILE` finds any event up to it rewritten
    or cut off, even with the hashes computed again."""
    import json

    from signoff.app.audit import anchor, verify_chain

    async def work(session: AsyncSession, settings: Settings) -> tuple[BrokenLink | None, dict[str, Any]]:
        _, broken = await verify_chain(session)
        return broken, await anchor(session)

    broken, taken = _with_session(work)
    if broken is not None:
        raise CliError(
            f"the audit log does not verify ({broken.problem}): no anchor taken; run `signoff audit verify`"
        )
    typer.echo(json.dumps(taken, indent=2))


def _moment(text: str | None, name: str) -> Any:
    """An ISO 8601 date or time given on the command line, as UTC (a date is its midnight)."""
    from datetime import datetime

    if text is None:
        return None
    from signoff.app.models import as_utc

    try:
        return as_utc(datetime.fromisoformat(text))
    except (ValueError, OverflowError):
        raise CliError(
            f"{name} {text!r} is not an ISO 8601 date or time within the years 1 to 9999 in UTC "
            "(2026-12-01, 2026-12-01T09:00Z)"
        ) from None


@audit_app.command("export")
def audit_export(
    receipts: Annotated[
        bool, typer.Option("--receipts", help="The evidence pack: signed receipts with their keys.")
    ] = False,
    since: Annotated[str | None, typer.Option(help="From this date or time (ISO 8601, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="Before this date or time (ISO 8601, UTC).")] = None,
) -> None:
    """Export, as JSON on stdout: with --receipts the receipts of the requests decided in the
    period and every key that checks them (`signoff receipts verify PACK`, `signoff-verify`)."""
    import json

    from signoff.app.evidence import evidence_pack

    if not receipts:
        raise CliError("say what to export: --receipts (the evidence pack of signed receipts)")
    start, end = _moment(since, "--since"), _moment(until, "--until")

    async def work(session: AsyncSession, settings: Settings) -> dict[str, Any]:
        return await evidence_pack(session, since=start, until=end)

    typer.echo(json.dumps(_with_session(work), indent=2, ensure_ascii=False))


@receipts_app.command("verify")
def receipts_verify(
    file: Annotated[Path, typer.Argument(help="A receipt, a request record or an evidence pack (JSON).")],
    keys: Annotated[
        Path | None,
        typer.Option(help="The published keys (JSON); default: the pack's own, else this database's."),
    ] = None,
) -> None:
    """Check every receipt in FILE offline; exit 0 only when each one is valid."""

    from signoff.app.evidence import verify_all
    from signoff.hooks.receipts import read_json

    def load(path: Path) -> Any:
        try:
            return read_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(f"{path} cannot be read as JSON ({exc}); give a receipt or a pack file") from None

    value = load(file)
    own = ""
    if keys is not None:
        published: Any = load(keys)
    elif isinstance(value, dict) and isinstance(value.get("keys"), list) and "receipts" in value:
        published = {"keys": value["keys"]}
        kids = ", ".join(str(k.get("kid")) for k in value["keys"] if isinstance(k, dict))
        # Whoever made the pack chose them: they vouch for nothing until compared.
        own = (
            f", under the pack's own keys ({kids}): check they are the server's "
            "(GET /v1/receipts/keys), or give --keys"
        )
    else:
        from signoff.app.receipt_keys import published as from_database

        async def work(session: AsyncSession, settings: Settings) -> dict[str, Any]:
            return await from_database(session)

        published = _with_session(work)
    good, problems = verify_all(value, published)
    for problem in problems:
        typer.echo(f"invalid: {problem}", err=True)
    if problems or not good:
        raise CliError(
            f"{len(problems)} of {good + len(problems)} receipts did not verify"
            if problems
            else "no receipt in the file"
        )
    typer.echo(f"{good} receipt{'s' if good != 1 else ''} valid{own}")


@receipts_app.command("keys")
def receipts_keys() -> None:
    """The public keys receipts are signed with, as JSON (what GET /v1/receipts/keys answers)."""
    import json

    from signoff.app.receipt_keys import published

    async def work(session: AsyncSession, settings: Settings) -> dict[str, Any]:
        return await published(session)

    typer.echo(json.dumps(_with_session(work), indent=2))


@receipts_app.command("rotate")
def receipts_rotate() -> None:
    """Retire the key in use (it stays published for the receipts it signed) and start a new
    one, kept in the database. With SIGNOFF_RECEIPT_KEY[_FILE] set, change that instead."""
    from signoff.app.receipt_keys import rotate

    settings = _settings()
    if settings.receipt_key is not None or settings.receipt_key_file is not None:
        raise CliError(
            "receipts are signed with the operator's key (SIGNOFF_RECEIPT_KEY[_FILE]): give a new "
            "key there and restart the servers, or unset it to rotate to a database key"
        )

    async def work(session: AsyncSession, settings: Settings) -> str:
        return (await rotate(session)).kid

    typer.echo(f"receipts are now signed with key {_with_session(work)}")


SwitchName = Annotated[str, typer.Option("--switch", help="The switch's name.")]


def _set_readonly(on: bool, switch: str, as_: str | None, reason: str | None) -> None:
    from signoff.app.switches import set_switch, unwatched

    if on and (why := unwatched(_config(_settings(), needed_for="a switch"), switch, on=on)) is not None:
        raise CliError(why, 1)

    async def work(session: AsyncSession, settings: Settings) -> None:
        await set_switch(session, switch, on=on, actor=_cli_actor(as_), reason=reason)

    _with_session(work)
    typer.echo(f"{switch} is {'on' if on else 'off'}")


@readonly_app.command("on")
def readonly_on(
    switch: SwitchName = "read_only",
    as_: Annotated[str | None, typer.Option("--as", metavar="NAME", help="Operator name.")] = None,
    reason: Annotated[str | None, typer.Option(help="Why (audited).")] = None,
) -> None:
    """Block the tools that `readonly_guard` hooks cover."""
    _set_readonly(True, switch, as_, reason)


@readonly_app.command("off")
def readonly_off(
    switch: SwitchName = "read_only",
    as_: Annotated[str | None, typer.Option("--as", metavar="NAME", help="Operator name.")] = None,
    reason: Annotated[str | None, typer.Option(help="Why (audited).")] = None,
) -> None:
    """Let them through again."""
    _set_readonly(False, switch, as_, reason)


@readonly_app.command("status")
def readonly_status(switch: SwitchName = "read_only") -> None:
    """Print whether the switch is on."""
    from signoff.app.switches import is_switch_on

    async def work(session: AsyncSession, settings: Settings) -> bool:
        return await is_switch_on(session, switch)

    typer.echo(f"{switch} is {'on' if _with_session(work) else 'off'}")


@operators_app.command("hash-password")
def operators_hash_password() -> None:
    """Read a password (typed without echo, or piped on stdin) and print its argon2 hash."""
    import sys

    from signoff.app.console.passwords import hash_password

    if sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CliError("the password is empty", 2)
    if len(password) < 12:
        typer.echo("warning: a password shorter than 12 characters is easy to guess", err=True)
    typer.echo(hash_password(password))
    typer.echo("put it in the configuration under operators.NAME.password_hash", err=True)


def main() -> None:
    """Run the CLI; any failure becomes one ``error:`` line (a traceback with ``SIGNOFF_DEBUG=1``)."""
    debug = os.environ.get("SIGNOFF_DEBUG", "").strip() not in ("", "0", "false")
    command = typer.main.get_command(app)
    _plain_help(command)
    try:
        code = command.main(prog_name="signoff", standalone_mode=False)
    except CliError as exc:
        _fail(str(exc), exc.code, debug)
    except typer.Abort:
        _fail("aborted", 1, debug)
    except typer.TyperException as exc:  # usage errors: click's own message and exit code
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        sys.exit(getattr(exc, "exit_code", 2))
    except Exception as exc:
        _fail(f"{type(exc).__name__}: {exc} (run with SIGNOFF_DEBUG=1 for the traceback)", 1, debug)
    sys.exit(code if isinstance(code, int) else 0)


class _Argument(TyperArgument):
    """An argument shown as ``REQUEST_ID`` (optional: ``[KEY_ID]``), as click writes them."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx: Any) -> str | None:
        return ""


def _plain_help(command: Any) -> None:
    """Help in the usual form: ``--limit LIMIT``, ``REQUEST_ID`` and a bare ``--force``, not
    ``<int>``, ``{request_id}`` and ``<bool>`` (nor a type column narrow enough to break a word)."""
    make_help_option = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = make_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for param in command.params:
        if isinstance(param, TyperOption):
            if param.is_flag:
                param.metavar = ""
            elif param.metavar is None:
                longest = max(param.opts, key=len).lstrip("-")
                param.metavar = longest.upper().replace("-", "_")
        elif isinstance(param, TyperArgument):
            param.__class__ = _Argument
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


def _fail(message: str, code: int, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    line = " ".join(message.split())
    sys.stderr.write(f"error: {line}\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
