"""CSV export cells that no spreadsheet runs as a formula, in any locale (hypothesis), and
the export over real HTTP."""

from __future__ import annotations

import csv
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from signoff.app.console.history import csv_cell, csv_writer
from tests.console.conftest import Agent, Console

TRIGGERS = "=+-@\t\r\n\uff1d\uff0b\uff0d\uff20"
SEPARATORS = [",", ";", "\t", "|"]
"""List separators a spreadsheet may split a line by, depending on its locale."""


def split(line: str, separator: str) -> list[str]:
    """A line split the way a spreadsheet splits it: at ``separator`` outside quotes."""
    fields, current, quoted = [], [], False
    for c in line:
        if c == '"':
            quoted = not quoted
        elif c == separator and not quoted:
            fields.append("".join(current))
            current = []
            continue
        current.append(c)
    fields.append("".join(current))
    return fields


def opens_a_formula(field: str) -> bool:
    """Whether a field read by a spreadsheet starts like a formula (a leading ' defuses it)."""
    content = field.lstrip(' "')
    return content[:1] != "" and content[:1] in TRIGGERS


cells = st.text(
    st.sampled_from([*TRIGGERS, *SEPARATORS, '"', "'", " ", "a", "1", "(", ")", "\uff0c", "\uff1b"])
    | st.characters(),
    max_size=20,
)


def written(row: list[str]) -> str:
    buffer = io.StringIO()
    csv_writer(buffer).writerow([csv_cell(c) for c in row])
    return buffer.getvalue()


@settings(max_examples=1000, deadline=None)
@given(st.lists(cells, min_size=1, max_size=4))
def test_no_cell_opens_a_formula_in_any_locale(row: list[str]) -> None:
    line = written(row)
    # Read back as CSV, every cell is what was written, a ' before it at most.
    back = next(csv.reader(io.StringIO(line, newline="")))
    assert [b[1:] if b.startswith("'") and b[1:] == c else b for b, c in zip(back, row, strict=True)] == row
    # However a spreadsheet splits the line, no field starts like a formula.
    for separator in SEPARATORS:
        for field in split(line.rstrip("\r\n"), separator):
            assert not opens_a_formula(field), (row, separator, field)


def could_start_a_formula(cell: str) -> bool:
    """At the start or after a separator: spaces or quotes at most, then a trigger."""
    starts = [0] + [i + 1 for i, c in enumerate(cell) if c in ",;\t|\r\n\uff0c\uff1b"]
    for i in starts:
        for c in cell[i:]:
            if c in TRIGGERS:
                return True
            if not (c.isspace() or c in "\"'"):
                break
    return False


@given(cells)
def test_a_cell_is_prefixed_when_a_separator_could_let_a_formula_start(cell: str) -> None:
    assert csv_cell(cell) == ("'" + cell if could_start_a_formula(cell) else cell), cell


async def test_the_export_quotes_and_defuses_formulas_after_a_separator(alice: Console, agent: Agent) -> None:
    rid = await agent.ask(
        tool="pay_x;=1+1", arguments={"amount": 90000, "memo": "a;=2+2"}, user_id="u;@SUM(A1)"
    )
    r = await alice.get("/ui/history/export.csv")
    assert r.status_code == 200
    line = next(line for line in r.text.splitlines() if rid in line)
    for separator in SEPARATORS:
        for field in split(line, separator):
            assert not opens_a_formula(field), (separator, field)
    row = next(row for row in csv.DictReader(io.StringIO(r.text)) if row["id"] == rid)
    assert row["tool"] == "'pay_x;=1+1"
    assert row["requester"] == "'u;@SUM(A1)"
    assert row["arguments"] == "'" + '{"amount":90000,"memo":"a;=2+2"}'
    assert f'"{rid}"' in line, "every cell is quoted"
