"""CSV the portal writes for people, who open it in a spreadsheet.

A spreadsheet takes a cell that starts with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage
return before one) for a formula, so a display name ``=HYPERLINK(...)`` would turn into a link, and
a team name ``=1+cmd|...`` into a command, on the computer of whoever opens the public stats dumps.
Every text cell that starts so is written after a ``'``, which spreadsheets read as "this is text"
and do not show. Numbers are written as they are, negative ones included, so that a column of
figures stays figures. Every CSV the portal writes goes through here
(tests/security/test_spreadsheet_formulas.py checks the code for other writers).
"""

import csv
import io

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """``value`` as a spreadsheet should show it: text that would start a formula, quoted as text."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(rows: list[dict]) -> str:
    """``rows`` under a header of the first row's keys; nothing at all for no rows."""
    text = io.StringIO()
    if rows:
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({name: csv_cell(value) for name, value in row.items()} for row in rows)
    return text.getvalue()
