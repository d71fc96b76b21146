"""``signoff serve`` for the chaos run, with the outbox lease shortened.

A card delivery in flight when the server is killed is retried once its lease
runs out: 60 s in production (``app.outbox.LEASE``). The chaos run kills the
server several times a minute, so it sets the lease from
``SIGNOFF_CHAOS_LEASE_SECONDS`` (the fake Slack answers in milliseconds, far
inside any lease); nothing else differs from ``signoff serve``.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import app.outbox
from app.cli import main

if __name__ == "__main__":
    seconds = os.environ.get("SIGNOFF_CHAOS_LEASE_SECONDS")
    if seconds:
        app.outbox.LEASE = timedelta(seconds=float(seconds))
    sys.argv = ["signoff", *sys.argv[1:]]
    main()
