"""Tables, engines and transactions.

One ``Store`` per process wraps the engines.  Write transactions on SQLite are
``BEGIN IMMEDIATE`` (one writer at a time, no lock upgrade deadlocks); on
PostgreSQL they run at READ COMMITTED and rely on the compare-and-swap of a
provider's ``generation`` (``UPDATE ... WHERE generation = :seen``) for safety.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional

import os_resource_classes
import os_traits
from sqlalchemy import (
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Connection, Engine

DEFAULT_DB_ENV = "DEVTAG_PLACEMENT_DB"
MAX_INT = 2147483647

metadata = MetaData()

resource_classes = Table(
    "resource_classes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
)

traits = Table(
    "traits",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
)

resource_providers = Table(
    "resource_providers",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("uuid", String(36), nullable=False, unique=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("generation", Integer, nullable=False, default=0),
    Column("parent_provider_id", Integer, ForeignKey("resource_providers.id"), nullable=True, index=True),
    Column("root_provider_id", Integer, ForeignKey("resource_providers.id"), nullable=True, index=True),
    Column("created_at", DateTime, server_default=func.now()),
    Column("updated_at", DateTime, server_default=func.now(), onupdate=func.now()),
)

inventories = Table(
    "inventories",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("resource_provider_id", Integer, ForeignKey("resource_providers.id"), nullable=False),
    Column("resource_class_id", Integer, ForeignKey("resource_classes.id"), nullable=False),
    Column("total", Integer, nullable=False),
    Column("reserved", Integer, nullable=False),
    Column("min_unit", Integer, nullable=False),
    Column("max_unit", Integer, nullable=False),
    Column("step_size", Integer, nullable=False),
    Column("allocation_ratio", Float, nullable=False),
    # The sum of the allocations against this row, kept by every allocation write in
    # the same transaction (objects/allocation.py).  Capacity queries then read one
    # row instead of summing allocations per inventory: allocation candidates no
    # longer slow down as allocations pile up.
    Column("used", Integer, nullable=False, server_default="0"),
    UniqueConstraint("resource_provider_id", "resource_class_id", name="uniq_inventories0rp0rc"),
    Index("inventories_rc_idx", "resource_class_id", "resource_provider_id"),
    # Covering: allocation candidates read the capacity columns from the index alone.
    Index(
        "inventories_capacity_idx",
        "resource_provider_id",
        "resource_class_id",
        "total",
        "reserved",
        "allocation_ratio",
        "min_unit",
        "max_unit",
        "step_size",
        "used",
    ),
)

consumers = Table(
    "consumers",
    metadata,
    Column("uuid", String(36), primary_key=True),
    Column("project_id", String(255), nullable=True, index=True),
    Column("user_id", String(255), nullable=True),
)

allocations = Table(
    "allocations",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("resource_provider_id", Integer, ForeignKey("resource_providers.id"), nullable=False),
    Column("consumer_id", String(36), nullable=False),
    Column("resource_class_id", Integer, ForeignKey("resource_classes.id"), nullable=False),
    Column("used", Integer, nullable=False),
    Index("allocations_rp_rc_idx", "resource_provider_id", "resource_class_id"),
    Index("allocations_consumer_idx", "consumer_id"),
)

provider_aggregates = Table(
    "resource_provider_aggregates",
    metadata,
    Column("resource_provider_id", Integer, ForeignKey("resource_providers.id"), primary_key=True),
    Column("aggregate_uuid", String(36), primary_key=True),
    Index("rp_aggregates_agg_idx", "aggregate_uuid"),
)

provider_traits = Table(
    "resource_provider_traits",
    metadata,
    Column("resource_provider_id", Integer, ForeignKey("resource_providers.id"), primary_key=True),
    Column("trait_id", Integer, ForeignKey("traits.id"), primary_key=True),
    Index("rp_traits_trait_idx", "trait_id"),
)


def default_url() -> str:
    """``$DEVTAG_PLACEMENT_DB``, else a SQLite file under ~/.local/share/devtag."""
    configured = os.environ.get(DEFAULT_DB_ENV)
    if configured:
        return configured
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return f"sqlite:///{os.path.join(data_home, 'devtag', 'placement.sqlite')}"


def _sqlite_engine(url: str, immediate: bool) -> Engine:
    database = url.split("///", 1)[1] if "///" in url else ""
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    # Pooled: closing the last connection to a WAL database checkpoints it (milliseconds).
    engine = create_engine(url, pool_size=8, max_overflow=32, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):  # type: ignore[no-untyped-def]
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _normalize_url(url: str) -> str:
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Store:
    """The database of one placement service: engines and transactions."""

    def __init__(self, url: Optional[str] = None, pool_size: int = 10) -> None:
        self.url = _normalize_url(url or default_url())
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


def insert_missing_names(connection: Connection, table: Table, names: list) -> None:
    """Insert the ``names`` not yet in ``table`` (standard traits and classes)."""
    have = set(connection.scalars(select(table.c.name)))
    missing = [{"name": name} for name in names if name not in have]
    if missing:
        connection.execute(table.insert(), missing)


def sync_standard_names(store: Store) -> None:
    """Make sure every os-traits trait and os-resource-classes class exists."""
    with store.write() as connection:
        insert_missing_names(connection, resource_classes, list(os_resource_classes.STANDARDS))
        insert_missing_names(connection, traits, list(os_traits.get_traits()))
