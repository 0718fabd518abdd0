"""Short statements of the provider write path run through the DB-API cursor.

Loading providers (POST provider, PUT inventories, aggregates, traits) runs a few
one-row statements per call.  SQLAlchemy's execution context costs about ten times
the database's own work for such a statement (about 40 us of CPU against 4 us for a
provider's look-up by uuid on SQLite), so these statements are compiled once per
dialect by SQLAlchemy and then handed to the driver's cursor of the same connection,
inside SQLAlchemy's transaction.  The driver's errors are wrapped as SQLAlchemy's
(``IntegrityError``, ``OperationalError``, ...) so the app answers them as before.

Only statements with plain bound parameters (no expanding ``IN`` lists), returning
numbers and strings that need no result processing, belong here.  The driver's
statements do not pass SQLAlchemy's ``before_cursor_execute`` events.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, cast

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

Parameters = Mapping[str, Any]


@functools.lru_cache(maxsize=64)
def _compiled(statement: ClauseElement, dialect: Dialect) -> Tuple[str, Callable[[Parameters], Any]]:
    """The statement's SQL in ``dialect`` and how to turn named parameters into the driver's."""
    compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
    if compiled.positional:
        names = tuple(compiled.positiontup or ())
        return compiled.string, lambda params: tuple(params[name] for name in names)
    return compiled.string, dict


def _cursor_call(connection: Connection, statement: ClauseElement, run: Callable[[Any, str], Any]) -> Any:
    sql, _convert = _compiled(statement, connection.dialect)
    cursor = connection.connection.cursor()
    try:
        return run(cursor, sql)
    except connection.dialect.loaded_dbapi.Error as error:
        raise exc.DBAPIError.instance(sql, None, error, connection.dialect.loaded_dbapi.Error) from error
    finally:
        cursor.close()


def execute(connection: Connection, statement: ClauseElement, params: Parameters) -> int:
    """Run ``statement`` with ``params``; the number of rows it changed."""
    convert = _compiled(statement, connection.dialect)[1]

    def run(cursor: Any, sql: str) -> int:
        cursor.execute(sql, convert(params))
        return int(cursor.rowcount)

    return int(_cursor_call(connection, statement, run))


def execute_many(connection: Connection, statement: ClauseElement, rows: Sequence[Parameters]) -> None:
    """Run ``statement`` once per parameter set in ``rows`` (one ``executemany``)."""
    convert = _compiled(statement, connection.dialect)[1]
    _cursor_call(connection, statement, lambda cursor, sql: cursor.executemany(sql, [convert(row) for row in rows]))


def fetch_all(connection: Connection, statement: ClauseElement, params: Parameters) -> Sequence[Tuple[Any, ...]]:
    """Every row of ``statement`` as plain tuples."""
    convert = _compiled(statement, connection.dialect)[1]

    def run(cursor: Any, sql: str) -> Sequence[Tuple[Any, ...]]:
        cursor.execute(sql, convert(params))
        return list(cursor.fetchall())

    rows: Sequence[Tuple[Any, ...]] = _cursor_call(connection, statement, run)
    return rows


def fetch_one(connection: Connection, statement: ClauseElement, params: Parameters) -> Optional[Tuple[Any, ...]]:
    """The first row of ``statement``, or None."""
    rows = fetch_all(connection, statement, params)
    return rows[0] if rows else None


def insert_id(connection: Connection, statement: ClauseElement, params: Parameters) -> int:
    """Run the one-row INSERT ``statement``; the key the database gave the row
    (``cursor.lastrowid``: for a database without ``INSERT ... RETURNING``, MySQL)."""
    convert = _compiled(statement, connection.dialect)[1]

    def run(cursor: Any, sql: str) -> int:
        cursor.execute(sql, convert(params))
        return int(cursor.lastrowid)

    return int(_cursor_call(connection, statement, run))
