"""The attachment store: Cinder's states, derived volume status, multiattach rules."""

from __future__ import annotations

import pytest

from devtag_host.attach import (
    ATTACHED,
    ATTACHING,
    AVAILABLE,
    DETACHING,
    IN_USE,
    RESERVED,
    AttachmentStore,
    Conflict,
    NotFound,
    VolumeInUse,
)
from devtag_host.attach.schema_upgrade import VERSION_TABLE, current_revision

INSTANCE_A = "aaaaaaaa-0000-4000-8000-000000000001"
INSTANCE_B = "bbbbbbbb-0000-4000-8000-000000000002"


def connector(host: str) -> dict:
    return {"host": host, "initiator": "qemu"}


def ready_volume(store: AttachmentStore, name: str = "vol1", multiattach: bool = False):
    volume = store.create_volume(name, "pool", 1 << 20, multiattach=multiattach)
    return store.set_volume_ready(volume.id, f"/volumes/{name}")


def test_attach_states_and_derived_volume_status(store: AttachmentStore) -> None:
    volume = ready_volume(store)
    assert volume.status == AVAILABLE and volume.lifecycle == "ready"
    attachment = store.reserve("vol1", INSTANCE_A, tag="db")
    assert attachment.status == RESERVED and attachment.connector is None
    assert store.get_volume("vol1").status == RESERVED
    info = {"driver_volume_type": "file", "data": {"path": "/volumes/vol1"}}
    attachment = store.update(attachment.id, connector("h1"), info)
    assert (attachment.status, attachment.host, attachment.connection_info) == (ATTACHING, "h1", info)
    assert store.get_volume(volume.id).status == ATTACHING
    attachment = store.complete(attachment.id, alias="ua-x", address="0000:00:05.0")
    assert attachment.status == ATTACHED and attachment.address == "0000:00:05.0"
    assert store.get_volume("vol1").status == IN_USE
    assert store.begin_detaching(attachment.id).status == DETACHING
    assert store.get_volume("vol1").status == DETACHING
    assert store.roll_detaching(attachment.id).status == ATTACHED
    assert store.get_volume("vol1").status == IN_USE
    store.begin_detaching(attachment.id)
    store.delete_attachment(attachment.id)
    store.delete_attachment(attachment.id)  # idempotent
    assert store.get_volume("vol1").status == AVAILABLE


def test_transitions_out_of_order_are_refused(store: AttachmentStore) -> None:
    ready_volume(store)
    attachment = store.reserve("vol1", INSTANCE_A)
    with pytest.raises(Conflict):
        store.complete(attachment.id)
    with pytest.raises(Conflict):
        store.begin_detaching(attachment.id)
    with pytest.raises(NotFound):
        store.complete("no-such-attachment")


def test_a_non_multiattach_volume_belongs_to_one_instance(store: AttachmentStore) -> None:
    ready_volume(store)
    store.reserve("vol1", INSTANCE_A)
    with pytest.raises(VolumeInUse):
        store.reserve("vol1", INSTANCE_B)


def test_live_migration_holds_two_attachments_of_one_instance_on_two_hosts(store: AttachmentStore) -> None:
    ready_volume(store)
    source = store.reserve("vol1", INSTANCE_A)
    store.update(source.id, connector("src"), {})
    store.complete(source.id)
    destination = store.reserve("vol1", INSTANCE_A)
    with pytest.raises(VolumeInUse):  # same host twice is a double attach
        store.update(destination.id, connector("src"), {})
    store.update(destination.id, connector("dst"), {})
    with pytest.raises(VolumeInUse):  # a third one is not a migration
        store.reserve("vol1", INSTANCE_A)
    with pytest.raises(VolumeInUse):
        store.reserve("vol1", INSTANCE_B)
    assert store.get_volume("vol1").status == IN_USE


def test_multiattach_volumes_take_several_instances_but_not_twice_on_one_host(store: AttachmentStore) -> None:
    ready_volume(store, multiattach=True)
    first = store.reserve("vol1", INSTANCE_A, host="h1")
    store.reserve("vol1", INSTANCE_B, host="h1")
    with pytest.raises(VolumeInUse):
        store.reserve("vol1", INSTANCE_A, host="h1")
    assert first.host == "h1"


