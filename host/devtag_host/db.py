"""Engines, transactions and schema upgrades shared by placement and attach.

One ``Store`` per process wraps the engines.  Write transactions on SQLite are
``BEGIN IMMEDIATE`` (one writer at a time, no lock upgrade deadlocks); on
PostgreSQL they run at READ COMMITTED and the callers rely on compare-and-swap
(``UPDATE ... WHERE generation = :seen``) or row locks for safety.

Placement and attach may share one database: each has its own Alembic
directory and version table, and :func:`upgrade` runs either.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ArgumentError

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


def _normalize_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Store:
    """One database: its engines and transactions."""

    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = _normalize_url(url)
        if self.url.startswith("sqlite"):
            self.dialect = "sqlite"
            self.writer = _sqlite_engine(self.url, immediate=True)
            self.reader = _sqlite_engine(self.url, immediate=False)
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
            f"{what}: not a database URL ({words}): give sqlite:////ABSOLUTE/PATH.sqlite or postgresql://USER@HOST/DB"
        )
    if "file is not a database" in words:
        return InputError(f"{what}: the file is not a SQLite database: give devtag's own database or a new file")
    return RuntimeFailure(f"{what}: {words}")
