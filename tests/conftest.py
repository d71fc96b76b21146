"""Shared fixtures: real SQLite and PostgreSQL databases built by the migrations, and a
real HTTP server (uvicorn on a loopback port) around the app. Tests run on SQLite; those
marked ``postgres`` on PostgreSQL as well (tests/README.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import socket
import ssl
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx._transports.default
import pytest
import sqlalchemy as sa
import time_machine
import uvicorn
from sqlalchemy.engine import make_url

from signoff.app.config import SignoffConfig, parse_config
from signoff.app.db import migrate
from signoff.app.main import create_app
from signoff.app.runtime import Runtime
from signoff.app.settings import Settings
from signoff.channels.fake import FakeChannel

PG_URL = os.environ.get("SIGNOFF_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/signoff_test")
ADMIN_TOKEN = "test-admin-token-0123456789"
TABLES = [
    "approval_grant",
    "vote",
    "delivery",
    "audit_event",
    "agent_key",
    "confirmation_request",
    "switch",
    "rate_bucket",
    "console_session_revocation",
    "personal_token",
    "replica",
    "receipt_key",
]

DEFAULT_CONFIG: dict[str, Any] = {
    "channels": {"chat": {"type": "fake"}},
    "people": {
        "alice": {"name": "Alice", "web": "alice", "fake": "U_ALICE"},
        "bob": {"name": "Bob", "web": "bob", "fake": "U_BOB"},
        "carol": {"name": "Carol", "web": "carol", "fake": "U_CAROL"},
    },
    "agents": {
        "finance-bot": {
            "hooks": [
                {
                    "type": "confirmation_gate",
                    "name": "payments",
                    "tools": ["pay_*"],
                    "when": "has(args.amount) && args.amount >= 50000",
                    "channel": "chat",
                    "approvers": ["alice", "bob"],
                    "quorum": 1,
                    "timeout": "30m",
                },
                {
                    "type": "confirmation_gate",
                    "name": "two-person",
                    "tools": ["wire_*"],
                    "channel": "chat",
                    "approvers": ["alice", "bob", "carol"],
                    "quorum": 2,
                    "timeout": "30m",
                    "require_reject_reason": True,
                },
                {
                    "type": "confirmation_gate",
                    "name": "short",
                    "tools": ["quick_*"],
                    "channel": "chat",
                    "timeout": "1s",
                },
            ]
        },
        "other-bot": {"hooks": []},
    },
}


def _ensure_pg_database(url: str) -> None:
    import asyncpg

    u = make_url(url)

    async def create() -> None:
        conn = await asyncpg.connect(
            user=u.username or "postgres", host=u.host, port=u.port or 5432, database="postgres"
        )
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", u.database)
            if not exists:
                await conn.execute(f'CREATE DATABASE "{u.database}"')
        finally:
            await conn.close()

    asyncio.run(create())


def _drop_pg_database(url: str) -> None:
    import asyncpg

    u = make_url(url)

    async def drop() -> None:
        conn = await asyncpg.connect(
            user=u.username or "postgres", host=u.host, port=u.port or 5432, database="postgres"
        )
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{u.database}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def clock() -> Iterator[time_machine.Traveller]:
    """This process's clock, moved on with ``clock.shift(seconds)`` instead of waiting for time
    to pass (``time-machine``: the server's times, sessions, tokens and deadlines read it; the
    event loop's monotonic clock is left alone). Only for a server in the test's own process."""
    with time_machine.travel(datetime.now(UTC), tick=True) as traveller:
        yield traveller


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'signoff.db'}"
    migrate(url)
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of this test run's own, so parallel runs never truncate each other's rows."""
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_{os.getpid()}").render_as_string(hide_password=False)
    _ensure_pg_database(url)
    migrate(url)
    yield url
    _drop_pg_database(url)


SLOWEST_FIRST = [
    "tests/test_distributions.py",
    "tests/e2e/test_claude_code_cli.py",
    "tests/chaos/test_chaos.py",
    "tests/fuzz/test_schemathesis.py",
    "tests/console/test_console_browser.py",
    "tests/hooks/test_mcp_proxy.py",
    "tests/test_docker.py",
    "tests/hooks/test_deadlines.py",
    "tests/console/test_oidc.py",
    "tests/app/test_cli.py",
    "tests/app/test_reload.py",
    "tests/app/test_replicas.py",
    "tests/app/test_many_waiters.py",
]
"""The files that take longest, slowest first: ``make test`` hands out whole files to its
workers in collection order (``--dist loadfile --no-loadscope-reorder``), and a long file
handed out last would leave the other worker idle until it ends."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = Path(__file__).resolve().parent.parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``postgres`` runs on both databases; every other test on SQLite alone
    (tests/README.md says which tests are marked)."""
    if metafunc.definition.get_closest_marker("postgres"):
        for name in ("db_url", "empty_url"):
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, ["sqlite", "postgres"], indirect=True)


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> str:
    """A clean, migrated database: SQLite, or for a test marked ``postgres`` once SQLite and
    once PostgreSQL."""
    url: str = request.getfixturevalue(f"{getattr(request, 'param', 'sqlite')}_url")
    _truncate(url)
    return url


