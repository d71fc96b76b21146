"""audit chains

The audit log was one hash chain whose head row every write locked until it committed; it
becomes 64 chains (``signoff.app.audit``), each with a head row, so writers on several
replicas no longer queue on one row. An event records its chain (``chain``) and its place in
it (``chain_seq``); the event number ``seq`` is given by the database (a sequence on
PostgreSQL, the row id on SQLite).

The existing chain becomes chain 1 unchanged: its events' place is their number, and an
event's hash covers its place, so every hash stays valid and ``signoff audit verify`` passes
on an upgraded database. Chains 2 to 64 start empty. Stop the servers of the previous release
before upgrading: they write no ``chain`` and ``chain_seq``, and those are required, so their
writes are refused rather than forking the log.

The downgrade checks every chain first and refuses a broken log (it would otherwise be
relinked into a valid-looking one). It then links all events into one chain again in the
order they were written, numbered 1 to N, with new hashes (the previous release requires
that), and drops the columns and the heads of chains 2 to 64.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 18:00:00.000000
"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

import signoff.app.models

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHAINS = 64
GENESIS = "0" * 64
_SEQUENCE = "audit_event_seq_seq"

_HEAD = sa.table(
    "audit_head", sa.column("id", sa.Integer()), sa.column("seq", sa.Integer()), sa.column("last_hash")
)
_EVENTS = sa.table(
    "audit_event",
    sa.column("seq", sa.Integer()),
    sa.column("chain", sa.Integer()),
    sa.column("chain_seq", sa.Integer()),
    sa.column("request_id", sa.String()),
    sa.column("action", sa.String()),
    sa.column("actor_channel", sa.String()),
    sa.column("actor_id", sa.String()),
    sa.column("actor_name", sa.String()),
    sa.column("detail", sa.JSON()),
    sa.column("created_at", signoff.app.models.UTCDateTime()),
    sa.column("prev_hash", sa.String()),
    sa.column("hash", sa.String()),
)


def upgrade() -> None:
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chain", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("chain_seq", sa.Integer(), nullable=True))
    op.execute(_EVENTS.update().values(chain=1, chain_seq=_EVENTS.c.seq))
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.alter_column("chain", existing_type=sa.Integer(), nullable=False)
        batch_op.alter_column("chain_seq", existing_type=sa.Integer(), nullable=False)
        batch_op.create_index("ix_audit_event_chain_link", ["chain", "chain_seq"], unique=True)
    op.bulk_insert(_HEAD, [{"id": i, "seq": 0, "last_hash": GENESIS} for i in range(2, CHAINS + 1)])
    if op.get_bind().dialect.name == "postgresql":
        # SQLite's INTEGER PRIMARY KEY is the row id already: an insert without it gets the next.
        op.execute(f"CREATE SEQUENCE {_SEQUENCE} OWNED BY audit_event.seq")
        op.execute(
            f"SELECT setval('{_SEQUENCE}', COALESCE((SELECT max(seq) FROM audit_event), 0) + 1, false)"
        )
        op.execute(f"ALTER TABLE audit_event ALTER COLUMN seq SET DEFAULT nextval('{_SEQUENCE}')")


def _hash(seq: int, prev: str, row: Any) -> str:
    """The event's hash as ``signoff.app.audit.event_hash`` computes it (frozen here)."""
    body = json.dumps(
        [
            seq,
            prev,
            row.request_id,
            row.action,
            row.actor_channel,
            row.actor_id,
            row.actor_name,
            row.detail,
            row.created_at.isoformat(),
        ],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()


def _read(bind: sa.Connection, order: Sequence[sa.ColumnElement[Any]]) -> list[Any]:
    return list(bind.execute(sa.select(_EVENTS).order_by(*order)).all())


def downgrade() -> None:
    bind = op.get_bind()
    heads = {r.id: r for r in bind.execute(sa.select(_HEAD.c.id, _HEAD.c.seq, _HEAD.c.last_hash))}
    seen: dict[int, tuple[int, str]] = {}
    for row in _read(bind, [_EVENTS.c.chain, _EVENTS.c.chain_seq]):
        n, prev = seen.get(row.chain, (0, GENESIS))
        head = heads.get(row.chain)
        if head is None or row.chain_seq > head.seq:
            continue
        if row.chain_seq != n + 1 or row.prev_hash != prev or _hash(row.chain_seq, prev, row) != row.hash:
            raise RuntimeError(
                f"audit chain {row.chain} is broken at event {row.seq}: run `signoff audit verify`; "
                "the downgrade would relink it into a log that looks intact"
            )
        seen[row.chain] = (n + 1, row.hash)
    for chain, head in heads.items():
        if seen.get(chain, (0, GENESIS))[0] != head.seq:
            raise RuntimeError(
                f"audit chain {chain} is shorter than its head says: run `signoff audit verify`; "
                "the downgrade would relink it into a log that looks intact"
            )
    rows = _read(bind, [_EVENTS.c.seq])
    prev, moved = GENESIS, []
    for n, row in enumerate(rows, start=1):
        digest = _hash(n, prev, row)
        moved.append({"old": row.seq, "new": -n, "prev_hash": prev, "hash": digest})
        prev = digest
    if moved:
        # Two steps, so no new number meets an old one still in place.
        renumber = (
            _EVENTS.update()
            .where(_EVENTS.c.seq == sa.bindparam("old"))
            .values(seq=sa.bindparam("new"), prev_hash=sa.bindparam("prev_hash"), hash=sa.bindparam("hash"))
        )
        bind.execute(renumber, moved)
        bind.execute(_EVENTS.update().values(seq=-_EVENTS.c.seq))
    bind.execute(_HEAD.delete().where(_HEAD.c.id != 1))
    bind.execute(_HEAD.update().where(_HEAD.c.id == 1).values(seq=len(moved), last_hash=prev))
    if bind.dialect.name == "postgresql":
        op.execute("ALTER TABLE audit_event ALTER COLUMN seq DROP DEFAULT")
        op.execute(f"DROP SEQUENCE {_SEQUENCE}")
    with op.batch_alter_table("audit_event", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_event_chain_link")
        batch_op.drop_column("chain_seq")
        batch_op.drop_column("chain")
