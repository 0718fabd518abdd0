"""The Alembic migrations build exactly the schema ``db.py`` describes."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from devtag_host.placement.db import metadata


def test_migrations_match_the_tables(store):
    with store.read() as connection:
        context = MigrationContext.configure(connection)
        differences = compare_metadata(context, _merged_metadata())
    # Server defaults are not compared by default; anything else is a missing migration.
    assert differences == []


def test_0003_sums_existing_allocations_into_inventories_used(tmp_path):
    """A database written before ``inventories.used`` existed keeps its usage."""
    from sqlalchemy import text

    from devtag_host.placement import schema_upgrade
    from devtag_host.placement.db import Store

    from .conftest import make_client
    from .test_api import new_provider, set_inventory

    store = Store(f"sqlite:///{tmp_path / 'old.sqlite'}")
    schema_upgrade.upgrade(store)
    client = make_client(store)
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, VCPU={"total": 8}, MEMORY_MB={"total": 1024})
    for consumer, vcpus in (("a", 2), ("b", 3)):
        body = {"allocations": {rp: {"resources": {"VCPU": vcpus}}}, "project_id": "p", "user_id": "u"}
        consumer_uuid = f"00000000-0000-0000-0000-00000000000{consumer}"
        assert client.put(f"/allocations/{consumer_uuid}", json=body).status_code == 204
    client.close()
    with store.write() as connection:  # back to the schema before 0003, allocations kept
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(schema_upgrade.MIGRATIONS))
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    schema_upgrade.upgrade(store)
    with store.read() as connection:
        used = dict(
            connection.execute(
                text("SELECT c.name, i.used FROM inventories i JOIN resource_classes c ON c.id = i.resource_class_id")
            ).all()
        )
    assert used == {"VCPU": 5, "MEMORY_MB": 0}
    store.dispose()


def _merged_metadata():
    """db.py's tables, with the consumer columns of migration 0004 (objects/consumer.py)."""
    from sqlalchemy import MetaData

    from devtag_host.placement.objects import consumer

    merged = MetaData()
    for table in metadata.tables.values():
        if table.name not in consumer.metadata.tables:
            table.to_metadata(merged)
    for table in consumer.metadata.tables.values():
        table.to_metadata(merged)
    return merged


def _downgrade(store, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from devtag_host.placement import schema_upgrade

    with store.write() as connection:
        config = Config()
        config.set_main_option("script_location", str(schema_upgrade.MIGRATIONS))
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _upgrade_a_1_17_database(url: str) -> None:
    """Data written at 1.17, the schema taken back to 0003 (the last before 1.28),
    then upgraded in place: the data is kept and served at 1.28."""
    import uuid

    from devtag_host.placement import schema_upgrade
    from devtag_host.placement.db import Store

    from .conftest import make_client
    from .test_api import new_provider, set_inventory

    store = Store(url)
    try:
        schema_upgrade.upgrade(store)
        client = make_client(store, **{"openstack-api-version": "placement 1.17"})
        rp = new_provider(client, "cn1")
        set_inventory(client, rp, VCPU={"total": 8})
        consumer = str(uuid.uuid4())
        body = {"allocations": {rp: {"resources": {"VCPU": 2}}}, "project_id": "p", "user_id": "u"}
        assert client.put(f"/allocations/{consumer}", json=body).status_code == 204
        client.close()
        _downgrade(store, "0003")
        with store.read() as connection:
            columns = {column["name"] for column in inspect(connection).get_columns("consumers")}
        assert "generation" not in columns
        schema_upgrade.upgrade(store)
        with store.read() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), _merged_metadata())
        assert differences == []
        client = make_client(store, **{"openstack-api-version": "placement 1.28"})
        got = client.get(f"/allocations/{consumer}").json()
        assert got["allocations"][rp]["resources"] == {"VCPU": 2} and got["project_id"] == "p"
        generation = got["consumer_generation"]
        body = {**body, "consumer_generation": generation}
        body["allocations"][rp]["resources"]["VCPU"] = 3
        assert client.put(f"/allocations/{consumer}", json=body).status_code == 204
        assert client.get(f"/allocations/{consumer}").json()["consumer_generation"] == generation + 1
        assert client.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 3}
        client.close()
    finally:
        store.dispose()


def test_0004_upgrades_a_1_17_database_in_place_sqlite(tmp_path):
    _upgrade_a_1_17_database(f"sqlite:///{tmp_path / 'old.sqlite'}")


@pytest.mark.postgresql
def test_0004_upgrades_a_1_17_database_in_place_postgresql(postgres_server):
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(postgres_server)
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text("DROP DATABASE IF EXISTS upgrade_0004"))
        connection.execute(text("CREATE DATABASE upgrade_0004"))
    admin.dispose()
    _upgrade_a_1_17_database(url.set(database="upgrade_0004").render_as_string(hide_password=False))


@pytest.mark.mariadb
def test_0004_upgrades_a_1_17_database_in_place_mariadb(mariadb_url):
    from tests.support.services import create_database

    _upgrade_a_1_17_database(create_database(mariadb_url, "upgrade_0004"))


@pytest.mark.mariadb
def test_every_table_is_innodb_utf8mb4_with_a_primary_key_on_mariadb(mariadb_store):
    """What Galera replicates (InnoDB tables with a primary key) and what holds any name
    (4-byte UTF-8, compared byte by byte as on SQLite and PostgreSQL)."""
    from sqlalchemy import text

    with mariadb_store.read() as connection:
        tables = connection.execute(
            text(
                "SELECT table_name, engine, table_collation FROM information_schema.tables"
                " WHERE table_schema = DATABASE()"
            )
        ).all()
        keyed = set(
            connection.scalars(
                text(
                    "SELECT table_name FROM information_schema.table_constraints"
                    " WHERE table_schema = DATABASE() AND constraint_type = 'PRIMARY KEY'"
                )
            )
        )
    names = {name for name, _engine, _collation in tables}
    assert set(metadata.tables) | {"alembic_version", "consumer_types"} <= names
    assert {name for name, engine, _ in tables if engine != "InnoDB"} == set()
    assert names - keyed == set()
    placement_tables = [(name, collation) for name, _, collation in tables if name != "alembic_version"]
    assert {collation for _, collation in placement_tables} == {"utf8mb4_nopad_bin"}
