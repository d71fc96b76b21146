"""Operator switches: named on/off flags (``read_only`` for ``readonly_guard``), set by
operators through the operator API, the console and the CLI, read by the hooks."""

from __future__ import annotations

from sqlmodel import col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import audit
from signoff.app.audit import Action, Actor
from signoff.app.models import Switch, utcnow

__all__ = ["is_switch_on", "list_switches", "set_switch"]


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
