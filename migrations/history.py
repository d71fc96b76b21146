"""What the released migrations need beyond their own files, which are never edited once
released (``tests/migrations/test_released.py`` pins them):

- :func:`repair_renumbered_0004`: a database made by the release whose revision 0004 was
  *several gates per request* (that migration is 0006 today) is brought onto today's line.
- :data:`DROPS` and :func:`refuse_lossy_downgrade`: a downgrade never throws away what the
  database holds. What each revision's downgrade drops is declared here (a test checks the
  declaration against the downgrade itself); a downgrade whose drops hold anything is refused
  before anything changes, naming them.

:mod:`signoff.migrations.env` calls both in the migration's own transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

__all__ = ["DROPS", "DowngradeRefused", "Drop", "refuse_lossy_downgrade", "repair_renumbered_0004"]

log = logging.getLogger("signoff")


class DowngradeRefused(Exception):
    """A downgrade would drop data; nothing was changed."""


@dataclass(frozen=True, slots=True)
class Drop:
    """A table, or a column of one, that a revision's downgrade drops."""

    table: str
    column: str | None = None
    holds: str | None = ""
    """The SQL condition under which a row holds something the drop would lose; ``""``: the
    column is not NULL (any row, for a table); None: nothing of it is worth keeping (the
    servers rebuild it)."""

    @property
    def name(self) -> str:
        return self.table if self.column is None else f"{self.table}.{self.column}"

    def condition(self) -> str:
        if self.holds:
            return self.holds
        return "1 = 1" if self.column is None else f"{self.column} IS NOT NULL"


def _json(column: str, empty: str = "null") -> str:
    """A JSON column holding something other than SQL NULL or ``empty``."""
    return f"{column} IS NOT NULL AND CAST({column} AS TEXT) <> '{empty}'"


DROPS: dict[str, tuple[Drop, ...]] = {
    # Personal tokens: below 0017 a token is its signed text alone, so one revoked here would
    # decide again; a database holding any is not downgraded.
    "0017": (Drop("personal_token"),),
    # Votes of pending requests re-keyed under the provider's subject (nothing dropped).
    "0016": (),
    # The events are linked into one chain again before their chains' columns go.
    "0015": (Drop("audit_event", "chain_seq", holds=None), Drop("audit_event", "chain", holds=None)),
    # Each vote's level goes into its ``identity`` before the column is dropped.
    "0014": (Drop("vote", "assurance", holds=None),),
    # Signed receipts are evidence: never dropped. The keys go only where no receipt is left
    # for them to verify; the action digest is of no use without the receipts.
    "0013": (
        Drop("confirmation_request", "receipt", _json("receipt")),
        Drop("confirmation_request", "execution_receipt", _json("execution_receipt")),
        Drop("confirmation_request", "action_digest", holds=None),
        Drop("receipt_key", holds=None),
    ),
    # Its version goes back into ``gate`` before the column is dropped.
    "0012": (Drop("confirmation_request", "config_version", holds=None),),
    "0011": (),
    "0010": (Drop("delivery", "gate"), Drop("delivery", "step")),
    "0009": (Drop("delivery", "event_id"), Drop("delivery", "payload", _json("payload"))),
    "0008": (Drop("confirmation_request", "approved_arguments", _json("approved_arguments")),),
    "0007": (
        Drop("approval_grant"),
        Drop("confirmation_request", "executed_at"),
        Drop("confirmation_request", "executed_arguments", _json("executed_arguments")),
        Drop("vote", "grant_choice", _json("grant_choice")),
    ),
    "0006": (
        Drop("confirmation_request", "gates", _json("gates", "[]")),
        Drop("vote", "gate", "gate <> 0"),
    ),
    "0005": (Drop("replica", holds=None),),
    "0004": (Drop("console_session_revocation"),),
    "0003": (),
    "0002": (Drop("switch"), Drop("rate_bucket", holds=None)),
    "0001": (
        Drop("agent_key"),
        Drop("audit_event"),
        Drop("audit_head", holds="seq <> 0"),
        Drop("confirmation_request"),
        Drop("delivery"),
        Drop("vote"),
    ),
}
"""What each revision's downgrade drops, by revision."""


def refuse_lossy_downgrade(connection: Connection, revisions: Iterable[str], target: str) -> None:
    """Raise :class:`DowngradeRefused` if undoing ``revisions`` (down to ``target``) would drop
    anything the database holds, naming each table and column; do nothing otherwise."""
    lost: list[str] = []
    for revision in revisions:
        if revision not in DROPS:
            raise DowngradeRefused(
                f"revision {revision} does not declare what its downgrade drops: "
                "add it to signoff.migrations.history.DROPS"
            )
        for drop in DROPS[revision]:
            if drop.holds is None:
                continue
            n = connection.execute(
                sa.text(f"SELECT COUNT(*) FROM {drop.table} WHERE {drop.condition()}")
            ).scalar()
            if n:
                lost.append(f"{drop.name} ({n} {'row' if n == 1 else 'rows'}, revision {revision})")
    if lost:
        raise DowngradeRefused(
            f"refused to downgrade to {target}: it would drop data the database holds in "
            f"{', '.join(lost)}; nothing was changed (to go back, restore a backup taken before the upgrade)"
        )


def repair_renumbered_0004(context: MigrationContext, script: ScriptDirectory) -> bool:
    """Bring a database stamped 0004 by the release whose 0004 was *several gates per request*
    onto today's line; True if it was one.

    That migration became 0006 when *console session revocations* (0004) and *replicas* (0005)
    were released before it. Such a database has 0006's changes and lacks 0004's and 0005's:
    they are applied and it is stamped 0006, from where it upgrades as any other.
    """
    connection = context.connection
    assert connection is not None
    if context.get_current_heads() != ("0004",) or "0006" not in {
        s.revision for s in script.walk_revisions()
    }:
        return False
    inspector = sa.inspect(connection)
    if "gate" not in {c["name"] for c in inspector.get_columns("vote")}:
        return False
    log.info("revision 0004 here is 'several gates per request' (today's 0006): applying 0004 and 0005")
    with Operations.context(context):
        for revision in ("0004", "0005"):
            found = script.get_revision(revision)
            assert found is not None
            found.module.upgrade()
    connection.execute(sa.text("UPDATE alembic_version SET version_num = '0006' WHERE version_num = '0004'"))
    return True
