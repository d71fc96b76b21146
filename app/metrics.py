"""Prometheus metrics. Counters and histograms are per process; gauges read the database at scrape."""

from __future__ import annotations

import re
from collections import OrderedDict
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

__all__ = [
    "CALLBACK_REJECTIONS",
    "CONDITION_ERRORS",
    "CONFIG_INFO",
    "CONFIG_RELOAD_FAILURES",
    "DECISIONS",
    "DECISION_SECONDS",
    "DELIVERIES",
    "EXECUTED_MISMATCHES",
    "GATE_CALLS",
    "OUTBOX_BACKLOG",
    "OUTBOX_FAILED",
    "REGISTRY",
    "REQUESTS",
    "WAITERS",
    "WEBHOOK_DELIVERIES",
    "WEBHOOK_FAILED",
    "observe_decision",
    "reason_label",
]

disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)

GATE_CALLS = Counter(
    "signoff_gate_calls",
    "Hook calls answered, by hook point, agent, gate and decision.",
    ["point", "agent", "gate", "decision"],
    registry=REGISTRY,
)
DECISIONS = Counter(
    "signoff_decisions", "Requests that reached a terminal state, by status.", ["status"], registry=REGISTRY
)
DECISION_SECONDS = Histogram(
    "signoff_decision_seconds",
    "From a request's creation to its decision, by status.",
    ["status"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 86400),
    registry=REGISTRY,
)
DELIVERIES = Counter(
    "signoff_deliveries",
    "Card posts and updates attempted, by channel, kind and result.",
    ["channel", "kind", "result"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "signoff_webhook_deliveries",
    "Webhook events attempted, by webhook and result (sent, retry, failed).",
    ["webhook", "result"],
    registry=REGISTRY,
)
CALLBACK_REJECTIONS = Counter(
    "signoff_callback_rejections",
    "Platform callbacks refused, by channel and reason.",
    ["channel", "reason"],
    registry=REGISTRY,
)
CONDITION_ERRORS = Counter(
    "signoff_condition_errors",
    "Calls denied because a gate's condition could not be evaluated for them, by agent and gate.",
    ["agent", "gate"],
    registry=REGISTRY,
)
EXECUTED_MISMATCHES = Counter(
    "signoff_executed_mismatches",
    "Approved calls reported executed with arguments other than the approved ones, by agent.",
    ["agent"],
    registry=REGISTRY,
)
REQUESTS = Gauge("signoff_requests", "Requests in the database, by status.", ["status"], registry=REGISTRY)
OUTBOX_BACKLOG = Gauge(
    "signoff_outbox_backlog",
    "Deliveries due and not sent yet: cards, reminders and escalations once due, webhook events.",
    registry=REGISTRY,
)
OUTBOX_FAILED = Gauge(
    "signoff_outbox_failed", "Card deliveries and webhook events that gave up.", registry=REGISTRY
)
WEBHOOK_FAILED = Gauge(
    "signoff_webhook_failed", "Webhook events that gave up, by webhook.", ["webhook"], registry=REGISTRY
)
WAITERS = Gauge("signoff_waiters", "Agents long-polling on this process.", registry=REGISTRY)
CONFIG_INFO = Gauge(
    "signoff_config_info",
    "The configuration this process has loaded (1 for its version).",
    ["version"],
    registry=REGISTRY,
)
CONFIG_RELOAD_FAILURES = Counter(
    "signoff_config_reload_failures",
    "Configuration reloads refused for problems in the file.",
    registry=REGISTRY,
)

_NUMBERS = re.compile(r"\d+")


def reason_label(reason: str) -> str:
    """A bounded label from a free-text reason (numbers folded, length capped)."""
    return _NUMBERS.sub("N", reason)[:60]


_COUNTED: OrderedDict[str, None] = OrderedDict()
"""The requests whose decision this process has counted, newest last (bounded)."""
_REMEMBERED = 100_000


def observe_decision(request_id: str, status: str, created_at: datetime, decided_at: datetime) -> bool:
    """Count a request's decision (``signoff_decisions_total``, ``signoff_decision_seconds``)
    once, however many times this process hears of it (its own commit, then the read of
    recent decisions that finds decisions made by other processes). True if it counted."""
    if request_id in _COUNTED:
        return False
    _COUNTED[request_id] = None
    if len(_COUNTED) > _REMEMBERED:
        _COUNTED.popitem(last=False)
    DECISIONS.labels(status).inc()
    DECISION_SECONDS.labels(status).observe(max(0.0, (decided_at - created_at).total_seconds()))
    return True
