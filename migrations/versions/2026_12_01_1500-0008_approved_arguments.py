"""approved arguments

An approver of a gate with ``editable`` fields may change them and approve: the request
records the call as approved (``approved_arguments``). Existing rows were approved as asked.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.add_column(sa.Column("approved_arguments", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("confirmation_request", schema=None) as batch_op:
        batch_op.drop_column("approved_arguments")
