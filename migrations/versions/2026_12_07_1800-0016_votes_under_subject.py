"""votes under the provider's subject

Someone the identity provider identified (and the directory did not) voted under
``web:<username>``, a name the provider's account chose and which may be an operator's name
or, spelled on purpose, another account's new key; such votes are now recorded under
``web:oidc:<sha256(issuer#subject)[:32]>`` (``signoff.app.requests.eligibility.Voter.key``).
The vote table is unique per request, gate and key, so an old key could keep someone else
from voting on a request still pending: those votes are re-keyed here. Votes of decided
requests keep their keys (no one votes on them again), and so do votes under a directory key
and a vote whose new key is already taken on its gate.

The downgrade keeps the new keys: the code before it matches these votes by their subject.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 18:00:00.000000
"""

import hashlib
from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VOTES = sa.table(
    "vote",
    sa.column("id", sa.Integer()),
    sa.column("request_id", sa.String()),
    sa.column("gate", sa.Integer()),
    sa.column("voter", sa.String()),
    sa.column("channel", sa.String()),
    sa.column("user_id", sa.String()),
    sa.column("identity", sa.JSON()),
)
_REQUESTS = sa.table("confirmation_request", sa.column("id", sa.String()), sa.column("status", sa.String()))


def upgrade() -> None:
    bind = op.get_bind()
    v = _VOTES.c
    pending = sa.select(_REQUESTS.c.id).where(_REQUESTS.c.status == "pending")
    rows = bind.execute(
        sa.select(v.id, v.request_id, v.gate, v.voter, v.channel, v.user_id, v.identity).where(
            v.request_id.in_(pending), v.channel == "web"
        )
    ).all()
    taken = {(r.request_id, r.gate, r.voter) for r in rows}
    changes = []
    for r in rows:
        identity = r.identity if isinstance(r.identity, Mapping) else {}
        subject = identity.get("subject")
        if not (isinstance(subject, str) and subject) or r.voter != f"{r.channel}:{r.user_id}":
            continue  # not identified by the provider, or recorded under a directory key
        digest = hashlib.sha256(f"{identity.get('issuer')}#{subject}".encode()).hexdigest()[:32]
        key = f"{r.channel}:oidc:{digest}"
        if (r.request_id, r.gate, key) in taken:
            continue
        taken.add((r.request_id, r.gate, key))
        changes.append({"vid": r.id, "key": key})
    if changes:
        bind.execute(
            _VOTES.update().where(v.id == sa.bindparam("vid")).values(voter=sa.bindparam("key")), changes
        )


def downgrade() -> None:
    pass
