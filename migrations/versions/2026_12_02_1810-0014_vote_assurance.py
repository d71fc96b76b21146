"""vote assurance

Every vote records how its voter was identified (``assurance``: ``oidc``, ``slack_signed``,
``feishu_signed``, ``teams_jwt``, ``email_link``, ``ntfy_link``, ``console_password``,
``cli_token``, ``admin_token``, ``cli_local``). Votes recorded before this revision get the
level their stored identity shows: an operator's ``via`` (``cli``: the command line on the
database, ``api``: the operator API's admin token, ``console``: a password sign-in, the only
one there was), an email link's ``link``, a Feishu click's ``open_id``, a Slack click's
``team_id``. Any other vote keeps null: not known.

The downgrade keeps each vote's level in its ``identity`` (as ``assurance``) before dropping
the column, and an upgrade takes it from there again: nothing is lost either way.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 18:00:00.000000
"""

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VOTES = sa.table(
    "vote",
    sa.column("id", sa.Integer()),
    sa.column("identity", sa.JSON()),
    sa.column("assurance", sa.String()),
)
_VIA = {"cli": "cli_local", "api": "admin_token", "console": "console_password"}


def _level(identity: Any) -> str | None:
    """The level a vote's stored identity shows, or None when it does not tell."""
    if not isinstance(identity, Mapping):
        return None
    kept = identity.get("assurance")
    if isinstance(kept, str) and kept:
        return kept  # kept there by this revision's downgrade
    via = identity.get("via")
    if isinstance(via, str):
        return _VIA.get(via)
    if "link" in identity:
        return "email_link"
    if "open_id" in identity:
        return "feishu_signed"
    if "team_id" in identity:
        return "slack_signed"
    return None


def _kept(identity: Any, level: str) -> dict[str, Any]:
    """``identity`` with the vote's level kept in it."""
    return {**(identity if isinstance(identity, Mapping) else {}), "assurance": level}


def upgrade() -> None:
    with op.batch_alter_table("vote", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("assurance", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True)
        )
    bind = op.get_bind()
    known = [
        {"vid": vid, "level": level}
        for vid, identity in bind.execute(sa.select(_VOTES.c.id, _VOTES.c.identity)).all()
        if (level := _level(identity)) is not None
    ]
    if known:
        bind.execute(
            _VOTES.update().where(_VOTES.c.id == sa.bindparam("vid")).values(assurance=sa.bindparam("level")),
            known,
        )


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_VOTES.c.id, _VOTES.c.identity, _VOTES.c.assurance).where(_VOTES.c.assurance.is_not(None))
    ).all()
    if rows:
        bind.execute(
            _VOTES.update().where(_VOTES.c.id == sa.bindparam("vid")).values(identity=sa.bindparam("kept")),
            [{"vid": vid, "kept": _kept(identity, level)} for vid, identity, level in rows],
        )
    with op.batch_alter_table("vote", schema=None) as batch_op:
        batch_op.drop_column("assurance")
