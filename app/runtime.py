"""Everything one server process holds: settings, config, database, channels, hooks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit, metrics, replicas, webhooks
from signoff.app.channel_types import build_channel, needs_links
from signoff.app.config import ConfigError, SignoffConfig, load_config
from signoff.app.db import Wakeups, create_engine, is_sqlite, log_failure, sessionmaker, transaction
from signoff.app.keys import AgentKeys
from signoff.app.models import ConfirmationRequest, Status, utcnow
from signoff.app.queries import request_outs_by_id
from signoff.app.readiness import Readiness
from signoff.app.refusals import Refusals
from signoff.app.requests import activity
from signoff.app.requests.clicks import ClickService
from signoff.app.requests.intake import Intake
from signoff.app.schemas import RequestOut
from signoff.app.settings import Settings
from signoff.app.waiters import Coalesced, Hub
from signoff.channels import Card, Channel, Click, ClickOutcome, InteractiveChannel
from signoff.channels.email import LinkSigner
from signoff.hooks import HookRegistry, PostToolUseHook, PreToolUseHook, SessionStartHook

__all__ = ["Reload", "Runtime", "link_signer", "missing_link_settings"]

log = logging.getLogger("signoff")


_R = ConfirmationRequest
_DECIDED_SINCE = sa.select(
    col(_R.id),
    col(_R.status),
    col(_R.created_at),
    col(_R.decided_at),
    col(_R.agent_id),
    col(_R.tool_name),
    col(_R.gate),
    col(_R.gates),
    col(_R.decided_by_name),
    col(_R.decided_by_user_id),
).where(col(_R.decided_at) >= sa.bindparam("since"))


def _registries(config: SignoffConfig) -> dict[str, HookRegistry]:
    return {
        agent: HookRegistry(
            pre_tool_use=[h for h in cfg.hooks if isinstance(h, PreToolUseHook)],
            post_tool_use=[h for h in cfg.hooks if isinstance(h, PostToolUseHook)],
            session_start=[h for h in cfg.hooks if isinstance(h, SessionStartHook)],
        )
        for agent, cfg in config.agents.items()
    }


def link_signer(settings: Settings) -> LinkSigner | None:
    """The signer of this server's links; None without ``SIGNOFF_PUBLIC_URL`` and
    ``SIGNOFF_SESSION_SECRET``."""
    key = settings.link_key()
    if key is None or settings.public_url is None:
        return None
    return LinkSigner(key, settings.public_url)


def missing_link_settings(settings: Settings, config: SignoffConfig) -> str | None:
    """Why ``config``'s channels cannot send links under ``settings`` (None: they can, or none sends)."""
    linked = [name for name, channel in config.channels.items() if needs_links(channel)]
    if not linked:
        return None
    missing = [
        name
        for name, value in (
            ("SIGNOFF_PUBLIC_URL", settings.public_url),
            ("SIGNOFF_SESSION_SECRET", settings.session_secret),
        )
        if value is None
    ]
    if not missing:
        return None
    return (
        f"{config.source}: channels.{linked[0]}: {config.channels[linked[0]].type} links need "
        f"{' and '.join(missing)}: "
        "SIGNOFF_PUBLIC_URL is the address approvers open (https://signoff.example.com), "
        "SIGNOFF_SESSION_SECRET a long random value that signs the links "
        "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
    )


@dataclass(frozen=True)
class Reload:
    """What a reload did: the version now loaded, or the problems that left everything as it was."""

    version: str
    loaded_at: datetime
    problems: tuple[str, ...] = ()
    rebuilt: tuple[str, ...] = ()
    """Channels whose settings changed (or that are new), built afresh."""
    closed: tuple[str, ...] = ()
    """Channels no longer configured (or replaced), closed."""

    @property
    def ok(self) -> bool:
        return not self.problems


