"""The history page's filter, and its exports streamed as CSV and JSON Lines."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from signoff.app import queries
from signoff.app.bodies import storable
from signoff.app.config import SignoffConfig
from signoff.app.console.format import compact_json, iso
from signoff.app.console.pages import RequestRow, request_rows, row_of
from signoff.app.models import ConfirmationRequest, Status, Vote, as_utc, utcnow
from signoff.app.queries import RequestFilter
from signoff.app.requests.tally import approvals_by_gate, votes_of_requests

__all__ = [
    "CSV_COLUMNS",
    "HistoryQuery",
    "csv_cell",
    "csv_lines",
    "csv_writer",
    "jsonl_lines",
    "parse_history",
]

PAGE = 50
FIELDS = ("status", "agent", "tool", "decider", "from", "to")
CSV_COLUMNS = [
    "id",
    "created_at",
    "agent",
    "tool",
    "status",
    "requester",
    "approvals",
    "quorum",
    "gate",
    "channel",
    "expires_at",
    "decided_at",
    "decided_by",
    "reason",
    "arguments",
    "votes",
]
"""``votes``: each vote as ``name: verdict (assurance)``, ``; ``-separated, oldest first (the
assurance ``unknown`` for votes recorded before it was)."""


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    filter: RequestFilter
    values: dict[str, str]
    """The form's fields as given (to fill the form again and build export links)."""
    errors: list[str] = field(default_factory=list)

    @property
    def query_string(self) -> str:
        return urlencode({k: v for k, v in self.values.items() if v})


def _moment(raw: str, *, end: bool) -> datetime:
    """``2026-05-01``, ``2026-05-01T12:30`` or full ISO; times without a zone are UTC.

    A bare date as the end of a range means the end of that day.
    """
    value = datetime.fromisoformat(raw)
    value = as_utc(value)
    if end and len(raw.strip()) == 10:
        value += timedelta(days=1)
    return value


def parse_history(params: Mapping[str, str]) -> HistoryQuery:
    """The filter from the query string; a bad field is reported and left out, never a 500."""
    values = {k: params.get(k, "").strip()[:500] for k in FIELDS}
    errors: list[str] = []
    for k, v in values.items():
        if not storable(v):  # no stored text holds it, so it can match nothing
            errors.append(f"{k.title()}: NUL characters and lone surrogates are not allowed.")
            values[k] = ""
    status: Status | None = None
    if values["status"]:
        try:
            status = Status(values["status"])
        except ValueError:
            errors.append(f"Unknown status {values['status']!r}.")
            values["status"] = ""
    moments: dict[str, datetime | None] = {"from": None, "to": None}
    for name in ("from", "to"):
        if values[name]:
            try:
                moments[name] = _moment(values[name], end=name == "to")
            except (ValueError, OverflowError):
                errors.append(f"{name.title()!s}: {values[name]!r} is not a date (use YYYY-MM-DD HH:MM).")
                values[name] = ""
    before: datetime | None = None
    if (raw_before := params.get("before", "").strip()) and storable(raw_before):
        try:
            before = _moment(raw_before, end=False)
        except (ValueError, OverflowError):
            errors.append("Bad page marker; showing the newest requests.")
    which = RequestFilter(
        status=status,
        agent=values["agent"] or None,
        tool_contains=values["tool"] or None,
        decider=values["decider"] or None,
        created_from=moments["from"],
        created_to=moments["to"],
        before=before,
    )
    return HistoryQuery(which, values, errors)


@dataclass(frozen=True, slots=True)
class HistoryView:
    rows: list[RequestRow]
    older: str | None
    """The query string of the next (older) page, if there is one."""


async def history_view(session: AsyncSession, config: SignoffConfig, q: HistoryQuery) -> HistoryView:
    reqs = await queries.list_requests(session, q.filter, limit=PAGE + 1)
    rows = await request_rows(session, config, reqs[:PAGE], utcnow())
    older = None
    if len(reqs) > PAGE:
        older = urlencode(
            {**{k: v for k, v in q.values.items() if v}, "before": iso(reqs[PAGE - 1].created_at)}
        )
    return HistoryView(rows, older)


