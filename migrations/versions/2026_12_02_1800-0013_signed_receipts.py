"""signed receipts

A request keeps its action digest (taken as the call arrived, over the arguments as sent), its
decision receipt and, once the approved call is reported executed, its execution receipt. The
keys receipts are signed with are rows of ``receipt_key``: the active one has no
``retired_at``; a rotated-out key keeps its public half so old receipts still verify. A key
supplied by the operator (a file or the environment) is listed with its public half only.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

from signoff.app.models import UTCDateTime

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("action_digest", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True)
        )
        batch_op.add_column(sa.Column("receipt", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("execution_receipt", sa.JSON(), nullable=True))
    op.create_table(
        "receipt_key",
        sa.Column("kid", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("public_key", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("private_key", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("retired_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_receipt_key")),
    )


def downgrade() -> None:
    op.drop_table("receipt_key")
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.drop_column("execution_receipt")
        batch_op.drop_column("receipt")
        batch_op.drop_column("action_digest")
