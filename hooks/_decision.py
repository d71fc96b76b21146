"""What a gate answers: allow, deny, or pending (a person must decide)."""

from enum import StrEnum

__all__ = ["Decision"]


class Decision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    PENDING = "pending"
    """A human must decide; ``request_id`` names the confirmation request."""