@contextlib.contextmanager
def _empty_database(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'signoff.db'}"
        return
    u = make_url(PG_URL)
    url = u.set(database=f"{u.database}_m_{uuid.uuid4().hex[:12]}").render_as_string(hide_password=False)
    _ensure_pg_database(url)
    try:
        yield url
    finally:
        _drop_pg_database(url)


@pytest.fixture
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of this test's own (no revision yet): SQLite, or for a test marked
    ``postgres`` once SQLite and once PostgreSQL."""
    with _empty_database(getattr(request, "param", "sqlite"), tmp_path) as url:
        yield url


@pytest.fixture
def postgres_empty_url(tmp_path: Path) -> Iterator[str]:
    """An empty PostgreSQL database of this test's own."""
    with _empty_database("postgres", tmp_path) as url:
        yield url


def _truncate(url: str) -> None:
    from signoff.app.db import create_engine

    async def run() -> None:
        engine = create_engine(url)
        async with engine.begin() as conn:
            for t in TABLES:
                await conn.execute(sa.text(f"DELETE FROM {t}"))
            await conn.execute(sa.text("UPDATE audit_head SET seq = 0, last_hash = :h"), {"h": "0" * 64})
            if conn.dialect.name == "postgresql":  # event numbers from 1 again, as on SQLite
                await conn.execute(sa.text("ALTER SEQUENCE audit_event_seq_seq RESTART"))
        await engine.dispose()

    try:
        asyncio.run(run())
    except sa.exc.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        raise RuntimeError(f"{url} stayed locked: {_holders(url)}") from exc


def _holders(url: str) -> str:
    """Which processes have SQLite database ``url`` (or its WAL) open, and this process's
    threads: what to look at when a test leaves a writer behind."""
    import sys
    import threading
    import traceback

    path = Path(str(make_url(url).database)).resolve()
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if Path(os.readlink(fd)).name.startswith(path.name):
                pid = fd.parent.parent.name
                cmdline = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"pid {pid} ({'this worker' if int(pid) == os.getpid() else cmdline[:200]})")
    frames = sys._current_frames()
    threads = [
        f"thread {t.name}: {''.join(traceback.format_stack(frames[t.ident], limit=4)).strip()}"
        for t in threading.enumerate()
        if t.ident in frames and t is not threading.current_thread()
    ]
    return "; ".join(sorted(set(found))) + " | " + " || ".join(threads)


