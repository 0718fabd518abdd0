"""``placement import`` and ``placement export``: copy placement's state between a
database of OpenStack Placement's own service and devtag's, each in one transaction.

Upstream's tables are reflected (SQLAlchemy Core), never described here: what a
table must hold is :data:`schema.TABLES`.  An export creates upstream's
schema with upstream's own code (its Alembic migrations and its start-up sync of
standard traits and resource classes) in a child process: openstack-placement
configures its database engine once per process.
"""

from __future__ import annotations

import datetime
import importlib.util
import os.path
import subprocess
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from sqlalchemy import MetaData, Table, bindparam, create_engine, func, inspect, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from ...errors import InputError, RuntimeFailure
from .. import schema_upgrade
from ..db import (
    Store,
    allocations,
    inventories,
    provider_aggregates,
    provider_traits,
    resource_classes,
    resource_providers,
    traits,
)
from ..objects.consumer import consumer_types, consumers
from . import schema
from .schema import World

Progress = Callable[[str, int], None]  # (what, how many rows), once per table written

_BACKENDS = ("sqlite", "postgresql", "mysql")


def _engine(url: str, option: str) -> Engine:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        parsed = None
    if parsed is None or parsed.get_backend_name() not in _BACKENDS:
        raise InputError(
            f"{option} {url!r} is not a database URL (sqlite:////PATH, mysql+pymysql://..., postgresql://...)"
        )
    # The drivers devtag's host extra installs, for URLs that name none.
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername == "mysql":
        parsed = parsed.set(drivername="mysql+pymysql")
    try:
        return create_engine(parsed, poolclass=NullPool)
    except ImportError as exc:
        raise RuntimeFailure(f"{option}: no database driver for {parsed.drivername} ({exc})") from None


def _where(option: str, engine: Engine) -> str:
    return f"{option} {engine.url.render_as_string(hide_password=True)}"


def _sqlite_file_missing(engine: Engine) -> bool:
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return False
    return not os.path.exists(database)


def _reflect(connection: Connection) -> MetaData:
    metadata = MetaData()
    metadata.reflect(bind=connection)
    return metadata


def _revision(connection: Connection, metadata: MetaData) -> Optional[str]:
    table = metadata.tables.get("alembic_version")
    if table is None or "version_num" not in table.c:
        return None
    found = list(connection.scalars(select(table.c.version_num)))
    return found[0] if len(found) == 1 else (",".join(found) or None)


def _checked_upstream(connection: Connection, where: str) -> MetaData:
    metadata = _reflect(connection)
    columns = {name: set(table.c.keys()) for name, table in metadata.tables.items()}
    schema.check_source(columns, _revision(connection, metadata), where)
    return metadata


def _rows(connection: Connection, table: Table, columns: Sequence[str]) -> List[Dict[str, Any]]:
    query = select(*(table.c[name] for name in columns)).order_by(*table.primary_key.columns)
    result = connection.execute(query)
    keys = list(result.keys())
    return [dict(zip(keys, row)) for row in result]


def read_upstream(url: str, option: str = "--from", before_reading: Callable[[], None] = lambda: None) -> World:
    """The state of upstream's database ``url``; InputError if it is not upstream's schema at its head.
    ``before_reading`` runs once the schema is checked, before the rows are read."""
    engine = _engine(url, option)
    where = _where(option, engine)
    if _sqlite_file_missing(engine):
        raise InputError(f"{where}: no such file")
    try:
        with engine.connect() as connection:
            metadata = _checked_upstream(connection, where)
        before_reading()
        with engine.connect() as connection:
            if connection.dialect.name == "sqlite":  # pysqlite begins no transaction for a SELECT
                connection.exec_driver_sql("BEGIN")
            tables = {  # one transaction: one snapshot of the source
                name: _rows(connection, metadata.tables[name], columns) for name, columns in schema.TABLES.items()
            }
    except SQLAlchemyError as exc:
        raise RuntimeFailure(f"cannot read {where}: {exc}") from None
    finally:
        engine.dispose()
    try:
        return schema.world_from_upstream(tables)
    except KeyError as exc:
        raise InputError(f"{where} refers to a row that does not exist (id {exc})") from None


# --- into devtag -------------------------------------------------------------------------------


def _names(connection: Connection, table: Table, names: Sequence[str]) -> Dict[str, int]:
    """Insert the ``names`` not in ``table`` (in the given order); {name: id} of all."""
    have = {row.name: row.id for row in connection.execute(select(table.c.name, table.c.id))}
    missing = [{"name": name} for name in dict.fromkeys(names) if name not in have]
    if missing:
        connection.execute(table.insert(), missing)
        have = {row.name: row.id for row in connection.execute(select(table.c.name, table.c.id))}
    return have


