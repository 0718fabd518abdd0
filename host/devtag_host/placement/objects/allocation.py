"""Allocations: a consumer's claims on providers, checked against capacity.

A write replaces the allocations of one or more consumers in one
transaction: compare-and-swap the generation of every provider involved (in
id order, so two writers never deadlock), delete the old rows, check every
(provider, class) the new rows touch against
``(total - reserved) * allocation_ratio - used >= requested`` and
min/max/step, and insert.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sqlalchemy import bindparam, distinct, func, literal, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnElement

from ..db import allocations, consumers, inventories, resource_classes, resource_providers
from ..exception import (
    AllocationProviderNotFound,
    InvalidAllocationCapacityExceeded,
    InvalidAllocationConstraintsViolated,
    InvalidInventory,
)
from . import consumer as consumer_obj
from . import resource_class
from .resource_provider import Provider, bump_generation, ids_by_uuid


@dataclass
class ConsumerAllocations:
    """The wanted allocations of one consumer: {provider uuid: {class: amount}}."""

    consumer: str
    resources: Dict[str, Dict[str, int]]
    project_id: Optional[str] = None
    user_id: Optional[str] = None
    providers: Dict[str, Provider] = field(default_factory=dict)
    # 1.28: the consumer generation the client read (None: a new consumer), checked when ``check_generation``.
    generation: Optional[int] = None
    check_generation: bool = False
    # 1.38: the consumer type; None keeps the stored one.
    consumer_type: Optional[str] = None


def of_consumer(connection: Connection, consumer: str) -> Tuple[Dict[str, Dict], Optional[consumer_obj.Consumer]]:
    """({provider uuid: {"generation", "resources"}}, the consumer or None)."""
    query = (
        select(resource_providers.c.uuid, resource_providers.c.generation, resource_classes.c.name, allocations.c.used)
        .join(resource_providers, resource_providers.c.id == allocations.c.resource_provider_id)
        .join(resource_classes, resource_classes.c.id == allocations.c.resource_class_id)
        .where(allocations.c.consumer_id == consumer)
    )
    result: Dict[str, Dict] = {}
    for row in connection.execute(query):
        entry = result.setdefault(row.uuid, {"generation": row.generation, "resources": {}})
        entry["resources"][row.name] = row.used
    return result, consumer_obj.by_uuid(connection, [consumer]).get(consumer)


def of_provider(connection: Connection, provider_id: int, with_generation: bool = False) -> Dict[str, Dict[str, Any]]:
    """{consumer: {"resources": {class: amount}}}, with ``consumer_generation`` (1.28) if asked."""
    query = (
        select(allocations.c.consumer_id, resource_classes.c.name, allocations.c.used)
        .join(resource_classes, resource_classes.c.id == allocations.c.resource_class_id)
        .where(allocations.c.resource_provider_id == provider_id)
    )
    result: Dict[str, Dict[str, Any]] = {}
    for row in connection.execute(query):
        result.setdefault(row.consumer_id, {"resources": {}})["resources"][row.name] = row.used
    if with_generation:
        found = consumer_obj.by_uuid(connection, result)
        for consumer_id, entry in result.items():
            entry["consumer_generation"] = found[consumer_id].generation if consumer_id in found else None
    return result


def _old_allocations(connection: Connection, consumer_ids: List[str]) -> Dict[Tuple[int, int], int]:
    """{(provider id, class id): amount} the consumers hold now, before the write replaces it."""
    query = (
        select(allocations.c.resource_provider_id, allocations.c.resource_class_id, func.sum(allocations.c.used))
        .where(allocations.c.consumer_id.in_(consumer_ids))
        .group_by(allocations.c.resource_provider_id, allocations.c.resource_class_id)
    )
    return {(rp_id, rc_id): int(amount) for rp_id, rc_id, amount in connection.execute(query)}


_ADD_USED = (
    inventories.update()
    .where(
        inventories.c.resource_provider_id == bindparam("b_provider"),
        inventories.c.resource_class_id == bindparam("b_class"),
    )
    .values(used=inventories.c.used + bindparam("b_delta"))
)


def _update_used(connection: Connection, old: Dict[Tuple[int, int], int], new: Dict[Tuple[int, int], int]) -> None:
    """Keep ``inventories.used`` equal to the sum of the allocations of each row."""
    deltas = [
        {"b_provider": key[0], "b_class": key[1], "b_delta": new.get(key, 0) - old.get(key, 0)}
        for key in sorted(set(old) | set(new))
        if new.get(key, 0) != old.get(key, 0)
    ]
    if deltas:
        connection.execute(_ADD_USED, deltas)


def replace(
    connection: Connection,
    wanted: List[ConsumerAllocations],
) -> None:
    """Replace the allocations of each consumer in ``wanted`` (empty = delete)."""
    consumer_ids = [item.consumer for item in wanted]
    existing = consumer_obj.by_uuid(connection, consumer_ids)
    for item in wanted:  # 1.28: first of all, as upstream
        if item.check_generation:
            consumer_obj.check_generation(existing.get(item.consumer), item.generation)
    provider_uuids = {uuid for item in wanted for uuid in item.resources}
    providers = ids_by_uuid(connection, provider_uuids)
    # The first unknown provider in request order, as upstream names it.
    for uuid in (uuid for item in wanted for uuid in item.resources if uuid not in providers):
        raise AllocationProviderNotFound(uuid)
    class_names = [name for item in wanted for per in item.resources.values() for name in per]
    class_ids = resource_class.require_ids(connection, dict.fromkeys(class_names))

    held = _old_allocations(connection, consumer_ids)
    old_ids = sorted({rp_id for rp_id, _ in held})
    if old_ids:
        old = {p.id: p for p in ids_by_uuid(connection, _uuids_of(connection, old_ids)).values()}
    else:
        old = {}
    # Swap the generations first (in id order: no deadlocks).  On PostgreSQL the UPDATE
    # also holds each provider's row until commit, so a concurrent writer waits here and
    # then loses cheaply, instead of losing after its own capacity check and insert; and
    # the capacity check below reads the usage committed before us.
    involved = {p.id: p for p in providers.values()}
    involved.update({pid: p for pid, p in old.items() if pid not in involved})
    for provider_id in sorted(involved):
        bump_generation(connection, involved[provider_id])
    connection.execute(allocations.delete().where(allocations.c.consumer_id.in_(consumer_ids)))

    requested: Dict[Tuple[int, int], int] = {}
    rows = []
    for item in wanted:
        for uuid, per_class in item.resources.items():
            provider = providers[uuid]
            for name, amount in per_class.items():
                key = (provider.id, class_ids[name])
                requested[key] = requested.get(key, 0) + amount
                rows.append(
                    {
                        "resource_provider_id": provider.id,
                        "consumer_id": item.consumer,
                        "resource_class_id": class_ids[name],
                        "used": amount,
                    }
                )
        _save_consumer(connection, item, existing.get(item.consumer))
    _check_capacity(connection, requested, rows, {p.id: p for p in providers.values()}, class_ids)
    if rows:
        connection.execute(allocations.insert(), rows)
    _update_used(connection, held, requested)


def _uuids_of(connection: Connection, ids: List[int]) -> List[str]:
    return list(connection.scalars(select(resource_providers.c.uuid).where(resource_providers.c.id.in_(ids))))


def _save_consumer(
    connection: Connection, item: ConsumerAllocations, existing: Optional[consumer_obj.Consumer]
) -> None:
    """A consumer without allocations is deleted (its generation starts again at null)."""
    if not item.resources:
        consumer_obj.delete(connection, item.consumer)
        return
    type_id = consumer_obj.type_id(connection, item.consumer_type) if item.consumer_type else None
    consumer_obj.save(
        connection, item.consumer, existing, item.project_id, item.user_id, type_id, item.consumer_type is None
    )


def _check_capacity(
    connection: Connection,
    requested: Dict[Tuple[int, int], int],
    rows: List[Dict[str, object]],
    providers: Dict[int, Provider],
    class_ids: Dict[str, int],
) -> None:
    if not requested:
        return
    names = {class_id: name for name, class_id in class_ids.items()}
    provider_ids = sorted({pid for pid, _ in requested})
    inv_rows = connection.execute(
        select(
            inventories.c.resource_provider_id,
            inventories.c.resource_class_id,
            inventories.c.total,
            inventories.c.reserved,
            inventories.c.min_unit,
            inventories.c.max_unit,
            inventories.c.step_size,
            inventories.c.allocation_ratio,
        ).where(inventories.c.resource_provider_id.in_(provider_ids))
    )
    inventory = {(row[0], row[1]): row for row in inv_rows}
    used_rows = connection.execute(
        select(allocations.c.resource_provider_id, allocations.c.resource_class_id, func.sum(allocations.c.used))
        .where(allocations.c.resource_provider_id.in_(provider_ids))
        .group_by(allocations.c.resource_provider_id, allocations.c.resource_class_id)
    )
    used = {(row[0], row[1]): int(row[2]) for row in used_rows}
    for wanted in rows:
        provider_id, class_id, amount = wanted["resource_provider_id"], wanted["resource_class_id"], wanted["used"]
        uuid, name = providers[provider_id].uuid, names[class_id]  # type: ignore[index]
        row = inventory.get((provider_id, class_id))
        if row is None:
            raise InvalidInventory(uuid, name)
        if amount < row.min_unit or amount > row.max_unit or amount % row.step_size:
            raise InvalidAllocationConstraintsViolated(uuid, name, amount, row.min_unit, row.max_unit, row.step_size)
    for (provider_id, class_id), amount in sorted(requested.items()):
        uuid, name = providers[provider_id].uuid, names[class_id]
        row = inventory[(provider_id, class_id)]
        capacity = (row.total - row.reserved) * row.allocation_ratio
        if capacity - used.get((provider_id, class_id), 0) < amount:
            raise InvalidAllocationCapacityExceeded(uuid, name)


def usages_by_project(connection: Connection, project_id: str, user_id: Optional[str]) -> Dict[str, int]:
    query = (
        select(resource_classes.c.name, func.sum(allocations.c.used))
        .join(allocations, allocations.c.resource_class_id == resource_classes.c.id)
        .join(consumers, consumers.c.uuid == allocations.c.consumer_id)
        .where(consumers.c.project_id == project_id)
        .group_by(resource_classes.c.name)
    )
    if user_id is not None:
        query = query.where(consumers.c.user_id == user_id)
    return {name: int(total) for name, total in connection.execute(query)}


def usages_by_consumer_type(
    connection: Connection, project_id: str, user_id: Optional[str], consumer_type: Optional[str]
) -> Dict[str, Dict[str, int]]:
    """1.38: {consumer type: {class: amount, "consumer_count": n}}; ``all`` puts every
    consumer under "all", ``unknown`` only those written without a type."""
    owners = consumer_obj.consumers
    types = consumer_obj.consumer_types
    source = allocations.join(owners, owners.c.uuid == allocations.c.consumer_id).outerjoin(
        types, types.c.id == owners.c.consumer_type_id
    )
    conditions = [owners.c.project_id == project_id]
    if user_id is not None:
        conditions.append(owners.c.user_id == user_id)
    if consumer_type == "unknown":
        conditions.append(owners.c.consumer_type_id.is_(None))
    elif consumer_type not in (None, "all"):
        conditions.append(types.c.name == consumer_type)
    key: ColumnElement[str]
    if consumer_type in ("all", "unknown"):
        key = literal(consumer_type)
    else:
        key = func.coalesce(types.c.name, consumer_obj.UNKNOWN_TYPE)
    result: Dict[str, Dict[str, int]] = {}
    sums = (
        select(key, resource_classes.c.name, func.sum(allocations.c.used))
        .select_from(source.join(resource_classes, resource_classes.c.id == allocations.c.resource_class_id))
        .where(*conditions)
        .group_by(key, resource_classes.c.name)
    )
    for type_name, class_name, total in connection.execute(sums):
        result.setdefault(type_name, {})[class_name] = int(total)
    counts = select(key, func.count(distinct(allocations.c.consumer_id))).select_from(source).where(*conditions)
    for type_name, count in connection.execute(counts.group_by(key)):
        if type_name in result:
            result[type_name]["consumer_count"] = int(count)
    return result
