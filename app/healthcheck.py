"""``python -m signoff.app.healthcheck``: exit 0 when the server on this machine answers
``/healthz`` 200, else 1 with one line saying what it met (the Docker image's HEALTHCHECK).

It asks the port the server was given (``SIGNOFF_PORT``, default 8000) on ``SIGNOFF_HOST``,
or on the loopback address when that is every interface. Standard library only: it starts in
a few tens of milliseconds, every few seconds, for as long as the container runs.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

__all__ = ["main", "url"]

TIMEOUT_SECONDS = 3.0
_EVERY_INTERFACE = {"", "0.0.0.0", "::", "[::]"}


def url(environ: Mapping[str, str] | None = None) -> str:
    """The ``/healthz`` address of the server configured by ``environ`` (the process's own)."""
    env = os.environ if environ is None else environ
    host = env.get("SIGNOFF_HOST", "127.0.0.1").strip()
    port = env.get("SIGNOFF_PORT", "8000").strip() or "8000"
    if host in _EVERY_INTERFACE:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def main() -> int:
    where = url()
    try:
        # No proxy: the address is this machine's own, whatever http_proxy says.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(where, timeout=TIMEOUT_SECONDS) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"unhealthy: {where}: {exc}; check that signoff serve runs on SIGNOFF_PORT\n")
        return 1
    if status != 200:
        sys.stderr.write(f"unhealthy: {where} answered {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