def test_volume_names_are_unique_and_delete_is_refused_while_attached(store: AttachmentStore) -> None:
    volume = ready_volume(store)
    with pytest.raises(Conflict):
        store.create_volume("vol1", "pool", 1 << 20)
    attachment = store.reserve("vol1", INSTANCE_A)
    with pytest.raises(VolumeInUse):
        store.begin_volume_delete(volume.id)
    store.delete_attachment(attachment.id)
    assert store.begin_volume_delete(volume.id).lifecycle == "deleting"
    with pytest.raises(Conflict):  # no new attachment of a volume being deleted
        store.reserve("vol1", INSTANCE_A)
    store.remove_volume(volume.id)
    assert store.list_volumes() == []


def test_journal_keeps_open_operations(store: AttachmentStore) -> None:
    store.journal_step("op1", "attach-volume", "reserve", instance_uuid=INSTANCE_A)
    store.journal_step("op1", "attach-volume", "update", detail={"host": "h1"})
    store.journal_step("op2", "attach-volume", "reserve")
    store.journal_step("op2", "attach-volume", "end", detail={"outcome": "completed"})
    (open_op,) = store.open_operations()
    assert [row["step"] for row in open_op] == ["reserve", "update"]
    assert open_op[1]["detail"] == {"host": "h1"}


def finished_operation(store: AttachmentStore, operation: str, flow: str = "attach-volume", **ids: str) -> None:
    store.journal_step(operation, flow, "validate", detail={"host": "h1"}, **ids)
    store.journal_step(operation, flow, "end", detail={"host": "h1", "outcome": "completed"}, **ids)


def test_prune_keeps_a_bounded_history_and_what_is_still_needed(store: AttachmentStore) -> None:
    """The journal keeps a bounded history of finished operations, and whatever reconcile still needs."""
    finished_operation(store, "shelved", "shelve-offload", instance_uuid=INSTANCE_A)  # not unshelved: kept
    finished_operation(store, "evacuated", "evacuate", instance_uuid=INSTANCE_B)  # recover-evacuated needs it
    finished_operation(store, "shelved-then-back", "shelve-offload", instance_uuid=INSTANCE_B)
    finished_operation(store, "unshelved", "unshelve", instance_uuid=INSTANCE_B)
    for number in range(6):
        finished_operation(store, f"op{number}")
    store.journal_step("open", "attach-volume", "reserve")

    assert store.prune_journal(keep=3) == 5  # the oldest finished ones, the shelve that was unshelved

    remaining = {row.operation for row in store.journal()}
    assert remaining == {"shelved", "evacuated", "op3", "op4", "op5", "open"}
    assert [rows[0].operation for rows in store.open_operations()] == ["open"]
    assert store.prune_journal(keep=3) == 0


def test_journal_records_are_typed(store: AttachmentStore) -> None:
    store.journal_step("op1", "attach-volume", "end", mac="52:54:00:AA:BB:CC", detail={"outcome": "completed"})
    (record,) = store.journal()
    assert (record.operation, record.flow, record.step, record.mac, record.outcome) == (
        "op1",
        "attach-volume",
        "end",
        "52:54:00:aa:bb:cc",
        "completed",
    )
    assert record["detail"] == {"outcome": "completed"}  # the rows' old dict shape still reads
    assert store.journal_ids().macs == {"52:54:00:aa:bb:cc"}


def test_schema_has_its_own_alembic_version_table(store: AttachmentStore) -> None:
    assert current_revision(store) == "0003"
    from sqlalchemy import inspect

    with store.db.read() as connection:
        assert VERSION_TABLE in inspect(connection).get_table_names()


def test_attach_and_placement_schemas_share_one_database(sqlite_url: str) -> None:
    from sqlalchemy import inspect

    from devtag_host.placement import schema_upgrade as placement_schema
    from devtag_host.placement.db import Store

    placement = Store(sqlite_url)
    placement_schema.upgrade(placement)
    placement.dispose()
    store = AttachmentStore(sqlite_url)
    try:
        assert current_revision(store) == "0003"
        with store.db.read() as connection:
            tables = set(inspect(connection).get_table_names())
        assert {"alembic_version", VERSION_TABLE, "resource_providers", "volumes", "journal"} <= tables
    finally:
        store.close()


def test_migrations_match_the_tables(store: AttachmentStore) -> None:
    """The Alembic migrations build exactly the tables ``db.py`` describes (SQLite and PostgreSQL)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from devtag_host.attach.db import metadata

    with store.db.read() as connection:
        context = MigrationContext.configure(
            connection,
            opts={"include_name": lambda name, kind, parent: kind != "table" or name in metadata.tables},
        )
        differences = compare_metadata(context, metadata)
    # Server defaults are not compared by default; anything else is a missing migration.
    assert differences == []
