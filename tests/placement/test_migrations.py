"""The Alembic migrations build exactly the schema ``db.py`` describes."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from devtag_host.placement.db import metadata


def test_migrations_match_the_tables(store):
    with store.read() as connection:
        context = MigrationContext.configure(connection)
        differences = compare_metadata(context, metadata)
    # Server defaults are not compared by default; anything else is a missing migration.
    assert differences == []


def test_0003_sums_existing_allocations_into_inventories_used(tmp_path):
    """A database written before ``inventories.used`` existed keeps its usage."""
    from sqlalchemy import text

    from devtag_host.placement import migrate
    from devtag_host.placement.db import Store

    from .conftest import make_client
    from .test_api import new_provider, set_inventory

    store = Store(f"sqlite:///{tmp_path / 'old.sqlite'}")
    migrate.upgrade(store, "0003")
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
        config.set_main_option("script_location", str(migrate.MIGRATIONS))
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    migrate.upgrade(store)
    with store.read() as connection:
        used = dict(
            connection.execute(
                text("SELECT c.name, i.used FROM inventories i JOIN resource_classes c ON c.id = i.resource_class_id")
            ).all()
        )
    assert used == {"VCPU": 5, "MEMORY_MB": 0}
    store.dispose()
