"""Tables. The schema is created only by the migrations in ``migrations/``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.instrumentation import manager_of_class
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


M = TypeVar("M", bound=SQLModel)


def utcnow() -> datetime:
    return datetime.now(UTC)


def from_row(cls: type[M], values: Mapping[str, Any]) -> M:
    """An instance holding ``values`` as given, built the way the ORM builds the rows it
    reads: no validation and no attribute events (a tenth of the constructor's cost)."""
    manager = manager_of_class(cls)
    if not manager.mapper.configured:
        configure_mappers()
    instance: M = manager.new_instance()
    instance.__dict__.update(values)
    return instance


def as_utc(moment: datetime) -> datetime:
    """``moment`` in UTC, one without a zone taken as UTC (how times given by people are read:
    the operator API, the console, the command line). Raises :class:`OverflowError` for one
    whose UTC falls outside the years a date can hold."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on both engines (SQLite stores no zone, so restore it on read)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return as_utc(value)


def _ts(**kw: Any) -> Any:
    return Field(sa_type=UTCDateTime(), **kw)


class Status(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ConfirmationRequest(SQLModel, table=True):
    __tablename__ = "confirmation_request"
    __table_args__ = (
        sa.UniqueConstraint("agent_id", "idempotency_key", name="uq_confirmation_request_idempotency"),
        sa.Index("ix_confirmation_request_status_expires_at", "status", "expires_at"),
    )

    id: str = Field(primary_key=True, max_length=32)
    agent_id: str = Field(index=True, max_length=200)
    tool_name: str = Field(max_length=500)
    arguments: dict[str, Any] = Field(sa_type=sa.JSON)
    user_id: str | None = Field(default=None, max_length=200)
    session_id: str | None = Field(default=None, max_length=200)
    tool_call_id: str | None = Field(default=None, max_length=200)
    idempotency_key: str | None = Field(default=None, max_length=500)
    call_digest: str = Field(default="", max_length=64)
    """SHA-256 of the tool name and the arguments as sent (before redaction): a replayed
    idempotency key must carry the same call."""
    request_metadata: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    gate: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """Written by releases before revision 0012 only: the first gate again, with the
    configuration's version (migrated rows have it in ``gates`` and ``config_version``)."""
    gates: list[dict[str, Any]] = Field(
        default_factory=list, sa_type=sa.JSON, sa_column_kwargs={"server_default": "[]"}
    )
    """Every gate the call matched, as each was (key, name, channel, approvers, quorum, …), in
    the order they run: each must approve. Each is stored once, without the fields left at
    their defaults (see :meth:`signoff.app.requests.eligibility.GateSnapshot.stored`)."""
    config_version: str | None = Field(default=None, max_length=64)
    """The configuration the request was gated under (None: written by a release before
    revision 0012, which kept it in ``gate``)."""
    channel: str = Field(max_length=200)
    """The first gate's channel."""
    requester: str | None = Field(default=None, max_length=200)
    """The directory key of the person the agent acts for, if recognised."""
    status: Status = Field(default=Status.PENDING, sa_type=sa.String(16))
    reason: str | None = Field(default=None)
    created_at: datetime = _ts(default_factory=utcnow)
    expires_at: datetime = _ts()
    decided_at: datetime | None = _ts(default=None, nullable=True, index=True)
    decided_by_channel: str | None = Field(default=None, max_length=200)
    decided_by_user_id: str | None = Field(default=None, max_length=200)
    decided_by_name: str | None = Field(default=None, max_length=200)
    executed_at: datetime | None = _ts(default=None, nullable=True)
    """When the approved call was reported executed (post-tool-use with its idempotency key):
    from then on the approval allows nothing more."""
    executed_arguments: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """The arguments it was reported executed with (redacted)."""
    approved_arguments: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """Approved with changes: the call as approved (``arguments`` with the approver's
    changes; the changed values are stored as given, never secrets). None: approved as asked."""
    action_digest: str | None = Field(default=None, max_length=64)
    """The call's action digest as it arrived (see :func:`signoff.hooks.receipts.action_digest`;
    None: made before revision 0013, or arguments RFC 8785 cannot represent)."""
    receipt: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """The signed decision receipt, written by the transition to a terminal status."""
    execution_receipt: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """The signed execution receipt, written when the approved call was reported executed."""


class ReceiptKey(SQLModel, table=True):
    """An Ed25519 key receipts are signed with. The one in use has no ``retired_at``; a
    rotated-out key stays listed (public half) so the receipts it signed still verify."""

    __tablename__ = "receipt_key"

    kid: str = Field(primary_key=True, max_length=64)
    """Its RFC 7638 thumbprint."""
    public_key: str = Field(max_length=64)
    """The raw public key, base64url without padding (the JWK's ``x``)."""
    private_key: str | None = Field(default=None, max_length=64)
    """The raw private key, base64url (None: the operator keeps it, in a file or the environment)."""
    source: str = Field(max_length=16)
    """``database``, or ``operator`` for a key from the settings."""
    created_at: datetime = _ts(default_factory=utcnow)
    retired_at: datetime | None = _ts(default=None, nullable=True)


class Vote(SQLModel, table=True):
    __tablename__ = "vote"
    __table_args__ = (sa.UniqueConstraint("request_id", "gate", "voter", name="uq_vote_request_gate_voter"),)

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(foreign_key="confirmation_request.id", index=True, max_length=32)
    gate: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """The gate this vote counts for: its index in the request's ``gates``. One click may
    count for several gates of its card (a row each)."""
    voter: str = Field(max_length=300)
    """Who voted: a directory key, or ``channel:user_id`` for someone not in the directory."""
    verdict: str = Field(max_length=16)
    channel: str = Field(max_length=200)
    user_id: str = Field(max_length=200)
    name: str | None = Field(default=None, max_length=200)
    email: str | None = Field(default=None, max_length=320)
    reason: str | None = None
    identity: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    created_at: datetime = _ts(default_factory=utcnow)
    grant_choice: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """An approval that chose a grant: ``{scope, seconds, same}`` (None: approve once)."""
    assurance: str | None = Field(default=None, max_length=32)
    """How the voter was identified: a :class:`signoff.channels.Assurance` value (None: not
    known, a vote recorded before revision 0014 that nothing identifies)."""


class Grant(SQLModel, table=True):
    """A standing permission given with an approval: later calls of the tool by the agent (in
    the session, for ``scope`` ``session``) with the ``same`` fields unchanged are allowed
    without asking until ``expires_at``, unless revoked. Every use reads this row."""

    __tablename__ = "approval_grant"
    __table_args__ = (sa.Index("ix_approval_grant_agent_id_tool_name", "agent_id", "tool_name"),)

    id: str = Field(primary_key=True, max_length=32)
    request_id: str = Field(foreign_key="confirmation_request.id", index=True, max_length=32)
    """The approval it was given with."""
    agent_id: str = Field(max_length=200)
    scope: str = Field(max_length=16)
    session_id: str | None = Field(default=None, max_length=200)
    """The session it holds for (``scope`` ``session``)."""
    tool_name: str = Field(max_length=500)
    """The tool exactly as the approved call named it."""
    gate: str = Field(max_length=500)
    """The key of the gate it stands in for (its name)."""
    same: dict[str, str] = Field(default_factory=dict, sa_type=sa.JSON)
    """Each field held equal → the SHA-256 of its canonical value in the approved call."""
    same_shown: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    """Each field held equal → its value as shown (redacted)."""
    granted_by: str = Field(max_length=1000)
    """The approvers' names, as the grant's uses name them."""
    grantors: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    """Each approver who chose it: ``{voter, channel, user_id, name, email}``."""
    created_at: datetime = _ts(default_factory=utcnow)
    expires_at: datetime = _ts(index=True)
    revoked_at: datetime | None = _ts(default=None, nullable=True)
    revoked_by: str | None = Field(default=None, max_length=200)
    uses: int = 0
    last_used_at: datetime | None = _ts(default=None, nullable=True)


class AuditEvent(SQLModel, table=True):
    """Append-only; each event stores the hash of the one before it in its chain
    (:mod:`signoff.app.audit`)."""

    __tablename__ = "audit_event"
    __table_args__ = (sa.Index("ix_audit_event_chain_link", "chain", "chain_seq", unique=True),)

    seq: int = Field(default=None, primary_key=True)
    """The event's number, in the order events were written (given by the database)."""
    chain: int
    """Which of the :data:`~signoff.app.audit.CHAINS` chains the event is linked into."""
    chain_seq: int
    """Its place in that chain, from 1."""
    request_id: str | None = Field(default=None, index=True, max_length=32)
    action: str = Field(max_length=64)
    actor_channel: str | None = Field(default=None, max_length=200)
    actor_id: str | None = Field(default=None, max_length=200)
    actor_name: str | None = Field(default=None, max_length=200)
    detail: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    created_at: datetime = _ts(default_factory=utcnow)
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)


