"""each gate snapshot once

A request stored its first gate twice (``gate``, with the configuration's version, and again
as the first entry of ``gates``). From this revision ``gates`` holds every gate once and the
version has a column of its own (``config_version``); ``gate`` is no longer written. Existing
rows are moved over: their version into ``config_version`` and, where ``gates`` holds the
first gate again, ``gate`` emptied. A request made before several gates could ask (an empty
``gates``) keeps its one gate in ``gate``, as it reads today. Rows written meanwhile by a
server of the previous release (``gate`` and ``gates`` both) still read as they did.

The downgrade writes ``gate`` back from the first of ``gates`` and the version, so nothing is
lost when ``config_version`` is dropped.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 15:00:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REQUESTS = sa.table(
    "confirmation_request",
    sa.column("id", sa.String()),
    sa.column("gate", sa.JSON(none_as_null=True)),
    sa.column("gates", sa.JSON()),
    sa.column("config_version", sa.String()),
)
_BY_ID = _REQUESTS.c.id == sa.bindparam("rid")


def _moved(gate: dict[str, Any], gates: list[dict[str, Any]] | None) -> dict[str, Any]:
    version = gate.get("config_version")
    # A request made before several gates could ask keeps its one gate where it is.
    known = version if isinstance(version, str) else None
    return {"gate": gate if not gates else None, "config_version": known}


def upgrade() -> None:
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("config_version", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True)
        )
        batch_op.alter_column("gate", existing_type=sa.JSON(), nullable=True)
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_REQUESTS.c.id, _REQUESTS.c.gate, _REQUESTS.c.gates).where(
            _REQUESTS.c.gate.is_not(None)
        )
    ).all()
    if rows:
        bind.execute(
            _REQUESTS.update().where(_BY_ID),
            [{"rid": rid, **_moved(gate or {}, gates)} for rid, gate, gates in rows],
        )


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_REQUESTS.c.id, _REQUESTS.c.gates, _REQUESTS.c.config_version).where(
            _REQUESTS.c.gate.is_(None)
        )
    ).all()
    if rows:
        bind.execute(
            _REQUESTS.update().where(_BY_ID),
            [
                {"rid": rid, "gate": {**(gates[0] if gates else {}), "config_version": version}}
                for rid, gates, version in rows
            ],
        )
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.alter_column("gate", existing_type=sa.JSON(), nullable=False)
        batch_op.drop_column("config_version")
