"""Reading many rows cheaply: constant statements through the DB-API cursor, and
integer columns aggregated into one comma-joined string per row.

Allocation candidates read thousands of rows per request; SQLAlchemy's result layer
and one driver row per value cost more than the database's own work there."""

from __future__ import annotations

import functools
from typing import Any, List, Sequence

from sqlalchemy import String, cast, func, literal_column
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.expression import ClauseElement, ColumnElement


def joined_ids(column: ColumnElement[int], dialect: str) -> ColumnElement[str]:
    """SQL: the aggregate of the integer ``column`` as one comma-joined string.  A few
    such rows cost the driver far less than one row per value (the sqlite3 module,
    for one, releases and takes back the GIL around every row); the separator is SQL
    text, so statements with it can run without parameters."""
    comma: ColumnElement[str] = literal_column("','")
    if dialect == "postgresql":
        return func.string_agg(cast(column, String), comma)
    if dialect == "mysql":  # GROUP_CONCAT(a, b) concatenates a and b; ',' is its separator
        return func.group_concat(column)
    return func.group_concat(column, comma)


def split_ids(joined: str) -> List[int]:
    return list(map(int, joined.split(",")))


@functools.lru_cache(maxsize=64)
def _sql_of(statement: ClauseElement, dialect: Dialect) -> str:
    return str(statement.compile(dialect=dialect))


def fetch_all(connection: Connection, statement: ClauseElement) -> Sequence[Any]:
    """Every row of ``statement`` (a constant without parameters that returns only
    numbers and strings) as plain tuples, read through the DB-API cursor of
    ``connection``, in its transaction.  SQLAlchemy's result layer costs about a fifth
    of reading thousands of rows, and the driver's values need no processing here."""
    cursor = connection.connection.cursor()
    try:
        cursor.execute(_sql_of(statement, connection.dialect))
        return cursor.fetchall()
    finally:
        cursor.close()
