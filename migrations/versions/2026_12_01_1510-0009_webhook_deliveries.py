"""webhook deliveries

Decision webhooks go through the outbox: a ``delivery`` row of kind ``webhook`` names the
webhook in ``channel`` and holds the event's ``webhook-id`` (``event_id``) and its body
(``payload``). Card deliveries leave both empty.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("delivery") as batch:
        batch.add_column(sa.Column("event_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))
        batch.add_column(sa.Column("payload", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("delivery") as batch:
        batch.drop_column("payload")
        batch.drop_column("event_id")