class LiveClicks:
    """The click handler given to channels' own connections: always the current configuration's."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def click(self, channel: str, click: Click) -> ClickOutcome:
        return await self._runtime.clicks.click(channel, click)

    async def enrich_identity(
        self, channel: str, user_id: str, *, name: str | None, email: str | None
    ) -> None:
        await self._runtime.clicks.enrich_identity(channel, user_id, name=name, email=email)

    async def current_card(self, channel: str, request_id: str) -> Card | None:
        return await self._runtime.clicks.current_card(channel, request_id)


@dataclass
class Runtime:
    settings: Settings
    config: SignoffConfig
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    """Units of work (:func:`signoff.app.db.transaction`); their commits wake ``hub`` and
    ``outbox_wake``."""
    hub: Hub[RequestOut]
    """The agents waiting on requests."""
    outbox_wake: asyncio.Event
    """Set once deliveries are committed, to wake the outbox dispatcher."""
    reads: async_sessionmaker[AsyncSession]
    """Sessions for reading only (on SQLite they do not queue behind writers)."""
    channels: dict[str, Channel] = field(default_factory=dict)
    registries: dict[str, HookRegistry] = field(default_factory=dict)
    intake: Intake = field(init=False)
    """Writes new requests, several calls per transaction when they arrive together."""
    clicks: ClickService = field(init=False)
    """Applies clicks from every channel under the current configuration."""
    current: Coalesced[RequestOut] = field(init=False)
    """Requests as the API shows them, read for many waiters at once in one query."""
    keys: AgentKeys = field(init=False)
    """The agent keys this process has found live, remembered for a moment."""
    refusals: Refusals = field(init=False)
    """This process's refused callbacks: counted, and sampled into the audit log."""
    readiness: Readiness = field(init=False)
    """Whether the database lets this server serve, and why not (``/readyz``, 503s)."""
    version: str = ""
    """The loaded configuration's :func:`config_version`."""
    loaded_at: datetime = field(default_factory=utcnow)
    reload_failures: int = 0
    decisions_since: datetime | None = None
    """Where :meth:`observe_decisions` reads from next (None: the start of this process)."""
    started_channels: bool = False
    """Whether channels' own connections (Socket Mode, long connection) are running."""
    replica: str = field(default_factory=replicas.replica_id)
    links: LinkSigner | None = None
    """Signs and checks the email channels' links (None without SIGNOFF_PUBLIC_URL and
    SIGNOFF_SESSION_SECRET; a configuration with an email channel then does not load)."""

    def __post_init__(self) -> None:
        self.intake = Intake(self.sessions)
        self.clicks = self._click_service()
        self.keys = AgentKeys(self.reads)
        self.current = Coalesced(self._request_outs)
        self.refusals = Refusals(self.sessions)
        self.readiness = Readiness(self.engine, self.reads.kw["bind"], self.settings.database_url)
        self.version = self.version or self.config.version
        metrics.CONFIG_INFO.clear()
        metrics.CONFIG_INFO.labels(self.version).set(1)

    @classmethod
    def create(
        cls,
        settings: Settings,
        config: SignoffConfig | None = None,
        *,
        channels: dict[str, Channel] | None = None,
    ) -> Runtime:
        config = config if config is not None else load_config(settings.config)
        problem = missing_link_settings(settings, config)
        if problem is not None:
            raise ConfigError([problem])
        for warning in config.warnings():
            log.warning("%s", warning)
        engine = create_engine(
            settings.database_url, sync=settings.sqlite_sync, pooling=settings.database_pooling
        )
        hub: Hub[RequestOut] = Hub()
        outbox_wake = asyncio.Event()
        runtime: Runtime | None = None

        async def answers(session: AsyncSession, decided: Sequence[str]) -> dict[str, RequestOut]:
            # What the agents waiting here on these requests are answered, as committed.
            waited = hub.waited_on(decided)
            return await request_outs_by_id(session, waited) if waited else {}

        def subscribers(event: str) -> tuple[str, ...]:
            # The configuration in force when the event is owed (reloads swap it).
            return (runtime.config if runtime is not None else config).subscribers(event)

        sessions = sessionmaker(
            engine,
            wakeups=Wakeups(decided=hub.notify, queued=outbox_wake.set, answers=answers),
            webhooks=subscribers,
            events=webhooks.owe,
        )
        # PostgreSQL: reads in autocommit, as READ COMMITTED gives each statement its own
        # snapshot anyway, without the BEGIN and ROLLBACK round trips; behind a transaction
        # pooler in transactions, the one unit its server connection is kept for.
        if is_sqlite(settings.database_url):
            read_engine = create_engine(settings.database_url, readonly=True)
        elif settings.database_pooling == "transaction":
            read_engine = engine
        else:
            read_engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        reads = sessionmaker(read_engine)
        links = link_signer(settings)
        built = {name: build_channel(name, cfg, links=links) for name, cfg in config.channels.items()}
        built.update(channels or {})
        runtime = cls(
            settings,
            config,
            engine,
            sessions,
            hub,
            outbox_wake,
            reads,
            built,
            _registries(config),
            links=links,
        )
        return runtime

    async def report_replica(self) -> None:
        """Record the configuration this process runs, for the console's replica view."""
        try:
            async with transaction(self.sessions) as session:
                await replicas.report(
                    session, self.replica, version=self.version, loaded_at=self.loaded_at, now=utcnow()
                )
        except Exception:
            log_failure(log, "could not record this replica's configuration version")

    async def start_channels(self) -> None:
        """Start the channels' own connections; clicks on them reach the current configuration."""
        for ch in self.channels.values():
            if isinstance(ch, InteractiveChannel):
                await ch.start(LiveClicks(self))
        self.started_channels = True

    async def reload(self, path: Path | None = None) -> Reload:
        """Load ``path`` (default ``SIGNOFF_CONFIG``) and put it in force, or change nothing.

        The whole file is validated first: a file with problems leaves the running
        configuration, its channels and their connections as they were. A good one takes
        effect for the next call; requests already pending keep the gate snapshot they were
        made with, and agents waiting on them are not disturbed. Channels whose settings did
        not change keep their objects (and connections); changed and new ones are built
        afresh and started, removed and replaced ones are closed.
        """
        source = path if path is not None else self.settings.config
        try:
            config = load_config(source)
            problem = missing_link_settings(self.settings, config)
            if problem is not None:
                raise ConfigError([problem])
        except ConfigError as exc:
            self.reload_failures += 1
            metrics.CONFIG_RELOAD_FAILURES.inc()
            log.error("configuration reload refused, nothing changed: %s", "; ".join(exc.problems))
            return Reload(self.version, self.loaded_at, tuple(exc.problems))
        # Channels given to the runtime by the embedding code (not built from the file) stay.
        kept = {name: ch for name, ch in self.channels.items() if name not in self.config.channels}
        fresh: dict[str, Channel] = {}
        for name, cfg in config.channels.items():
            old = self.channels.get(name)
            if old is not None and self.config.channels.get(name) == cfg:
                kept[name] = old
            elif name not in kept:
                fresh[name] = build_channel(name, cfg, links=self.links)
        retired = [ch for name, ch in self.channels.items() if name not in kept]
        if self.started_channels:
            for ch in fresh.values():
                if isinstance(ch, InteractiveChannel):
                    await ch.start(LiveClicks(self))
        # One synchronous swap: no await between these lines, so every call sees one policy.
        self.config = config
        self.registries = _registries(config)
        self.clicks = self._click_service()
        self.channels.clear()
        self.channels.update(kept | fresh)
        previous = self.version
        self.version, self.loaded_at = config.version, utcnow()
        metrics.CONFIG_INFO.clear()
        metrics.CONFIG_INFO.labels(self.version).set(1)
        for ch in retired:
            try:
                await ch.aclose()
            except Exception:
                log.exception("closing channel %s", ch.name)
        async with transaction(self.sessions) as session:
            await audit.append(
                session,
                audit.Action.CONFIG_RELOADED,
                actor=audit.SYSTEM,
                detail={
                    "version": self.version,
                    "previous": previous,
                    "source": str(source),
                    "rebuilt": sorted(fresh),
                    "closed": sorted(ch.name for ch in retired),
                },
            )
        await self.report_replica()
        log.info(
            "configuration %s loaded from %s (channels rebuilt: %s)",
            self.version,
            source,
            ", ".join(sorted(fresh)) or "none",
        )
        return Reload(
            self.version, self.loaded_at, (), tuple(sorted(fresh)), tuple(sorted(ch.name for ch in retired))
        )

    def _click_service(self) -> ClickService:
        return ClickService(
            self.sessions,
            self.config,
            reads=self.reads,
            channels=self.channels,
            public_url=self.settings.public_url,
        )

    async def _request_outs(self, ids: list[str]) -> dict[str, RequestOut]:
        async with self.reads() as session:
            return await request_outs_by_id(session, ids)

    async def recently_decided(self, since: Any) -> list[tuple[str, Any]]:
        async with self.reads() as session:
            rows = await session.exec(
                select(ConfirmationRequest.id, ConfirmationRequest.decided_at).where(
                    col(ConfirmationRequest.decided_at) >= since
                )
            )
            return [(r[0], r[1]) for r in rows.all()]

    async def observe_decisions(self, overlap: float = 5.0, settle: float = 1.0) -> None:
        """Count and log the decisions other processes committed (the command line's, other
        replicas', their expiries): those committed since the last run, less ``overlap`` for
        commit lag; this process's own were counted at their commit and are not counted twice.

        A decision younger than ``settle`` seconds is left to the next run: it may be this
        process's own, committed but not yet counted (its commit is visible here before the
        task that made it has run its after-commit work)."""
        started = utcnow()
        settled = started - timedelta(seconds=settle)
        since = (self.decisions_since or self.loaded_at) - timedelta(seconds=overlap)
        try:
            async with self.reads() as session:
                # (sqlmodel's exec is typed for selects of up to four columns)
                rows = (await session.exec(_DECIDED_SINCE, params={"since": since})).all()  # type: ignore[call-overload]
        except Exception:
            log_failure(log, "could not read the decisions made elsewhere")
            return
        self.decisions_since = started
        for rid, status, created, decided, agent, tool, gate, gates, name, user in rows:
            if (
                decided is None
                or decided > settled
                or not metrics.observe_decision(rid, str(status), created, decided)
            ):
                continue
            activity.log.info(
                "%s",
                activity.line(
                    "request expired" if status == Status.EXPIRED else "request decided",
                    rid,
                    {
                        "agent": agent,
                        "tool": tool,
                        "gate": activity.gate_names(gate, gates),
                        "who": name or user,
                        "verdict": str(status),
                        "by": "another process",
                    },
                ),
            )

    async def aclose(self, extra: Iterable[Channel] = ()) -> None:
        await self.current.aclose()  # a shared read still running gives its connection back
        for ch in [*self.channels.values(), *extra]:
            try:
                await ch.aclose()
            except Exception:
                log.exception("closing channel %s", ch.name)
        await self.engine.dispose()
        if self.reads is not self.sessions:
            read_engine = self.reads.kw["bind"]
            await read_engine.dispose()
