"""Writes below the ORM, fast: many rows whose values differ per row (``update_rows``,
``insert_rows``), and one row that may exist already (``insert_ignoring_conflict``).

Django's ``QuerySet.bulk_update`` builds one ``CASE WHEN pk = ... THEN ...`` per field and
row; resolving those expressions costs more Python time than the database spends on the
rows. ``update_rows`` sends, on PostgreSQL, one ``UPDATE ... FROM jsonb_to_recordset(%s)``
for the whole set, and elsewhere the plain ``UPDATE ... WHERE pk =
%s`` through ``executemany`` (SQLite runs it as one prepared statement, in process). Like
``bulk_update`` it sends no signal and does not touch ``auto_now`` fields unless named.
"""

from __future__ import annotations

import datetime
import decimal
import json
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, connections, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

__all__ = ["insert_ignoring_conflict", "insert_rows", "update_rows"]


class _Encoder(DjangoJSONEncoder):
    """Datetimes with their offset and full precision (``timestamptz`` reads them back)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime.datetime):
            return o.isoformat()
        return super().default(o)


def update_rows(
    objs: Sequence[models.Model], fields: Iterable[str], *, using: str = "default"
) -> int:
    """``UPDATE`` each of ``objs`` (same model) setting ``fields`` to its attribute values.

    PostgreSQL: one statement whose parameters are the rows as a JSON array, typed back by
    ``jsonb_to_recordset`` (psycopg has no placeholder to parse or value to quote, the server
    plans one statement), and their primary keys as an array (the rows are found through the
    primary key's index). Elsewhere: ``executemany`` of ``UPDATE ... WHERE pk = %s`` with the
    values prepared by each field's ``get_db_prep_save``. Returns the number of rows sent."""
    if not objs:
        return 0
    opts = type(objs[0])._meta
    connection = connections[using]
    concrete = [opts.get_field(name) for name in fields]
    if connection.vendor == "postgresql":
        _update_from_json(objs, opts, concrete, connection)
    else:
        _update_each(objs, opts, concrete, connection)
    return len(objs)


# Only quoted identifiers and column types from the model's own metadata are formatted into
# the SQL below; every value is a parameter.
def _update_from_json(
    objs: Sequence[models.Model], opts: Any, concrete: list[models.Field], connection: Any
) -> None:
    qn = connection.ops.quote_name
    table = qn(opts.db_table)
    columns = [opts.pk, *concrete]
    names = [f"c{i}" for i in range(len(columns))]
    types = ", ".join(
        f"{name} {field.db_type(connection)}" for name, field in zip(names, columns, strict=True)
    )
    assignments = ", ".join(
        f"{qn(field.column)} = v.{name}" for field, name in zip(concrete, names[1:], strict=True)
    )
    document = json.dumps(
        [
            dict(zip(names, [obj.pk, *(getattr(obj, f.attname) for f in concrete)], strict=True))
            for obj in objs
        ],
        cls=_Encoder,
    )
    # The primary keys once more as an array: the planner then finds the rows through the
    # primary key's index, whatever its estimate of the recordset (it would otherwise scan the
    # whole table to hash-join a small set).
    pk = f"{table}.{qn(opts.pk.column)}"
    sql = (
        f"UPDATE {table} SET {assignments} "  # noqa: S608
        f"FROM jsonb_to_recordset(%s::jsonb) AS v({types}) "
        f"WHERE {pk} = ANY(%s) AND {pk} = v.c0"
    )
    keys = [opts.pk.get_db_prep_value(obj.pk, connection) for obj in objs]
    with connection.cursor() as cursor:
        cursor.execute(sql, [document, keys])


def _update_each(
    objs: Sequence[models.Model], opts: Any, concrete: list[models.Field], connection: Any
) -> None:
    qn = connection.ops.quote_name
    assignments = ", ".join(f"{qn(field.column)} = %s" for field in concrete)
    sql = f"UPDATE {qn(opts.db_table)} SET {assignments} WHERE {qn(opts.pk.column)} = %s"  # noqa: S608
    rows = [
        [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in concrete]
        + [opts.pk.get_db_prep_value(obj.pk, connection)]
        for obj in objs
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


#: Internal field types whose values psycopg adapts itself, with the Python types it then
#: receives from the ORM unchanged (aware datetimes only; JSON always goes through the field).
_PASSTHROUGH = {
    "CharField": (str,),
    "TextField": (str,),
    "EmailField": (str,),
    "SlugField": (str,),
    "UUIDField": (uuid.UUID,),
    "BooleanField": (bool,),
    "IntegerField": (int,),
    "BigIntegerField": (int,),
    "SmallIntegerField": (int,),
    "PositiveIntegerField": (int,),
    "PositiveBigIntegerField": (int,),
    "PositiveSmallIntegerField": (int,),
    "AutoField": (int,),
    "BigAutoField": (int,),
    "DateTimeField": (datetime.datetime,),
    "DateField": (datetime.date,),
    "DecimalField": (decimal.Decimal,),
}


def _native_types(fields: list[models.Field]) -> list[tuple[type, ...]]:
    """Per field, the value types sent to psycopg as they are (PostgreSQL only)."""
    out = []
    for field in fields:
        target = field.target_field if field.is_relation else field
        out.append(_PASSTHROUGH.get(target.get_internal_type(), ()))
    return out


def insert_rows(
    model: type[models.Model], rows: Sequence[dict[str, Any]], *, using: str = "default"
) -> int:
    """``INSERT`` plain rows (field name or attname -> value; the other fields take their
    defaults, ``auto_now``/``auto_now_add`` fields the current time) without building model
    instances. For rows whose primary keys the caller does not need: nothing is returned.

    PostgreSQL: one ``COPY ... FROM STDIN`` (psycopg formats the rows in C; no SQL text to
    parse, no per-value escaping in Python). Other databases: one ``executemany``. Like
    ``bulk_create``, no signal is sent. Returns the number of rows."""
    if not rows:
        return 0
    opts = model._meta
    connection = connections[using]
    fields = [f for f in opts.concrete_fields if not (f.primary_key and f.db_returning)]
    by_key = {f.name: f for f in fields} | {f.attname: f for f in fields}
    unknown = {key for row in rows for key in row} - by_key.keys()
    if unknown:
        raise ValueError(f"{opts.label} has no field(s) {sorted(unknown)}")
    now = timezone.now()
    defaults: dict[str, Any] = {}
    for field in fields:
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            defaults[field.attname] = now
        else:
            defaults[field.attname] = field.get_default()
    native = _native_types(fields) if connection.vendor == "postgresql" else [()] * len(fields)
    values = []
    for row in rows:
        given = {**defaults, **{by_key[key].attname: value for key, value in row.items()}}
        line = []
        for field, types in zip(fields, native, strict=True):
            value = given[field.attname]
            if value is None or (type(value) in types and getattr(value, "tzinfo", 1) is not None):
                line.append(value)  # psycopg adapts it as the ORM would have
            else:
                line.append(field.get_db_prep_save(value, connection))
        values.append(line)
    qn = connection.ops.quote_name
    columns = ", ".join(qn(field.column) for field in fields)
    table = qn(opts.db_table)
    started = time.monotonic()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            sql = f"COPY {table} ({columns}) FROM STDIN"
            with cursor.copy(sql) as copy:
                for value in values:
                    copy.write_row(value)
        else:
            marks = ", ".join(["%s"] * len(fields))
            sql = f"INSERT INTO {table} ({columns}) VALUES ({marks})"  # noqa: S608
            cursor.executemany(sql, values)
    if connection.vendor == "postgresql" and connection.queries_logged:
        # COPY bypasses the cursor wrapper that logs queries; log it so query counts stay true.
        connection.queries_log.append(
            {"sql": f"{sql} -- {len(values)} rows", "time": f"{time.monotonic() - started:.3f}"}
        )
    return len(values)


#: How ``insert_ignoring_conflict`` prepares a column's value: what ``get_db_prep_save`` would
#: return, without its layers of calls where that is known: a str for a plain
#: CharField/TextField is itself; an aware datetime (or None) for a DateTimeField is what the
#: backend's adapter makes of it.
_TEXT, _DATETIME, _OTHER = "text", "datetime", "other"
_KINDS = {models.CharField: _TEXT, models.TextField: _TEXT, models.DateTimeField: _DATETIME}
_MISSING = object()


@dataclass(frozen=True)
class _Column:
    name: str  # the field's attname: the key in the values dict
    field: models.Field
    kind: str
    auto_now: bool  # an ``auto_now``/``auto_now_add`` field: the current time by default


@dataclass(frozen=True)
class _Statement:
    sql: str
    columns: list[_Column]


#: Per (model, database alias, conflict field, the keys of the values): the statement, or
#: None where the backend lacks ``ON CONFLICT ... RETURNING`` (the ORM is used there).
_STATEMENTS: dict[tuple[Any, ...], _Statement | None] = {}


def _on_conflict_returning(connection: BaseDatabaseWrapper) -> bool:
    """Whether the backend has ``INSERT ... ON CONFLICT DO NOTHING RETURNING``."""
    return connection.vendor in ("postgresql", "sqlite") and bool(
        connection.features.can_return_columns_from_insert
    )


def _literal(field: models.Field) -> str | None:
    """The SQL literal of a field's default when it is a constant with a trivially safe form
    (NULL, an integer, the empty string); None otherwise (the value is bound as a parameter)."""
    if not field.has_default() and not field.null:
        return None
    default = field.default if field.has_default() else None
    if callable(default):
        return None
    if default is None:
        return "NULL"
    if type(default) is int:
        return str(default)
    if default == "" and isinstance(default, str):
        return "''"
    return None


def _build_statement(
    model: type[models.Model], given: Iterable[str], conflict: str, connection: BaseDatabaseWrapper
) -> _Statement | None:
    """``INSERT ... ON CONFLICT (conflict) DO NOTHING RETURNING pk`` for every concrete field
    but an auto primary key: a parameter for each field in ``given`` and each field whose
    default is computed; the SQL literal of every other default."""
    if not _on_conflict_returning(connection):
        return None
    opts = model._meta
    fields = [f for f in opts.concrete_fields if not (f.primary_key and f.db_returning)]
    given = set(given)
    unknown = given - {f.attname for f in fields}
    if unknown:
        raise ValueError(f"{opts.label} has no field(s) {sorted(unknown)}")
    columns = []
    marks = []
    for f in fields:
        auto_now = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        literal = None if f.attname in given or auto_now else _literal(f)
        if literal is None:
            columns.append(_Column(f.attname, f, _KINDS.get(type(f), _OTHER), auto_now))
            marks.append("%s")
        else:  # a column this caller never sets, with a constant default: nothing to bind
            marks.append(literal)
    qn = connection.ops.quote_name
    # Identifiers from the model's metadata, quoted; values are parameters or the literals
    # of constant defaults (NULL, an integer, '').
    sql = (
        f"INSERT INTO {qn(opts.db_table)} ({', '.join(qn(f.column) for f in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(marks)}) "
        f"ON CONFLICT ({qn(opts.get_field(conflict).column)}) DO NOTHING "
        f"RETURNING {qn(opts.pk.column)}"
    )
    return _Statement(sql, columns)


def insert_ignoring_conflict(
    model: type[models.Model],
    values: dict[str, Any],
    *,
    conflict: str,
    using: str | None = None,
) -> Any | None:
    """``INSERT`` one row of ``model`` with these column values (attname -> value; the other
    fields get their default, ``auto_now``/``auto_now_add`` fields the current time) unless a
    row with the same value of the unique field ``conflict`` exists. Returns the new row's
    primary key, or None for such a duplicate.
    ``values`` is completed with the computed defaults written (``default=timezone.now``), so
    the caller can build the instance without reading the row back.

    PostgreSQL and SQLite: one ``INSERT ... ON CONFLICT (conflict) DO NOTHING RETURNING pk``
    with the values the ORM would write (each field's ``get_db_prep_save``); the statement is
    built once per model, database and set of keys, and no model instance is built. Other
    backends: ``save(force_insert=True)``, a duplicate caught as ``IntegrityError``. No model
    signal is sent on the first path. Inside a transaction the statement runs in a savepoint,
    so a failure leaves the caller's transaction usable.
    """
    if using is None:
        using = router.db_for_write(model)
    connection = connections[using]
    key = (model, using, conflict, tuple(values))
    try:
        statement = _STATEMENTS[key]
    except KeyError:
        statement = _STATEMENTS[key] = _build_statement(model, values, conflict, connection)
    savepoint = transaction.atomic(using=using) if connection.in_atomic_block else nullcontext()
    if statement is None:
        instance = model(**values)
        try:
            with savepoint:
                instance.save(force_insert=True, using=using)
        except IntegrityError:
            return None
        for f in model._meta.concrete_fields:  # what save() filled in
            if not f.primary_key:
                values.setdefault(f.attname, getattr(instance, f.attname))
        return instance.pk
    adapt_datetime = connection.ops.adapt_datetimefield_value
    params = []
    for column in statement.columns:
        kind = column.kind
        value = values.get(column.name, _MISSING)
        if value is _MISSING:
            value = values[column.name] = (
                timezone.now() if column.auto_now else column.field.get_default()
            )
        if kind is _TEXT and type(value) is str:
            pass
        elif kind is _DATETIME and (
            value is None or (type(value) is datetime.datetime and value.utcoffset() is not None)
        ):
            value = adapt_datetime(value)
        else:
            value = column.field.get_db_prep_save(value, connection)
        params.append(value)
    with savepoint, connection.cursor() as cursor:
        cursor.execute(statement.sql, params)
        row = cursor.fetchone()
    return row[0] if row is not None else None