# What can make a spreadsheet read a cell as a formula (OWASP's list, with the full-width
# forms some locales accept), and what can end a cell in some locale (the list separator
# is "," or ";", and tab- or pipe-separated imports exist).
_FORMULA_START = "=+-@\t\r\n\uff1d\uff0b\uff0d\uff20"
_CELL_ENDS = ",;\t|\r\n\uff0c\uff1b"
_COULD_START_FORMULA = re.compile(f"(?:^|[{re.escape(_CELL_ENDS)}])[\\s\"']*[{re.escape(_FORMULA_START)}]")


def csv_cell(value: object) -> str:
    """A value as a CSV cell that no spreadsheet, in any locale, runs as a formula.

    A cell that starts like a formula, or would once split at a separator of some locale
    (``a;=2+2`` where ``;`` separates), gets a leading ``'``; and every cell is quoted
    (:func:`csv_writer`), so it is never split. Arguments come from agents.
    """
    text = "" if value is None else str(value)
    return "'" + text if _COULD_START_FORMULA.search(text) else text


def csv_writer(buffer: io.StringIO) -> Any:
    """The export's CSV writer: every cell quoted."""
    return csv.writer(buffer, quoting=csv.QUOTE_ALL)


def _votes_cell(votes: list[Vote]) -> str:
    """The request's votes in one cell (one line per voter would break a row per request)."""
    seen: dict[tuple[str, str], str] = {}
    for v in votes:  # a vote counting for several gates is one row per gate: shown once
        shown = f"{v.name or v.user_id}: {v.verdict} ({v.assurance or 'unknown'})"
        seen.setdefault((v.voter, v.verdict), shown)
    return "; ".join(seen.values())


def _csv_row(row: RequestRow, req: ConfirmationRequest, votes: list[Vote]) -> list[str]:
    return [
        csv_cell(v)
        for v in (
            row.id,
            iso(row.created_at),
            row.agent,
            row.tool,
            row.status,
            row.requester,
            row.approvals,
            row.quorum,
            row.gate,
            row.channel,
            iso(row.expires_at),
            iso(row.decided_at),
            row.decided_by,
            row.reason,
            compact_json(req.arguments),
            _votes_cell(votes),
        )
    ]


async def _csv_rows(
    session: AsyncSession, config: SignoffConfig, batch: list[ConfirmationRequest]
) -> list[list[str]]:
    """The batch's CSV rows, leaving out a request stored in a form that cannot be shown."""
    approvals, now = await approvals_by_gate(session, (r.id for r in batch)), utcnow()
    votes = await votes_of_requests(session, [r.id for r in batch])
    return queries.readable(
        batch,
        lambda r: _csv_row(row_of(r, approvals, config, now), r, queries.shown_votes(votes.get(r.id, []))),
    )


async def csv_lines(
    sessions: async_sessionmaker[AsyncSession], config: SignoffConfig, which: RequestFilter
) -> AsyncIterator[str]:
    """Every matching request as CSV, newest first, read in batches as the client takes it."""
    buffer = io.StringIO()
    writer = csv_writer(buffer)
    writer.writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    async with sessions() as session:
        async for batch in queries.iter_requests(session, which):
            buffer.seek(0)
            buffer.truncate()
            writer.writerows(await _csv_rows(session, config, batch))
            yield buffer.getvalue()


async def jsonl_lines(sessions: async_sessionmaker[AsyncSession], which: RequestFilter) -> AsyncIterator[str]:
    """Every matching request as one JSON object per line (the operator API's shape), newest first."""
    async with sessions() as session:
        async for batch in queries.iter_requests(session, which):
            yield "".join(out.model_dump_json() + "\n" for out in await queries.request_outs(session, batch))
