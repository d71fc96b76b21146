"""call digest for early databases

Revision 0001 was first released without ``confirmation_request.call_digest``; the column was
later written into 0001 itself, so a database made by that first release reached every later
revision without it. This revision adds it there, filled with the digest of each request's
call as stored (a call stored with redacted values gets a digest no replay matches, so its
replays are refused as a different call: never allowed). Where the column exists it does
nothing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 05:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

from signoff.app.requests.canonical import call_digest

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REQUESTS = sa.table(
    "confirmation_request",
    sa.column("id", sa.String()),
    sa.column("tool_name", sa.String()),
    sa.column("arguments", sa.JSON()),
    sa.column("call_digest", sa.String()),
)


def upgrade() -> None:
    bind = op.get_bind()
    if "call_digest" in {c["name"] for c in sa.inspect(bind).get_columns("confirmation_request")}:
        return
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "call_digest", sqlmodel.sql.sqltypes.AutoString(length=64), server_default="", nullable=False
            )
        )
    rows = bind.execute(sa.select(_REQUESTS.c.id, _REQUESTS.c.tool_name, _REQUESTS.c.arguments)).all()
    if rows:
        bind.execute(
            _REQUESTS.update().where(_REQUESTS.c.id == sa.bindparam("rid")),
            [
                {"rid": rid, "call_digest": call_digest(tool, arguments or {})}
                for rid, tool, arguments in rows
            ],
        )
    # As the column of a database made at 0001 today: no server default.
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.alter_column("call_digest", server_default=None)


def downgrade() -> None:
    # Revision 0010 as released today has the column (in 0001): there is nothing to undo.
    pass
