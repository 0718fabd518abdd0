"""Allocations: a consumer's claims on providers, checked against capacity.

A write replaces the allocations of one or more consumers in one
transaction: read what it needs (consumers, providers, the old allocations),
then claim the providers allocated from (and those of a consumer whose
allocations a PUT/POST empties, as upstream) in id order (so two writers never
deadlock) by counting the write in their generation, delete the old rows, check
every new row, in request order, against its inventory's min/max/step and
``(total - reserved) * allocation_ratio - used >= requested`` (``used``: the
inventory row's, read after the claim; a write that asks no more than its
consumers held passes even over capacity, as upstream), insert,
and keep ``inventories.used``.  The claim is either a compare-and-swap of the
generations read (a first try: it loses to a write committed since) or a row
lock (the retry: it waits for the writes before it); see :func:`_claim_providers`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from sqlalchemy import (
    Integer,
    String,
    bindparam,
    cast,
    distinct,
    func,
    literal,
    literal_column,
    null,
    select,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnElement

from ..db import allocations, consumers, inventories, resource_classes, resource_providers
from ..exception import (
    AllocationProviderNotFound,
    ConcurrentUpdate,
    InvalidAllocationCapacityExceeded,
    InvalidAllocationConstraintsViolated,
    InvalidInventory,
)
from . import consumer as consumer_obj
from . import resource_class

log = logging.getLogger(__name__)


@dataclass
class ConsumerAllocations:
    """The wanted allocations of one consumer: {provider uuid: {class: amount}}."""

    consumer: str
    resources: Dict[str, Dict[str, int]]
    project_id: Optional[str] = None
    user_id: Optional[str] = None
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


# Statements built once: building SQLAlchemy expressions per call costs more than running them.
# What a write reads before it claims the providers, in one round trip: the consumers
# (kind 0), the providers named (1) and the consumers' old allocations (2), as rows of
# (kind, four texts, three integers).
_CONSUMER, _PROVIDER, _HELD_ROW = 0, 1, 2
_NO_TEXT = cast(null(), String)
_NO_INT = cast(null(), Integer)
_owners, _types = consumer_obj.consumers, consumer_obj.consumer_types
_BEFORE_CLAIM = union_all(
    select(
        literal_column(str(_CONSUMER), Integer),
        _owners.c.uuid,
        _owners.c.project_id,
        _owners.c.user_id,
        _types.c.name,
        _owners.c.generation,
        _owners.c.consumer_type_id,
        _NO_INT,
    )
    .select_from(_owners.outerjoin(_types, _types.c.id == _owners.c.consumer_type_id))
    .where(_owners.c.uuid.in_(bindparam("b_consumers", expanding=True))),
    select(
        literal_column(str(_PROVIDER), Integer),
        resource_providers.c.uuid,
        _NO_TEXT,
        _NO_TEXT,
        _NO_TEXT,
        resource_providers.c.id,
        resource_providers.c.generation,
        _NO_INT,
    ).where(resource_providers.c.uuid.in_(bindparam("b_uuids", expanding=True))),
    select(
        literal_column(str(_HELD_ROW), Integer),
        allocations.c.consumer_id,
        _NO_TEXT,
        _NO_TEXT,
        _NO_TEXT,
        allocations.c.resource_provider_id,
        allocations.c.resource_class_id,
        cast(func.sum(allocations.c.used), Integer),
    )
    .where(allocations.c.consumer_id.in_(bindparam("b_holders", expanding=True)))
    .group_by(allocations.c.consumer_id, allocations.c.resource_provider_id, allocations.c.resource_class_id),
)
# Take the row of every provider involved, in id order (two writers never deadlock),
# and count the write in its generation.  On PostgreSQL the rows stay locked until
# commit: the next writer of a provider waits here, then reads the usage this one
# committed.  SQLite has no FOR UPDATE; its BEGIN IMMEDIATE already serialises writers.
_LOCK = (
    resource_providers.update()
    .where(
        resource_providers.c.id.in_(
            select(resource_providers.c.id)
            .where(resource_providers.c.id.in_(bindparam("b_ids", expanding=True)))
            .order_by(resource_providers.c.id)
            .with_for_update()
        )
    )
    .values(generation=resource_providers.c.generation + 1)
)
# The compare-and-swap of a generation read before the write (a first, optimistic try).
_SWAP = (
    resource_providers.update()
    .where(resource_providers.c.id == bindparam("b_id"), resource_providers.c.generation == bindparam("b_seen"))
    .values(generation=bindparam("b_next"))
)
_DELETE = allocations.delete().where(allocations.c.consumer_id.in_(bindparam("b_consumers", expanding=True)))
_DELETE_RETURNING = _DELETE.returning(
    allocations.c.resource_provider_id, allocations.c.resource_class_id, allocations.c.used
)
_DOOMED = (
    select(allocations.c.resource_provider_id, allocations.c.resource_class_id, allocations.c.used)
    .where(allocations.c.consumer_id.in_(bindparam("b_consumers", expanding=True)))
    .with_for_update()
)
_INSERT = allocations.insert()
_INVENTORY = select(
    inventories.c.resource_provider_id,
    inventories.c.resource_class_id,
    inventories.c.total,
    inventories.c.reserved,
    inventories.c.min_unit,
    inventories.c.max_unit,
    inventories.c.step_size,
    inventories.c.allocation_ratio,
    inventories.c.used,
).where(inventories.c.resource_provider_id.in_(bindparam("b_providers", expanding=True)))
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


def _delete_old(
    connection: Connection, consumer_ids: List[str], read: Dict[Tuple[int, int], int], claimed: Set[int]
) -> Dict[Tuple[int, int], int]:
    """Delete the consumers' allocations; return what they held, as deleted.

    The old allocations were read before the claim: a write of the same consumer
    committed in between (a DELETE does not check the consumer's generation) may
    have moved them.  ``inventories.used`` is kept from what is really deleted, so
    it never drifts from the allocation rows; rows on a provider this write did not
    claim mean the read was stale, and the write starts again."""
    if connection.dialect.name == "sqlite" and not connection.dialect.delete_returning:  # before 3.35
        connection.execute(_DELETE, {"b_consumers": consumer_ids})  # writers are serialised there
        return read
    if connection.dialect.delete_returning:
        rows = list(connection.execute(_DELETE_RETURNING, {"b_consumers": consumer_ids}))
    else:  # MySQL: the rows, locked, then the DELETE
        rows = list(connection.execute(_DOOMED, {"b_consumers": consumer_ids}))
        connection.execute(_DELETE, {"b_consumers": consumer_ids})
    deleted: Dict[Tuple[int, int], int] = {}
    for provider_id, class_id, amount in rows:
        deleted[(provider_id, class_id)] = deleted.get((provider_id, class_id), 0) + amount
    if any(provider_id not in claimed for provider_id, _ in deleted):
        raise ConcurrentUpdate("the consumer's allocations moved")
    return deleted


@dataclass
class _Target:
    """A provider an allocation write names: its id and the generation read."""

    id: int
    uuid: str
    generation: int


def _claim_providers(connection: Connection, targets: Dict[int, _Target], others: List[int], optimistic: bool) -> None:
    """Count the write in the generation of the providers it claims (``targets``: the
    ones allocated from, ``others``: those of consumers whose allocations are all
    removed by a PUT/POST), in id order.

    ``optimistic``: compare-and-swap the generations read earlier; a provider written
    since then raises :class:`ConcurrentUpdate` (the caller retries).  Otherwise lock
    the rows and bump them whatever they are: the write waits for the writers before
    it instead of losing to them.  A provider that vanished meanwhile raises too."""
    ids = sorted(set(targets) | set(others))
    if not optimistic:
        if connection.execute(_LOCK, {"b_ids": ids}).rowcount != len(ids):
            raise ConcurrentUpdate("a provider was deleted")
        return
    for provider_id in ids:
        target = targets.get(provider_id)
        if target is None:  # an old provider: its generation was not read
            if connection.execute(_LOCK, {"b_ids": [provider_id]}).rowcount != 1:
                raise ConcurrentUpdate("a provider was deleted")
            continue
        swap = {"b_id": provider_id, "b_seen": target.generation, "b_next": target.generation + 1}
        if connection.execute(_SWAP, swap).rowcount != 1:
            raise ConcurrentUpdate(target.uuid)


def replace(
    connection: Connection,
    wanted: List[ConsumerAllocations],
    optimistic: bool = False,
    count_emptied: bool = True,
) -> None:
    """Replace the allocations of each consumer in ``wanted`` (empty = delete).
    ``optimistic``: see :func:`_claim_providers`.

    Which providers get a new generation is upstream's: those of the new
    allocations, and (``count_emptied``, PUT/POST/reshaper, not DELETE) those of a
    consumer whose allocations are all removed.  A provider that only loses some
    consumer's allocations to another provider keeps its generation and is not
    locked: freeing capacity cannot oversubscribe it, ``inventories.used`` is
    changed by an atomic ``used + delta`` and a writer allocating from it holds its
    row and reads ``used`` afterwards (a stale, higher figure only refuses more).

    Everything that can be read without the providers' rows comes first; after they
    are claimed only the writes and the capacity check remain, so a provider's row
    is held for as few round trips as possible."""
    consumer_ids = [item.consumer for item in wanted]
    provider_uuids = sorted({uuid for item in wanted for uuid in item.resources})
    existing: Dict[str, consumer_obj.Consumer] = {}
    targets: Dict[str, _Target] = {}
    held: Dict[Tuple[int, int], int] = {}
    held_by: Dict[str, List[Tuple[int, int]]] = {}  # {consumer: (provider, class) of its old allocations}
    read = {"b_consumers": consumer_ids, "b_uuids": provider_uuids, "b_holders": consumer_ids}
    for kind, text1, text2, text3, text4, int1, int2, int3 in connection.execute(_BEFORE_CLAIM, read):
        if kind == _CONSUMER:
            type_name = text4 or consumer_obj.UNKNOWN_TYPE
            existing[text1] = consumer_obj.Consumer(text1, text2, text3, int1, type_name, int2)
        elif kind == _PROVIDER:
            targets[text1] = _Target(int1, text1, int2)
        else:
            held[(int1, int2)] = held.get((int1, int2), 0) + int(int3)
            held_by.setdefault(text1, []).append((int1, int2))
    for item in wanted:  # 1.28: first of all, as upstream
        if item.check_generation:
            consumer_obj.check_generation(existing.get(item.consumer), item.generation)
    # The first unknown provider in request order, as upstream names it.
    for uuid in (uuid for item in wanted for uuid in item.resources if uuid not in targets):
        raise AllocationProviderNotFound(uuid)
    class_names = [name for item in wanted for per in item.resources.values() for name in per]
    class_ids = resource_class.require_ids(connection, dict.fromkeys(class_names))

    requested: Dict[Tuple[int, int], int] = {}
    rows_to_insert = []
    for item in wanted:
        for uuid, per_class in item.resources.items():
            provider_id = targets[uuid].id
            for name, amount in per_class.items():
                key = (provider_id, class_ids[name])
                requested[key] = requested.get(key, 0) + amount
                rows_to_insert.append(
                    {
                        "resource_provider_id": provider_id,
                        "consumer_id": item.consumer,
                        "resource_class_id": class_ids[name],
                        "used": amount,
                    }
                )

    by_id = {target.id: target for target in targets.values()}
    claimed = set(by_id) | {rp_id for rp_id, _ in held}
    emptied = (
        {rp_id for item in wanted if not item.resources for rp_id, _ in held_by.get(item.consumer, ())}
        if count_emptied
        else set()
    )
    _claim_providers(connection, by_id, sorted(emptied - set(by_id)), optimistic)
    # Every write that leaves a consumer allocations saves its row, and the one that
    # deletes its last allocations deletes it: a consumer without a row (Nova's claim
    # for a new instance) holds nothing to delete.
    if existing:
        held = _delete_old(connection, consumer_ids, held, claimed)
    for item in wanted:
        _save_consumer(connection, item, existing.get(item.consumer))
    named = _named_classes(wanted, class_ids, held_by)
    _check_capacity(connection, requested, rows_to_insert, by_id, class_ids, held, named)
    if rows_to_insert:
        connection.execute(_INSERT, rows_to_insert)
    _update_used(connection, held, requested)


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


def _named_classes(
    wanted: List[ConsumerAllocations], class_ids: Dict[str, int], held_by: Dict[str, List[Tuple[int, int]]]
) -> List[int]:
    """The class ids of the write in upstream's order: each consumer's new classes as
    the body lists them, or the classes of the allocations an emptied consumer loses."""
    named: List[int] = []
    for item in wanted:
        if item.resources:
            named.extend(class_ids[name] for per_class in item.resources.values() for name in per_class)
        else:
            named.extend(class_id for _, class_id in held_by.get(item.consumer, ()))
    return named


def _upstream_class_order(named: List[int], names: Dict[int, str]) -> List[str]:
    """The distinct classes of ``named`` in the order OpenStack Placement names them:
    the iteration order of a Python set of its class ids (a standard class's id is
    its index in os-resource-classes' list, custom ids count from 10000).  Int
    hashing is not randomised, so the order is deterministic; for custom classes the
    upstream id is estimated from ours (equal when both created them in one order)."""
    upstream_ids: Dict[int, str] = {}
    for class_id in named:
        upstream_ids.setdefault(resource_class.upstream_id(names[class_id], class_id), names[class_id])
    return [upstream_ids[upstream_id] for upstream_id in set(upstream_ids)]


def _check_capacity(
    connection: Connection,
    requested: Dict[Tuple[int, int], int],
    rows: List[Dict[str, Any]],
    providers: Dict[int, _Target],
    class_ids: Dict[str, int],
    held: Dict[Tuple[int, int], int],
    named: List[int],
) -> None:
    """Every (provider, class) written must have inventory, the amounts must respect
    min_unit/max_unit/step_size, and the usage of the other consumers plus the
    amount must fit: ``(total - reserved) * allocation_ratio``, or be no more than
    these consumers held there (see :func:`fits`).  The usage is the inventory
    row's ``used`` (read after the providers were claimed, so every write before
    this one is in it) less what these consumers ``held`` before.

    As upstream, providers with inventory of none of the write's classes (``named``)
    come first: one error names every class of the write and every such provider
    (in request order; upstream's is its set order of UUIDs, random per process)."""
    if not requested:
        return
    names = {class_id: name for name, class_id in class_ids.items()}
    provider_ids = sorted({pid for pid, _ in requested})
    inventory = {(row[0], row[1]): row for row in connection.execute(_INVENTORY, {"b_providers": provider_ids})}
    wanted_classes = set(named)
    with_inventory = {pid for pid, class_id in inventory if class_id in wanted_classes}
    missing = list(
        dict.fromkeys(
            providers[row["resource_provider_id"]].uuid
            for row in rows
            if row["resource_provider_id"] not in with_inventory
        )
    )
    if missing:
        if wanted_classes - set(names):  # an emptied consumer's class: not looked up by name
            names = resource_class.names_by_id(connection)
        raise InvalidInventory(", ".join(missing), ", ".join(_upstream_class_order(named, names)))
    # Upstream's order: each allocation in request order gets all its checks (inventory
    # of its class, min/max/step, capacity) before the next one is looked at, so the
    # first wrong allocation names the error; capacity counts the amounts of this
    # (provider, class) so far in the request.
    needed: Dict[Tuple[int, int], int] = {}
    for wanted in rows:
        provider_id, class_id, amount = wanted["resource_provider_id"], wanted["resource_class_id"], wanted["used"]
        key = (provider_id, class_id)
        uuid, name = providers[provider_id].uuid, names[class_id]
        row = inventory.get(key)
        if row is None:
            raise InvalidInventory(uuid, name)
        if amount < row.min_unit or amount > row.max_unit or amount % row.step_size:
            error = InvalidAllocationConstraintsViolated(uuid, name, amount, row.min_unit, row.max_unit, row.step_size)
            log.info("allocation of %s on provider %s refused: %s", name, uuid, error.figures)
            raise error
        needed[key] = needed.get(key, 0) + amount
        if not fits(row, row.used - held.get(key, 0), needed[key], held.get(key, 0)):
            log.info(
                "allocation of %s on provider %s refused: %s requested, %s used by others, capacity %s",
                name, uuid, needed[key], row.used - held.get(key, 0), (row.total - row.reserved) * row.allocation_ratio,
            )  # fmt: skip
            raise InvalidAllocationCapacityExceeded(uuid, name)


def fits(inventory: Any, used_by_others: int, requested: int, held_before: int) -> bool:
    """Whether ``requested`` more fits the inventory row (total, reserved,
    allocation_ratio) next to what other consumers use.

    As upstream, a write that is no worse than before passes even when the provider
    stays over its capacity (its inventory shrank, or its allocation_ratio went
    down, under allocations): ``requested`` not above what the write's consumers
    ``held_before`` on this (provider, class).  Refusing it would leave the consumer
    stuck with its larger allocation; allowing more would deepen the overage."""
    capacity = (inventory.total - inventory.reserved) * inventory.allocation_ratio
    return capacity >= used_by_others + requested or requested <= held_before


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
