"""Chat-channel adapters behind one small interface (see :mod:`signoff.channels._contract`)."""

from signoff.channels._contract import (
    CallbackRejected,
    CallbackReply,
    Card,
    Channel,
    Click,
    ClickHandler,
    ClickOutcome,
    DeliveryError,
    GateProgress,
    Identity,
    InteractiveChannel,
    MessageRef,
    PermanentDeliveryError,
    Person,
    RetryableDeliveryError,
    Verdict,
)

__all__ = [
    "CallbackRejected",
    "CallbackReply",
    "Card",
    "Channel",
    "Click",
    "ClickHandler",
    "ClickOutcome",
    "DeliveryError",
    "GateProgress",
    "Identity",
    "InteractiveChannel",
    "MessageRef",
    "PermanentDeliveryError",
    "Person",
    "RetryableDeliveryError",
    "Verdict",
]
