"""Engines, transactions and schema upgrades shared by placement and attach.

One ``Store`` per process wraps the engines.  Write transactions on SQLite are
``BEGIN IMMEDIATE`` (one writer at a time, no lock upgrade deadlocks); on
PostgreSQL and MariaDB/MySQL (InnoDB) they run at READ COMMITTED and the callers
rely on compare-and-swap (``UPDATE ... WHERE generation = :seen``) or row locks for
safety.  InnoDB answers a deadlock or a lock wait that timed out by rolling the
transaction back (:func:`is_retryable` tells them apart from other errors): the
caller runs it again.

Placement and attach may share one database: each has its own Alembic
directory and version table, and :func:`upgrade` runs either.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from .errors import DevtagError, InputError, RuntimeFailure
from .state import make_private_dirs, state_dir

DEFAULT_VERSION_TABLE = "alembic_version"


def _sqlite_engine(url: str, immediate: bool) -> Engine:
    database = url.split("///", 1)[1] if "///" in url else ""
    if database and database != ":memory:":
        create_private_file(Path(database))
    # Pooled: closing the last connection to a WAL database checkpoints it (milliseconds).
    engine = create_engine(url, pool_size=8, max_overflow=32, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def create_private_file(database: Path) -> None:
    """Create the SQLite file ``database`` readable by its owner only, whatever the umask: it
    holds what other users must not read (volume connection details, the placement of every
    instance).  SQLite gives its -wal and -shm files the same mode.  An existing file keeps
    its mode (the operator's choice).

    The path must be absolute.  Its directory is created only inside devtag's state
    directory (:func:`~devtag_host.state.state_dir`, made on first use); another missing
    directory is refused (a typo would otherwise put the database where nobody looks).
    """
    if not database.is_absolute():
        raise InputError(
            f"the SQLite database {str(database)!r} is not an absolute path: give sqlite:////ABSOLUTE/PATH.sqlite"
        )
    directory = database.parent
    try:
        missing = not directory.is_dir()
        if missing and _inside(directory, state_dir()):
            make_private_dirs(directory)
    except OSError as exc:  # a directory on the way this user may not enter, a file system refusing it
        raise RuntimeFailure(f"cannot create the directory {directory}: {_reason(exc)}") from None
    if missing and not directory.is_dir():
        raise InputError(f"the directory {directory} of the SQLite database {database} does not exist")
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeFailure(f"cannot create the SQLite database {database}: {_reason(exc)}") from None


def _inside(path: Path, directory: Path) -> bool:
    resolved, base = Path(os.path.abspath(path)), Path(os.path.abspath(directory))
    return resolved == base or base in resolved.parents


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# MySQL's and MariaDB's codes: a deadlock (InnoDB's, or Galera's certification failure,
# reported at commit), a lock wait that timed out; both roll the transaction back.
MYSQL_RETRYABLE = frozenset({1213, 1205})
_RETRYABLE_WORDS = ("deadlock detected", "could not serialize")  # PostgreSQL's
_BUSY_WORDS = ("database is locked", "lock timeout")  # SQLite's busy file, PostgreSQL's lock_timeout


def _message(error: DBAPIError) -> str:
    return str(getattr(error, "orig", None) or error).lower()


def is_retryable(error: DBAPIError) -> bool:
    """Whether the database rolled ``error``'s transaction back for another one's sake
    (a deadlock, a lock wait timed out, a serialization or certification failure):
    the same transaction may well succeed when run again."""
    arguments: Tuple[Any, ...] = tuple(getattr(getattr(error, "orig", None), "args", ()))
    if arguments and isinstance(arguments[0], int):  # PyMySQL: (code, message)
        return arguments[0] in MYSQL_RETRYABLE
    return any(word in _message(error) for word in _RETRYABLE_WORDS)


# MySQL's and MariaDB's client codes: no server at the address, the server gone away or the
# connection lost during a query (a node stopped or killed); and a Galera node cut off from
# the cluster's majority (1047: "WSREP has not yet prepared node for application use").
MYSQL_UNREACHABLE = frozenset({2002, 2003, 2006, 2013, 1047})


def is_unreachable(error: DBAPIError) -> bool:
    """Whether ``error`` is the database server being out of reach (not a wrong statement):
    SQLAlchemy saw the connection drop, or the server could not be connected to."""
    if error.connection_invalidated:
        return True
    arguments: Tuple[Any, ...] = tuple(getattr(getattr(error, "orig", None), "args", ()))
    return bool(arguments) and arguments[0] in MYSQL_UNREACHABLE


def is_busy(error: DBAPIError) -> bool:
    """Whether ``error`` says the database was too busy to wait for (tell the client to retry)."""
    return any(word in _message(error) for word in _BUSY_WORDS)


def _normalize_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("mariadb"):  # the same dialect, named "mysql" wherever devtag asks
        url = "mysql" + url[len("mariadb") :]
    if url.startswith("mysql://"):
        url = "mysql+pymysql://" + url.split("://", 1)[1]
    if url.startswith("mysql"):
        parsed = make_url(url)
        if "charset" not in parsed.query:  # 4-byte characters (emoji) in names
            return parsed.update_query_dict({"charset": "utf8mb4"}).render_as_string(hide_password=False)
    return url


def _mysql_engine(url: str, pool_size: int) -> Engine:
    """MariaDB or MySQL (InnoDB): READ COMMITTED, as on PostgreSQL (a writer that waited
    for a row lock reads what the writer before it committed), strict SQL, connections
    checked before use and renewed before the server's ``wait_timeout`` drops them."""
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=20,
        pool_pre_ping=True,
        pool_recycle=3600,
        isolation_level="READ COMMITTED",
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # TRADITIONAL: bad values are errors, not warnings; GROUP_CONCAT's default
        # limit (1 MB on MariaDB, 1 KB on MySQL) would cut a long list of ids short.
        cursor.execute("SET SESSION sql_mode = 'TRADITIONAL', group_concat_max_len = 4294967295")
        # On a Galera node: reads wait until the node has applied every write the cluster
        # committed before them (a write through one node is read through another at once),
        # unless the operator set wsrep_sync_wait on the server already.
        cursor.execute("SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_sync_wait')")
        found = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
        if found.get("wsrep_on", "OFF").upper() == "ON" and found.get("wsrep_sync_wait", "0") == "0":
            cursor.execute("SET SESSION wsrep_sync_wait = 1")
        cursor.close()

    return engine


class Store:
    """One database: its engines and transactions."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = _normalize_url(url)
        if self.url.startswith("sqlite"):
            self.dialect = "sqlite"
            self.writer = _sqlite_engine(self.url, immediate=True)
            self.reader = _sqlite_engine(self.url, immediate=False)
        elif self.url.startswith("mysql"):
            self.dialect = "mysql"
            self.writer = _mysql_engine(self.url, pool_size)
            self.reader = self.writer
        else:
            self.dialect = "postgresql"
            self.writer = create_engine(self.url, pool_size=pool_size, max_overflow=20, pool_pre_ping=True)
            self.reader = self.writer

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction: committed on success, rolled back on error."""
        with self.writer.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.reader.begin() as connection:
            yield connection

    def dispose(self) -> None:
        self.writer.dispose()
        if self.reader is not self.writer:
            self.reader.dispose()


def upgrade(store: Store, versions: Path, version_table: str = DEFAULT_VERSION_TABLE, revision: str = "head") -> None:
    """Run the Alembic migrations in directory ``versions`` up to ``revision``, in one write transaction.

    The migrations' ``env.py`` finds the connection and the version table in
    ``config.attributes`` (``connection``, ``version_table``).
    """
    # Alembic loads only here: importing it costs devtag-host's start a second on a busy host.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(versions))
    config.attributes["version_table"] = version_table
    with store.write() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(store: Store, version_table: str = DEFAULT_VERSION_TABLE) -> Optional[str]:
    """The revision recorded in ``version_table`` (None: never migrated)."""
    from alembic.runtime.migration import MigrationContext

    with store.read() as connection:
        return MigrationContext.configure(connection, opts={"version_table": version_table}).get_current_revision()


_BACKGROUND = re.compile(r"\s*\(Background on this error at: \S+\)")


def error_line(exc: BaseException) -> str:
    """A database error in one line, in its driver's words: SQLAlchemy's wrapper, the
    statement and parameters and the "Background on this error" link left out."""
    original = getattr(exc, "orig", None)
    text = str(original if original is not None else exc)
    return " ".join(_BACKGROUND.sub("", text).split())[:500] or type(exc).__name__


def failure(exc: Exception, what: str) -> DevtagError:
    """A database error as the kind of failure it is, in one line after ``what``: bad input
    (a --db that is not a database URL; a file that is not a SQLite database), else a
    runtime failure (unreachable, read-only, ...)."""
    words = error_line(exc)
    if isinstance(exc, ArgumentError):
        return InputError(
            f"{what}: not a database URL ({words}): give sqlite:////ABSOLUTE/PATH.sqlite, postgresql://USER@HOST/DB or mysql+pymysql://USER:PASS@HOST/DB"
        )
    if "file is not a database" in words:
        return InputError(f"{what}: the file is not a SQLite database: give devtag's own database or a new file")
    return RuntimeFailure(f"{what}: {words}")