@functools.cache
def _default_tls(trust_env: bool, cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return _create_ssl_context(True, None, trust_env)


_create_ssl_context = httpx._transports.default.create_ssl_context


def _shared_tls(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
    if verify is True and cert is None:
        env = os.environ if trust_env else {}
        return _default_tls(trust_env, env.get("SSL_CERT_FILE"), env.get("SSL_CERT_DIR"))
    return _create_ssl_context(verify, cert, trust_env)


@pytest.fixture(scope="session", autouse=True)
def _one_default_tls_context() -> Iterator[None]:
    """Every httpx client made with the default ``verify=True`` shares one TLS context, as
    clients in one process may: building one reads certifi's bundle (0.3 s on a busy machine),
    and the suite makes thousands of clients. Verification is unchanged."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(httpx._transports.default, "create_ssl_context", _shared_tls)
        yield


@pytest.fixture
def config() -> SignoffConfig:
    return parse_config(DEFAULT_CONFIG, source="test.yaml")


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, admin_token=ADMIN_TOKEN)  # type: ignore[arg-type]


@pytest.fixture
def fake_channel() -> FakeChannel:
    return FakeChannel("chat")


@pytest.fixture
async def runtime(
    settings: Settings, config: SignoffConfig, fake_channel: FakeChannel
) -> AsyncIterator[Runtime]:
    rt = Runtime.create(settings, config, channels={"chat": fake_channel})
    yield rt
    await rt.aclose()


def _ephemeral_ports() -> range:
    """The ports the kernel hands out to outgoing connections (Linux's default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


_OWN_PORTS = range(20000, 32768)
"""Where :func:`free_port` looks first: below the usual ephemeral range and above most
services' ports."""
_PORT_PICKS = random.SystemRandom()
"""Not ``random`` itself: each test seeds it alike (pytest-randomly), and two workers would
pick the same ports in the same order."""


def free_port() -> int:
    """A loopback port free now, for a server a test starts. Not one of the kernel's ephemeral
    ports where it can help it: every outgoing connection (any test's, on any worker) takes one
    of those, and one taken between this check and the server's bind made the server fail to
    start with "Address already in use"."""
    ephemeral = _ephemeral_ports()
    candidates = [p for p in _PORT_PICKS.sample(_OWN_PORTS, 50) if p not in ephemeral]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Uvicorn(uvicorn.Server):
    """uvicorn that stops at once: no 0.1 s tick to notice ``should_exit``, no grace period for
    connections or requests still open (a test closes its clients first, and what a stop does
    to requests in flight is tested on ``signoff serve`` processes): requests still running are
    cancelled, and waited for while they unwind. The app's lifespan still shuts down."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.stop = asyncio.Event()

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the default headers
        await self.stop.wait()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for listener in self.servers:
            listener.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        tasks = list(self.server_state.tasks)
        for task in tasks:
            task.cancel()
        if tasks:  # a request cancelled gives its database connection back as it unwinds
            await asyncio.wait(tasks, timeout=10)
        await self.lifespan.shutdown()


class Server:
    """The app under uvicorn on a loopback port, in the test's event loop."""

    def __init__(self, runtime: Runtime, *, background: bool = False) -> None:
        self.runtime = runtime
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app = create_app(runtime, background=background)
        self._server = _Uvicorn(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Server:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.01)
            if self._task.done():
                self._task.result()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.stop.set()
        if self._task is not None:
            await self._task


class InProcess:
    """The app in the test's own process and event loop, reached through
    ``httpx.ASGITransport``: no socket, no uvicorn. Its lifespan runs as under a server (on
    entering and leaving), so what it sets up (``app.state.runtime``, the receipts' key, the
    drain) is there. For tests of what the app answers, not of the process or the socket
    (tests/README.md, "In process or a real server")."""

    url = "http://signoff.test"

    def __init__(self, runtime: Runtime, *, background: bool = False) -> None:
        self.runtime = runtime
        self.app = create_app(runtime, background=background)
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None

    async def __aenter__(self) -> InProcess:
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._lifespan is not None:
            await self._lifespan.__aexit__(*exc)

    def client(self, **options: Any) -> httpx.AsyncClient:
        """A client of the app, as ``httpx.AsyncClient(base_url=server.url)`` is of a server."""
        options.setdefault("timeout", 30)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=self.url, **options)


@contextlib.asynccontextmanager
async def in_process_http(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app around ``runtime``, in process (:class:`InProcess`)."""
    async with InProcess(runtime) as app, app.client() as client:
        yield client


@pytest.fixture
async def server(runtime: Runtime) -> AsyncIterator[Server]:
    async with Server(runtime) as s:
        yield s


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def agent_key(runtime: Runtime) -> str:
    from signoff.app.audit import Actor
    from signoff.app.db import transaction
    from signoff.app.keys import create_key

    async with transaction(runtime.sessions) as session:
        _, token = await create_key(session, "finance-bot", actor=Actor("test"))
    return token


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_env_leaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("SIGNOFF_CONFIG", "SIGNOFF_DATABASE_URL", "SIGNOFF_ADMIN_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return
