"""Consumers: generations (1.28) and types (1.38).

The columns migration 0004 added are described here, on their own MetaData,
not in ``db.py`` (which another change is moving); ``tests/placement/test_migrations.py``
compares both descriptions with the migrated schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Sequence

from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..exception import ConcurrentUpdate, GenerationConflict

metadata = MetaData()

consumers = Table(
    "consumers",
    metadata,
    Column("uuid", String(36), primary_key=True),
    Column("project_id", String(255), nullable=True, index=True),
    Column("user_id", String(255), nullable=True),
    Column("generation", Integer, nullable=False, server_default="1"),
    Column("consumer_type_id", Integer, nullable=True),
)

consumer_types = Table(
    "consumer_types",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
)

UNKNOWN_TYPE = "unknown"


@dataclass
class Consumer:
    uuid: str
    project_id: Optional[str]
    user_id: Optional[str]
    generation: int
    consumer_type: str
    consumer_type_id: Optional[int] = None  # kept by a write that names no type


_SELECT = select(
    consumers.c.uuid,
    consumers.c.project_id,
    consumers.c.user_id,
    consumers.c.generation,
    consumer_types.c.name,
    consumers.c.consumer_type_id,
).select_from(consumers.outerjoin(consumer_types, consumer_types.c.id == consumers.c.consumer_type_id))
_BY_UUIDS = _SELECT.where(consumers.c.uuid.in_(bindparam("b_uuids", expanding=True)))


def _consumer(row: Sequence[Any]) -> Consumer:
    return Consumer(row[0], row[1], row[2], row[3], row[4] or UNKNOWN_TYPE, row[5])


def by_uuid(connection: Connection, uuids: Iterable[str]) -> Dict[str, Consumer]:
    wanted = sorted(set(uuids))
    if not wanted:
        return {}
    return {row[0]: _consumer(row) for row in connection.execute(_BY_UUIDS, {"b_uuids": wanted})}


def check_generation(existing: Optional[Consumer], given: Optional[int]) -> None:
    """1.28: the generation the client read (null for a new consumer), else 409."""
    expected = existing.generation if existing is not None else None
    if expected != given:
        # Upstream's words: "null" for the missing consumer, Python's "None" for a missing generation.
        raise GenerationConflict(
            f"consumer generation conflict - expected {'null' if expected is None else expected} but got {given}"
        )


def type_id(connection: Connection, name: str) -> int:
    """The id of consumer type ``name``, created on first use."""
    found = connection.scalar(select(consumer_types.c.id).where(consumer_types.c.name == name))
    if found is not None:
        return int(found)
    try:
        with connection.begin_nested():
            inserted = connection.execute(consumer_types.insert().values(name=name)).inserted_primary_key
            assert inserted is not None  # a single-row INSERT always reports its key
            return int(inserted[0])
    except IntegrityError:  # a concurrent writer created it
        return int(connection.execute(select(consumer_types.c.id).where(consumer_types.c.name == name)).scalar_one())


_INSERT = consumers.insert()
_BUMP = (
    consumers.update()
    .where(consumers.c.uuid == bindparam("b_uuid"), consumers.c.generation == bindparam("b_seen"))
    .values(
        generation=bindparam("b_next"),
        project_id=bindparam("b_project"),
        user_id=bindparam("b_user"),
        consumer_type_id=bindparam("b_type"),
    )
)


def save(
    connection: Connection,
    uuid: str,
    existing: Optional[Consumer],
    project_id: Optional[str],
    user_id: Optional[str],
    type_id_: Optional[int],
    keep_type: bool,
) -> None:
    """Create the consumer at generation 1, or bump its generation (compare-and-swap
    on the generation read in this transaction: a concurrent write loses)."""
    if existing is None:
        values = {"uuid": uuid, "project_id": project_id, "user_id": user_id, "generation": 1}
        values["consumer_type_id"] = type_id_
        connection.execute(_INSERT, values)  # a concurrent twin: IntegrityError, 409
        return
    result = connection.execute(
        _BUMP,
        {
            "b_uuid": uuid,
            "b_seen": existing.generation,
            "b_next": existing.generation + 1,
            "b_project": project_id if project_id is not None else existing.project_id,
            "b_user": user_id if user_id is not None else existing.user_id,
            # The type read with the generation: if it changed since, so did the generation.
            "b_type": existing.consumer_type_id if keep_type else type_id_,
        },
    )
    if result.rowcount != 1:
        raise ConcurrentUpdate(uuid)


def delete(connection: Connection, uuid: str) -> None:
    connection.execute(consumers.delete().where(consumers.c.uuid == uuid))
