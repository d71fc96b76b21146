"""Databases as each release left them, with rows as that release wrote them.

A *state* is the schema some commit of the main line migrated a database to, named by its
revision (``0001@3502eac``: revision 0001 as first released; ``0004@376490a``: the revision
first released as 0004, *several gates per request*, today's 0006). States made by files
that have since changed take those files from ``history/`` (each as committed, see there);
the others take today's files up to their revision.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlmodel import SQLModel

from signoff.app.db import MIGRATIONS, async_url, create_engine, revisions
from signoff.app.models import utcnow
from signoff.app.requests.canonical import call_digest

HISTORY = Path(__file__).resolve().parent / "history"
VERSIONS = MIGRATIONS / "versions"


def _today(revision: str) -> Path:
    (found,) = VERSIONS.glob(f"*-{revision}_*.py")
    return found


def _files(state: str) -> list[Path]:
    if state == "0001@3502eac":
        return [HISTORY / "0001_initial_schema_3502eac.py"]
    if state == "0004@376490a":
        return [*map(_today, ("0001", "0002", "0003")), HISTORY / "0004_several_gates_per_request_376490a.py"]
    upto = revisions()[: revisions().index(state) + 1]
    return [_today(r) for r in upto]


STATES = ["0001@3502eac", *revisions()[:3], "0004@376490a", *revisions()[3:]]
"""Every schema a database on the main line has been left at, oldest first."""


def make_database(url: str, state: str, workdir: Path) -> None:
    """Migrate the empty database ``url`` to ``state`` with that state's own files."""
    scripts = workdir / f"scripts-{state.replace('@', '-')}"
    (scripts / "versions").mkdir(parents=True)
    shutil.copy(MIGRATIONS / "env.py", scripts)
    shutil.copy(MIGRATIONS / "script.py.mako", scripts)
    for f in _files(state):
        shutil.copy(f, scripts / "versions" / f.name)
    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    cfg.attributes["database_url"] = async_url(url)
    command.upgrade(cfg, "head")


TOKEN = "sk_signoff_0ld0ld00_an-agent-key-made-by-an-old-release"
PENDING, APPROVED = "a0000000000000000000000000000001", "a0000000000000000000000000000002"
PENDING_CALL: tuple[str, dict[str, Any]] = ("wire_money", {"to": "x"})
APPROVED_CALL: tuple[str, dict[str, Any]] = ("pay_invoice", {"amount": 60000})

_TWO_PERSON = {
    "name": "two-person",
    "approvers": ["alice", "bob", "carol"],
    "quorum": 2,
    "allow_self_approval": False,
    "require_reject_reason": True,
    "timeout_seconds": 1800.0,
}
_PAYMENTS = {
    "name": "payments",
    "approvers": ["alice", "bob"],
    "quorum": 1,
    "allow_self_approval": False,
    "require_reject_reason": False,
    "timeout_seconds": 1800.0,
}


def _request(
    rid: str, call: tuple[str, dict[str, Any]], gate: dict[str, Any], key: str, now: datetime
) -> dict[str, Any]:
    tool, arguments = call
    keyed = {"key": gate["name"], "channel": "chat", **gate}
    return {
        "id": rid,
        "agent_id": "finance-bot",
        "tool_name": tool,
        "arguments": arguments,
        "idempotency_key": key,
        "call_digest": call_digest(tool, arguments),
        "request_metadata": {},
        # Before several gates (0006) a request had its one gate and no ``gates``.
        "gate": gate,
        "gates": [keyed],
        "channel": "chat",
        "status": "pending",
        "created_at": now - timedelta(minutes=2),
        "expires_at": now + timedelta(minutes=28),
    }


def rows(now: datetime) -> dict[str, list[dict[str, Any]]]:
    """What an old release held: an agent's key, a pending two-person request with Alice's vote
    and its card posted, and a request Alice approved a minute ago. Every column any release
    had is given; a state takes those its tables have."""
    approved = {
        **_request(APPROVED, APPROVED_CALL, _PAYMENTS, "approved-key", now),
        "status": "approved",
        "decided_at": now - timedelta(minutes=1),
        "decided_by_channel": "web",
        "decided_by_user_id": "alice",
        "decided_by_name": "Alice",
    }
    vote = {"gate": 0, "voter": "alice", "verdict": "approve", "user_id": "U_ALICE", "name": "Alice"}
    return {
        "agent_key": [
            {
                "id": "0ld0ld00",
                "agent_id": "finance-bot",
                "key_hash": hashlib.sha256(TOKEN.encode()).hexdigest(),
                "created_at": now - timedelta(days=1),
            }
        ],
        "confirmation_request": [_request(PENDING, PENDING_CALL, _TWO_PERSON, "pending-key", now), approved],
        "vote": [
            {**vote, "request_id": PENDING, "channel": "chat", "identity": {}, "created_at": now},
            {**vote, "request_id": APPROVED, "channel": "web", "identity": {}, "created_at": now},
        ],
        "delivery": [
            {
                "request_id": PENDING,
                "channel": "chat",
                "kind": "post",
                "status": "sent",
                "attempts": 1,
                "next_attempt_at": now,
                "message_ref": {"id": "m-1"},
                "created_at": now,
                "sent_at": now,
            }
        ],
    }


async def _write(url: str, held: Mapping[str, list[dict[str, Any]]]) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            present = await conn.run_sync(
                lambda c: {t: {col["name"] for col in sa.inspect(c).get_columns(t)} for t in held}
            )
            for name, table_rows in held.items():
                model = SQLModel.metadata.tables[name]
                # Today's column types (UTC timestamps, JSON) for the columns this state has.
                table = sa.Table(name, sa.MetaData(), *(sa.Column(c, model.c[c].type) for c in present[name]))
                unknown = {c for c in present[name] if not model.c[c].nullable and c not in table_rows[0]}
                unknown -= {c.name for c in model.primary_key.columns if isinstance(c.type, sa.Integer)}
                unknown -= {c.name for c in model.columns if c.server_default is not None}
                assert not unknown, f"give {name}.{', '.join(sorted(unknown))} in released.rows()"
                await conn.execute(
                    table.insert(),
                    [{c: v for c, v in row.items() if c in present[name]} for row in table_rows],
                )
    finally:
        await engine.dispose()


def write_rows(url: str, now: datetime | None = None) -> None:
    """Write :func:`rows` into ``url`` as its schema holds them."""
    asyncio.run(_write(url, rows(now or utcnow())))