def import_from(store: Store, url: str, progress: Progress, option: str = "--from") -> World:
    """Copy upstream's database ``url`` into devtag's ``store`` (migrated first), which must
    hold no provider: both checked before a row is read; the state copied."""

    def empty_target() -> None:
        schema_upgrade.upgrade(store)
        with store.read() as connection:
            _refuse_providers(connection)

    world = read_upstream(url, option, before_reading=empty_target)
    with store.write() as connection:
        _refuse_providers(connection)
        _write_devtag(connection, world, progress)
    return world


def _refuse_providers(connection: Connection) -> None:
    if connection.scalar(select(func.count()).select_from(resource_providers)):
        raise InputError("--db already holds resource providers: import into an empty placement database")


def _write_devtag(connection: Connection, world: World, progress: Progress) -> None:
    counts = world.counts()
    classes = _names(connection, resource_classes, world.resource_classes)
    progress("resource classes", counts["resource classes"])
    trait_ids = _names(connection, traits, world.traits)
    progress("traits", counts["traits"])
    if world.providers:
        connection.execute(
            resource_providers.insert(),
            [{"uuid": p.uuid, "name": p.name, "generation": p.generation} for p in world.providers],
        )
    ids = {row.uuid: row.id for row in connection.execute(select(resource_providers.c.uuid, resource_providers.c.id))}
    tree = resource_providers.update().where(resource_providers.c.id == bindparam("b_id"))
    if world.providers:
        connection.execute(
            tree.values(parent_provider_id=bindparam("b_parent"), root_provider_id=bindparam("b_root")),
            [
                {"b_id": ids[p.uuid], "b_parent": ids[p.parent] if p.parent else None, "b_root": ids[p.root]}
                for p in world.providers
            ],
        )
    progress("resource providers", counts["resource providers"])
    used = schema.used_by_inventory(world.allocations)
    _insert(
        connection,
        inventories,
        [
            {
                "resource_provider_id": ids[row.provider],
                "resource_class_id": classes[row.resource_class],
                **{name: getattr(row, name) for name in schema.TABLES["inventories"][3:]},
                "used": used.get((row.provider, row.resource_class), 0),
            }
            for row in world.inventories
        ],
    )
    progress("inventories", counts["inventories"])
    _insert(
        connection,
        provider_aggregates,
        [{"resource_provider_id": ids[p], "aggregate_uuid": aggregate} for p, aggregate in world.aggregates],
    )
    progress("aggregate memberships", counts["aggregate memberships"])
    _insert(
        connection,
        provider_traits,
        [{"resource_provider_id": ids[p], "trait_id": trait_ids[trait]} for p, trait in world.provider_traits],
    )
    progress("provider traits", counts["provider traits"])
    progress("projects", counts["projects"])
    progress("users", counts["users"])
    types = _names(connection, consumer_types, world.consumer_types)
    progress("consumer types", counts["consumer types"])
    _insert(
        connection,
        consumers,
        [
            {
                "uuid": row.uuid,
                "project_id": row.project,
                "user_id": row.user,
                "generation": row.generation,
                "consumer_type_id": types[row.consumer_type] if row.consumer_type else None,
            }
            for row in world.consumers
        ],
    )
    progress("consumers", counts["consumers"])
    _insert(
        connection,
        allocations,
        [
            {
                "resource_provider_id": ids[row.provider],
                "consumer_id": row.consumer,
                "resource_class_id": classes[row.resource_class],
                "used": row.used,
            }
            for row in world.allocations
        ],
    )
    progress("allocations", counts["allocations"])


def _insert(connection: Connection, table: Table, rows: List[Dict[str, Any]]) -> None:
    if rows:
        connection.execute(table.insert(), rows)


# --- out of devtag ------------------------------------------------------------------------------

_DEVTAG_TABLES: Mapping[str, Table] = {
    table.name: table
    for table in (
        resource_classes,
        traits,
        resource_providers,
        inventories,
        provider_aggregates,
        provider_traits,
        consumer_types,
        consumers,
        allocations,
    )
}


def read_devtag(store: Store) -> World:
    """The state of devtag's database ``store`` (upgraded first, as ``serve`` does)."""
    if schema_upgrade.current_revision(store) is None:
        raise InputError("--db holds no devtag placement database (run db-sync, or give --db)")
    schema_upgrade.upgrade(store)
    with store.read() as connection:
        tables = {name: _rows(connection, table, list(table.c.keys())) for name, table in _DEVTAG_TABLES.items()}
    return schema.world_from_devtag(tables)


# Upstream's own schema creation, run as its service does at start-up: migrations to the
# head, then its sync of os-traits and os-resource-classes (standard classes keep their ids).
_UPSTREAM_SYNC = """\
import sys
from oslo_config import cfg
from placement import conf, db_api, deploy
config = cfg.ConfigOpts()
conf.register_opts(config)
config.set_override("connection", sys.stdin.read(), group="placement_database")
config.set_override("sync_on_startup", True, group="placement_database")
config([], project="placement", default_config_files=[], default_config_dirs=[])
db_api.configure(config)
deploy.update_database(config)
"""


