"""CSV export of the report's tables (one table per file)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from .report import Report, Table

__all__ = ["TABLES", "csv_rows", "table_csv"]

TABLES = ("overview", "monthly", "monthly_by_product", "customers", "at_risk")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    text = str(value)
    # No formula injection when the file is opened in a spreadsheet.
    if text[:1] in ("=", "+", "-", "@") and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        Decimal(text)
    except ArithmeticError:
        return False
    return True


def csv_rows(table: Table) -> Iterator[list[str]]:
    """The header (column labels) then one list of strings per row."""
    yield [c.key for c in table.columns]
    for row in table.values():
        yield [_cell(v) for v in row]


def table_csv(report: Report, name: str) -> str:
    """One table of ``report`` as CSV text. ``KeyError`` for an unknown table name."""
    table = report.tables()[name]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerows(csv_rows(table))
    return buffer.getvalue()
