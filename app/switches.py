"""Operator switches: named on/off flags (``read_only`` for ``readonly_guard``), set by
operators through the operator API, the console and the CLI, read by the hooks."""

from __future__ import annotations

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.builtin_hooks.readonly_guard import ReadOnlyGuard
from signoff.app.config import SignoffConfig
from signoff.app.models import Switch, utcnow

__all__ = ["guarded_switches", "is_switch_on", "list_switches", "set_switch", "unwatched"]


def guarded_switches(config: SignoffConfig) -> dict[str, list[str]]:
    """Each switch a configured ``readonly_guard`` watches (by name), with the agents it guards."""
    watched: dict[str, list[str]] = {}
    for agent, cfg in sorted(config.agents.items()):
        for switch in dict.fromkeys(h.switch for h in cfg.hooks if isinstance(h, ReadOnlyGuard)):
            watched.setdefault(switch, []).append(agent)
    return dict(sorted(watched.items()))


def unwatched(config: SignoffConfig, name: str, *, on: bool) -> str | None:
    """Why switch ``name`` cannot be turned on: no ``readonly_guard`` watches it (an operator who
    turned on ``READ_ONLY`` would believe the agents stopped while ``read_only`` stays off).
    None when one does, and for turning a switch off (one left on by a guard a reload removed
    can still be cleared)."""
    watched = guarded_switches(config)
    if name in watched or not on:
        return None
    known = ", ".join(repr(n) for n in watched) or "none"
    return (
        f"no readonly_guard watches a switch {name!r} (watched: {known}): check the spelling, or "
        "add a readonly_guard for it to an agent's hooks first"
    )


async def is_switch_on(session: AsyncSession, name: str) -> bool:
    on = (await session.exec(select(Switch.on).where(col(Switch.name) == name))).first()
    return bool(on)


async def list_switches(session: AsyncSession) -> list[Switch]:
    """Every switch ever set, by name."""
    return list((await session.exec(select(Switch).order_by(col(Switch.name)))).all())


async def set_switch(
    session: AsyncSession, name: str, *, on: bool, actor: Actor, reason: str | None = None
) -> Switch:
    """Turn a switch on or off (audited); creates it on first use."""
    row = (await session.exec(select(Switch).where(col(Switch.name) == name).with_for_update())).first()
    if row is None:
        row = Switch(name=name)
        session.add(row)
    previous = row.on
    row.on, row.updated_at, row.updated_by, row.reason = on, utcnow(), actor.name or actor.id, reason
    await audit.append(
        session,
        Action.SWITCH_CHANGED,
        actor=actor,
        detail={"switch": name, "on": on, "was": previous, "reason": reason},
    )
    return row