def upstream_installed() -> bool:
    return importlib.util.find_spec("placement") is not None


def create_upstream_schema(url: str, where: str) -> None:
    """Create upstream's schema in ``url`` with the installed openstack-placement."""
    # This interpreter and fixed code; the URL on stdin, not on a command line others may read.
    done = subprocess.run(
        [sys.executable, "-c", _UPSTREAM_SYNC], input=url, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise RuntimeFailure(f"openstack-placement could not create its schema in {where}: {lines[-1]}")


def export_store(store: Store, url: str, progress: Progress, option: str = "--to") -> World:
    """Write the state of devtag's ``store`` into the empty database ``url`` in upstream's
    schema at its head; the state written."""
    engine = _engine(url, option)
    where = _where(option, engine)
    try:
        if not upstream_installed():
            raise InputError(
                "export needs OpenStack Placement's own migrations: install openstack-placement "
                "(pip install openstack-placement) beside devtag"
            )
        with engine.connect() as connection:
            present = sorted(inspect(connection).get_table_names())
        if present:
            raise InputError(f"{where} is not empty (it has table {present[0]}): export into an empty database")
        world = read_devtag(store)
        create_upstream_schema(engine.url.render_as_string(hide_password=False), where)
        with engine.begin() as connection:
            metadata = _checked_upstream(connection, where)
            _write_upstream(connection, metadata.tables, world, progress)
    except SQLAlchemyError as exc:
        raise RuntimeFailure(f"cannot write {where}: {exc}") from None
    finally:
        engine.dispose()
    return world


def _stamped(table: Table, rows: List[Dict[str, Any]], now: datetime.datetime) -> List[Dict[str, Any]]:
    """Upstream answers Last-Modified from created_at: every row gets one."""
    if "created_at" not in table.c:
        return rows
    return [{**row, "created_at": now} for row in rows]


def _by_key(connection: Connection, table: Table, key: str) -> Dict[str, int]:
    return {row[0]: row[1] for row in connection.execute(select(table.c[key], table.c.id))}


def _write_upstream(connection: Connection, tables: Mapping[str, Table], world: World, progress: Progress) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    counts = world.counts()

    def insert(name: str, rows: List[Dict[str, Any]]) -> None:
        if rows:
            connection.execute(tables[name].insert(), _stamped(tables[name], rows, now))

    def named(name: str, key: str, values: Sequence[str]) -> Dict[str, int]:
        have = _by_key(connection, tables[name], key)
        insert(name, [{key: value} for value in dict.fromkeys(values) if value not in have])
        return _by_key(connection, tables[name], key)

    classes = _by_key(connection, tables["resource_classes"], "name")
    new_classes = schema.custom_class_ids(world.resource_classes, classes)
    insert("resource_classes", [{"id": id_, "name": name} for name, id_ in new_classes.items()])
    classes.update(new_classes)
    progress("resource classes", counts["resource classes"])
    trait_ids = named("traits", "name", world.traits)
    progress("traits", counts["traits"])
    providers = tables["resource_providers"]
    insert(
        "resource_providers", [{"uuid": p.uuid, "name": p.name, "generation": p.generation} for p in world.providers]
    )
    ids = _by_key(connection, providers, "uuid")
    if world.providers:
        connection.execute(
            providers.update()
            .where(providers.c.id == bindparam("b_id"))
            .values(parent_provider_id=bindparam("b_parent"), root_provider_id=bindparam("b_root")),
            [
                {"b_id": ids[p.uuid], "b_parent": ids[p.parent] if p.parent else None, "b_root": ids[p.root]}
                for p in world.providers
            ],
        )
    progress("resource providers", counts["resource providers"])
    aggregates = named("placement_aggregates", "uuid", schema.aggregate_uuids(world))
    projects, users = schema.projects_and_users(world)
    ids_of = schema.UpstreamIds(
        classes=classes,
        traits=trait_ids,
        providers=ids,
        aggregates=aggregates,
        projects=named("projects", "external_id", projects),
        users=named("users", "external_id", users),
        consumer_types=named("consumer_types", "name", world.consumer_types),
    )
    rows = schema.upstream_rows(world, ids_of)
    order = [
        ("inventories", "inventories"),
        ("resource_provider_aggregates", "aggregate memberships"),
        ("resource_provider_traits", "provider traits"),
        (None, "projects"),
        (None, "users"),
        (None, "consumer types"),
        ("consumers", "consumers"),
        ("allocations", "allocations"),
    ]
    for table, what in order:
        if table is not None:
            insert(table, rows[table])
        progress(what, counts[what])
