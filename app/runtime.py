"""Everything one server process holds: settings, config, database, channels, hooks."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlmodel import Session, col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app.channel_types import build_channel
from signoff.app.clicks import ClickService
from signoff.app.config import SignoffConfig, load_config
from signoff.app.confirmations import DECIDED_KEY, OUTBOX_KEY
from signoff.app.db import YIELD_AFTER_COMMIT, create_engine, is_sqlite
from signoff.app.intake import Intake
from signoff.app.models import ConfirmationRequest
from signoff.app.settings import Settings
from signoff.app.waiters import Hub
from signoff.channels import Channel
from signoff.hooks import HookRegistry, PostToolUseHook, PreToolUseHook, SessionStartHook

__all__ = ["Runtime"]

log = logging.getLogger("signoff")


def _session_class(hub: Hub) -> type[Session]:
    """A session class that wakes waiters and the dispatcher once its transaction commits."""

    class NotifyingSession(Session):
        pass

    @event.listens_for(NotifyingSession, "after_commit")
    def _after_commit(session: Session) -> None:
        decided = session.info.pop(DECIDED_KEY, None)
        if decided:
            hub.notify(decided)
            session.info[YIELD_AFTER_COMMIT] = True
        if session.info.pop(OUTBOX_KEY, False):
            hub.outbox.set()

    @event.listens_for(NotifyingSession, "after_rollback")
    def _after_rollback(session: Session) -> None:
        session.info.pop(DECIDED_KEY, None)
        session.info.pop(OUTBOX_KEY, None)

    return NotifyingSession


@dataclass
class Runtime:
    settings: Settings
    config: SignoffConfig
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    hub: Hub
    reads: async_sessionmaker[AsyncSession]
    """Sessions for reading only (on SQLite they do not queue behind writers)."""
    channels: dict[str, Channel] = field(default_factory=dict)
    registries: dict[str, HookRegistry] = field(default_factory=dict)
    intake: Intake = field(init=False)
    """Writes new requests, several calls per transaction when they arrive together."""

    def __post_init__(self) -> None:
        self.intake = Intake(self.sessions)

    @classmethod
    def create(
        cls,
        settings: Settings,
        config: SignoffConfig | None = None,
        *,
        channels: dict[str, Channel] | None = None,
    ) -> Runtime:
        config = config if config is not None else load_config(settings.config)
        for warning in config.warnings():
            log.warning("%s", warning)
        engine = create_engine(settings.database_url)
        hub = Hub()
        sessions = async_sessionmaker(
            engine, class_=AsyncSession, expire_on_commit=False, sync_session_class=_session_class(hub)
        )
        # PostgreSQL: reads in autocommit, as READ COMMITTED gives each statement its own
        # snapshot anyway, without the BEGIN and ROLLBACK round trips.
        reads = async_sessionmaker(
            engine.execution_options(isolation_level="AUTOCOMMIT"),
            class_=AsyncSession,
            expire_on_commit=False,
        )
        if is_sqlite(settings.database_url):
            reads = async_sessionmaker(
                create_engine(settings.database_url, readonly=True),
                class_=AsyncSession,
                expire_on_commit=False,
            )
        built = {name: build_channel(name, cfg) for name, cfg in config.channels.items()}
        built.update(channels or {})
        registries = {
            agent: HookRegistry(
                pre_tool_use=[h for h in cfg.hooks if isinstance(h, PreToolUseHook)],
                post_tool_use=[h for h in cfg.hooks if isinstance(h, PostToolUseHook)],
                session_start=[h for h in cfg.hooks if isinstance(h, SessionStartHook)],
            )
            for agent, cfg in config.agents.items()
        }
        return cls(settings, config, engine, sessions, hub, reads, built, registries)

    @property
    def clicks(self) -> ClickService:
        return ClickService(self.sessions, self.config, reads=self.reads, channels=self.channels)

    async def recently_decided(self, since: Any) -> list[tuple[str, Any]]:
        async with self.reads() as session:
            rows = await session.exec(
                select(ConfirmationRequest.id, ConfirmationRequest.decided_at).where(
                    col(ConfirmationRequest.decided_at) >= since
                )
            )
            return [(r[0], r[1]) for r in rows.all()]

    async def aclose(self, extra: Iterable[Channel] = ()) -> None:
        for ch in [*self.channels.values(), *extra]:
            try:
                await ch.aclose()
            except Exception:
                log.exception("closing channel %s", ch.name)
        await self.engine.dispose()
        if self.reads is not self.sessions:
            read_engine = self.reads.kw["bind"]
            await read_engine.dispose()
