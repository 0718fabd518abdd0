"""Placement's tables and where its database lives.

The engines and transactions are :class:`devtag_host.db.Store`; placement's
writers on PostgreSQL rely on the compare-and-swap of a provider's
``generation`` (``UPDATE ... WHERE generation = :seen``) for safety.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import os_resource_classes
import os_traits
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Double,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import SQLAlchemyError

from .. import db
from ..db import failure
from ..errors import InputError, RuntimeFailure
from ..state import state_dir

DEFAULT_DB_ENV = "DEVTAG_PLACEMENT_DB"
MAX_INT = 2147483647


def fits_nowhere(amounts: Dict[str, int]) -> bool:
    """An amount above any inventory's ``max_unit`` (at most ``MAX_INT``): no
    provider can take it, which is upstream's answer on its databases.  Said
    before any SQL, whose integer columns cannot hold such a number."""
    return any(amount > MAX_INT for amount in amounts.values())


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
    Column("allocation_ratio", Float().with_variant(Double(), "mysql"), nullable=False),
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


# One row (id 1): a number that changes, in the same transaction, with every write of
# what allocation candidates read besides usage (providers, their tree, inventories
# but ``used``, traits, aggregates, trait and class names).  Database triggers keep it
# (migration 0005), whichever code or process writes; objects/static_world.py keeps
# those rows in memory between requests while the number stays the same.
static_changes = Table(
    "placement_static_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("stamp", BigInteger, nullable=False),
)


def mysql_table_options(dialect: Dialect) -> Dict[str, Any]:
    """The options of every placement table on MariaDB/MySQL: InnoDB (transactions, row
    locks; the only engine Galera replicates), 4-byte UTF-8, and a binary collation, so
    that names compare as on SQLite and PostgreSQL (case and, on MariaDB, trailing
    spaces count).  Other dialects: none."""
    if dialect.name != "mysql":
        return {}
    collation = "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}


def default_url() -> str:
    """``$DEVTAG_PLACEMENT_DB``, else the SQLite file ``placement.sqlite`` in :func:`state_dir`.

    That is /var/lib/devtag for root (a service's state, not root's home), else
    ``$XDG_DATA_HOME/devtag`` (``$DEVTAG_STATE_DIR`` moves both), as for the
    embedded libvirt root and the attachment store.
    """
    configured = os.environ.get(DEFAULT_DB_ENV)
    if configured:
        return configured
    return f"sqlite:///{state_dir() / 'placement.sqlite'}"


class Store(db.Store):
    """The database of one placement service (default: :func:`default_url`)."""

    def __init__(self, url: Optional[str] = None, pool_size: int = 10) -> None:
        super().__init__(url or default_url(), pool_size)


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


def check_writable(url: Optional[str]) -> None:
    """Fail in one line, before serving, where the database has no schema (bad input) or
    cannot be written (a read-only file, directory or file system; a read-only
    PostgreSQL): every request, or every write, would fail."""
    store = Store(url)
    try:
        if db.current_revision(store) is None:
            raise InputError("the placement database has no schema: run 'devtag-host placement db-sync' first")
        with store.write() as connection:
            if store.dialect == "sqlite":  # a write that changes nothing: the same number in the file's header
                version = connection.exec_driver_sql("PRAGMA user_version").scalar()
                connection.exec_driver_sql(f"PRAGMA user_version = {int(version or 0)}")
            elif store.dialect == "postgresql":
                read_only = connection.exec_driver_sql("SHOW transaction_read_only").scalar() == "on"
                if read_only:
                    raise RuntimeFailure("the placement database cannot be written: the server is read-only")
    except SQLAlchemyError as exc:
        raise failure(exc, "the placement database cannot be written") from None
    finally:
        store.dispose()
