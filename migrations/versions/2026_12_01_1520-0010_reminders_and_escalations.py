"""reminders and escalations: the gate and step of a delivery

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("delivery", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gate", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("delivery", schema=None) as batch_op:
        batch_op.drop_column("step")
        batch_op.drop_column("gate")
