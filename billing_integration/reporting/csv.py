"""CSV export of the report's tables (one table per file)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from decimal import Decimal
from typing import Any

from . import report

TABLES = tuple(report.TABLES)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    text = str(value)
    # No formula injection when the file is opened in a spreadsheet.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        Decimal(text)
    except ArithmeticError:
        return False
    return True


def table_csv(data: report.Report, name: str) -> str:
    """One table of the report as CSV text: a header of column keys, then the rows.
    ``KeyError`` for an unknown table name."""
    table = data.tables()[name]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([c.key for c in table.columns])
    writer.writerows([_cell(v) for v in row] for row in table.values())
    return buffer.getvalue()
