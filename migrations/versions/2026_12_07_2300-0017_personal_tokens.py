"""personal tokens

A personal token for the command line was a signed text only: nothing listed the ones a
person had, and none could be revoked without its text. Each is now a row (its text never
stored): listed to its owner in the console and to operators, revoked by id. Tokens made
before this revision have no row and decide nothing (make a new one in the console).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import signoff.app.models

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "personal_token",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("owner", sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column("operator", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("person", sqlmodel.sql.sqltypes.AutoString(length=300), nullable=False),
        sa.Column("label", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=True),
        sa.Column("created_at", signoff.app.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", signoff.app.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", signoff.app.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", signoff.app.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_personal_token")),
    )
    with op.batch_alter_table("personal_token", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_personal_token_expires_at"), ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_personal_token_owner"), ["owner"], unique=False)
        batch_op.create_index(batch_op.f("ix_personal_token_person"), ["person"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("personal_token", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_personal_token_person"))
        batch_op.drop_index(batch_op.f("ix_personal_token_owner"))
        batch_op.drop_index(batch_op.f("ix_personal_token_expires_at"))

    op.drop_table("personal_token")