class AuditHead(SQLModel, table=True):
    """The tip of one audit chain: one row per chain, locked by the transaction appending to it."""

    __tablename__ = "audit_head"

    id: int = Field(default=1, primary_key=True, sa_column_kwargs={"autoincrement": False})
    seq: int = 0
    last_hash: str = Field(max_length=64)


class OutboxStatus(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Due when there was nothing left to send: a reminder or an escalation of a request
    decided before its time (``last_error`` says why)."""


class DeliveryKind(StrEnum):
    """What a delivery sends."""

    POST = "post"
    """The request's card, to a channel of one of its gates."""
    UPDATE = "update"
    """A redraw of the card posted to the channel."""
    REMIND = "remind"
    """A reminder under the card of gate ``gate`` to whoever has not voted, at its point ``step``."""
    ESCALATE = "escalate"
    """Escalation ``step`` of gate ``gate``: the card posted to its channel (or, where the
    request already has a card, a reply under it naming the new approvers)."""
    WEBHOOK = "webhook"
    """An event owed to the webhook named in ``channel`` (``event_id``, ``payload``)."""


CARD_KINDS = (DeliveryKind.POST.value, DeliveryKind.ESCALATE.value)
"""The kinds of delivery that may post a card: a channel's card is the first of them."""


class Delivery(SQLModel, table=True):
    """One card post, card update, reminder or escalation owed to a channel, or one event owed
    to a webhook (the outbox)."""

    __tablename__ = "delivery"
    __table_args__ = (sa.Index("ix_delivery_status_next_attempt_at", "status", "next_attempt_at"),)

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(foreign_key="confirmation_request.id", index=True, max_length=32)
    """The request the card shows, or the event is about (a grant's: the request it was given with)."""
    channel: str = Field(max_length=200)
    """The channel owed the card, or the webhook owed the event (its name in ``webhooks``)."""
    kind: str = Field(max_length=16)
    """A :class:`DeliveryKind`."""
    status: OutboxStatus = Field(default=OutboxStatus.PENDING, sa_type=sa.String(16))
    attempts: int = 0
    next_attempt_at: datetime = _ts(default_factory=utcnow)
    leased_until: datetime | None = _ts(default=None, nullable=True)
    last_error: str | None = None
    message_ref: dict[str, str] | None = Field(default=None, sa_type=sa.JSON)
    created_at: datetime = _ts(default_factory=utcnow)
    sent_at: datetime | None = _ts(default=None, nullable=True)
    event_id: str | None = Field(default=None, max_length=64)
    """A webhook's ``webhook-id``: the same on every attempt, so receivers can drop repeats."""
    payload: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    """A webhook's body ``{type, timestamp, data}``, as the event's transaction left things."""
    gate: int | None = None
    """A reminder's or escalation's gate: its index in the request's ``gates``."""
    step: int | None = None
    """Which of the gate's reminder points, or of its escalations (earliest first), it is."""


class Switch(SQLModel, table=True):
    """An operator switch, such as ``read_only`` for the ``readonly_guard`` hook."""

    __tablename__ = "switch"

    name: str = Field(primary_key=True, max_length=100)
    on: bool = False
    updated_at: datetime = _ts(default_factory=utcnow)
    updated_by: str | None = Field(default=None, max_length=200)
    reason: str | None = None


class RateBucket(SQLModel, table=True):
    """A ``rate_limit`` token bucket, shared by every replica."""

    __tablename__ = "rate_bucket"

    key: str = Field(primary_key=True, max_length=500)
    tokens: float
    updated_at: datetime = _ts(default_factory=utcnow)


class AgentKey(SQLModel, table=True):
    """An agent's API key, stored as a SHA-256 hash (keys are 256-bit random)."""

    __tablename__ = "agent_key"

    id: str = Field(primary_key=True, max_length=16)
    agent_id: str = Field(index=True, max_length=200)
    key_hash: str = Field(unique=True, max_length=64)
    created_at: datetime = _ts(default_factory=utcnow)
    revoked_at: datetime | None = _ts(default=None, nullable=True)


class PersonalToken(SQLModel, table=True):
    """A personal token for the command line, made in the console (:mod:`signoff.app.tokens`):
    listed to whoever made it and to operators, revoked by its id. Its text is never stored;
    the token carries the nonce whose SHA-256 starts with ``id`` (the ``token`` its audit
    events name). A token with no row here decides nothing."""

    __tablename__ = "personal_token"

    id: str = Field(primary_key=True, max_length=16)
    owner: str = Field(index=True, max_length=300)
    """Whose it is: the operator signed in with a password (their name), or the identity
    provider's account (``oidc:`` and a digest of its issuer and subject)."""
    operator: str = Field(max_length=200)
    """The name it was made signed in as."""
    person: str = Field(index=True, max_length=300)
    """Who it decides as (a directory key, else the key their votes are recorded under)."""
    label: str | None = Field(default=None, max_length=100)
    created_at: datetime = _ts(default_factory=utcnow)
    expires_at: datetime = _ts(index=True)
    last_used_at: datetime | None = _ts(default=None, nullable=True)
    revoked_at: datetime | None = _ts(default=None, nullable=True)
    revoked_by: str | None = Field(default=None, max_length=200)


class ConsoleSessionRevocation(SQLModel, table=True):
    """A console sign-in ended by signing out: every replica refuses its cookie from then on.

    Kept until the session would have expired anyway, then pruned.
    """

    __tablename__ = "console_session_revocation"

    session_digest: str = Field(primary_key=True, max_length=64)
    """SHA-256 of the session's nonce (the cookie's own value is never stored)."""
    operator: str = Field(max_length=200)
    revoked_at: datetime = _ts(default_factory=utcnow)
    expires_at: datetime = _ts(index=True)


class Replica(SQLModel, table=True):
    """A server process and the configuration it has loaded, as it last reported (every few seconds).

    Replicas each load their own file: the console shows when live ones run different versions.
    """

    id: str = Field(primary_key=True, max_length=200)
    """``host:pid`` of the process."""
    config_version: str = Field(max_length=64)
    loaded_at: datetime = _ts()
    seen_at: datetime = _ts(index=True)
