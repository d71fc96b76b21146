"""The fake Slack Web API of the tests (``tests/channels/fake_slack.py``) as a process of its own,
for the chaos run: a server can be killed and restarted while the fake keeps its record.

Extra endpoints:

- ``POST /control/outage`` ``{"mode": "429" | "5xx" | "off", "retry_after": 1}``: answer every
  ``chat.postMessage`` / ``chat.update`` with 429 + ``Retry-After`` or a 503 HTML page until off;
- ``GET /control/log[?since=N]``: every Web API call in order (from the N-th on), with the time,
  the answer, the ``ts`` of the message, the request ids on its buttons, and whether it has
  buttons.

    python -m bench.fake_slack_server --port-file PATH
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.channels.fake_slack import FakeSlack

CARD_METHODS = ("chat.postMessage", "chat.update")


def blocks_of(args: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = args.get("blocks")
    if isinstance(blocks, str):
        blocks = json.loads(blocks)
    return blocks if isinstance(blocks, list) else []


def buttons(blocks: list[dict[str, Any]]) -> list[str]:
    """The request ids on a card's buttons (none once it is decided)."""
    return [
        str(e.get("value"))
        for b in blocks
        if b.get("type") == "actions"
        for e in b.get("elements", [])
        if e.get("type") == "button"
    ]


class ChaosSlack(FakeSlack):
    def __init__(self) -> None:
        super().__init__()
        self.outage: str = "off"
        self.retry_after = 1.0
        self.log: list[dict[str, Any]] = []

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._logged_api)
        app.router.add_post("/control/outage", self._set_outage)
        app.router.add_get("/control/log", self._get_log)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.port = int(self._runner.addresses[0][1])

    async def _logged_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        entry: dict[str, Any] = {"t": time.time(), "method": method}
        if method in CARD_METHODS and self.outage != "off":
            entry["status"] = 429 if self.outage == "429" else 503
            self.log.append(entry)
            if self.outage == "429":
                return web.json_response(
                    {"ok": False, "error": "ratelimited"},
                    status=429,
                    headers={"Retry-After": f"{self.retry_after:g}"},
                )
            return web.Response(status=503, text="<html>upstream error</html>", content_type="text/html")
        response = await self._api(request)
        args: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            if request.content_type == "application/json":
                args = dict(await request.json())
            else:
                args = dict(await request.post())
        entry["status"] = response.status
        if isinstance(response, web.Response) and response.body is not None:
            with contextlib.suppress(Exception):
                body = json.loads(bytes(response.body))  # type: ignore[arg-type]
                entry["ok"] = body.get("ok")
                entry["ts"] = body.get("ts") or args.get("ts")
                entry["error"] = body.get("error")
        if method in CARD_METHODS:
            blocks = blocks_of(args)
            entry["buttons"] = buttons(blocks)
            entry["text"] = str(args.get("text", ""))
            entry["channel"] = args.get("channel")
            entry["blob"] = json.dumps(blocks)[:20000]
        self.log.append(entry)
        return response

    async def _set_outage(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.outage = str(body.get("mode", "off"))
        self.retry_after = float(body.get("retry_after", 1.0))
        return web.json_response({"mode": self.outage})

    async def _get_log(self, request: web.Request) -> web.Response:
        since = int(request.query.get("since", "0"))
        return web.json_response(self.log[since:])


async def serve(port_file: Path) -> None:
    fake = ChaosSlack()
    await fake.start()
    port_file.write_text(str(fake.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await fake.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", type=Path, required=True)
    args = p.parse_args()
    asyncio.run(serve(args.port_file))


if __name__ == "__main__":
    main()
