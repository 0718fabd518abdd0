"""Inventories of a provider: one row per resource class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

from sqlalchemy import bindparam, func, select
from sqlalchemy.engine import Connection

from ..db import MAX_INT, allocations, inventories, resource_classes
from ..exception import (
    InvalidInventoryCapacity,
    InventoryExists,
    InventoryInUse,
    InventoryNotFound,
    ResourceClassNotFound,
)
from . import driver_sql, resource_class
from .resource_provider import Provider, bump_generation

DEFAULTS: Dict[str, Any] = {"reserved": 0, "min_unit": 1, "max_unit": MAX_INT, "step_size": 1, "allocation_ratio": 1.0}
FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio")


@dataclass
class Inventory:
    total: int
    reserved: int = 0
    min_unit: int = 1
    max_unit: int = MAX_INT
    step_size: int = 1
    allocation_ratio: float = 1.0

    @classmethod
    def from_body(cls, body: Dict[str, Any]) -> Inventory:
        values: Dict[str, Any] = {field: body.get(field, DEFAULTS.get(field)) for field in FIELDS}
        values["allocation_ratio"] = float(values["allocation_ratio"])
        return cls(**values)

    def as_dict(self) -> Dict[str, Any]:
        return {field: getattr(self, field) for field in FIELDS}  # dataclasses.asdict deep-copies: slow

    @property
    def capacity(self) -> int:
        return int((self.total - self.reserved) * self.allocation_ratio)


def validate(name: str, inventory: Inventory, reserved_can_be_total: bool, provider_uuid: str, action: str) -> None:
    """Upstream's only check of an inventory's numbers: its capacity
    ``int((total - reserved) * allocation_ratio)`` must be positive before 1.26
    and not negative from 1.26 (``reserved == total`` allowed), in upstream's
    words (``action``: "create" or "update")."""
    if inventory.capacity < 0 or (not reserved_can_be_total and inventory.capacity == 0):
        relation = "greater than total" if reserved_can_be_total else "greater than or equal to total"
        raise InvalidInventoryCapacity(
            f"Unable to {action} inventory for resource provider {provider_uuid}: Invalid inventory for '{name}' "
            f"on resource provider '{provider_uuid}'. The reserved value is {relation}."
        )


_OF_PROVIDER = (
    select(resource_classes.c.name, *(inventories.c[field] for field in FIELDS))
    .join(resource_classes, resource_classes.c.id == inventories.c.resource_class_id)
    .where(inventories.c.resource_provider_id == bindparam("b_provider"))
    .order_by(resource_classes.c.name)
)
_DELETE_ALL = inventories.delete().where(inventories.c.resource_provider_id == bindparam("b_provider"))
_INSERT = inventories.insert().values(
    resource_provider_id=bindparam("b_provider"),
    resource_class_id=bindparam("b_class"),
    used=bindparam("b_used"),
    **{field: bindparam(f"b_{field}") for field in FIELDS},
)


def of_provider(connection: Connection, provider_id: int) -> Dict[str, Inventory]:
    rows = connection.execute(_OF_PROVIDER, {"b_provider": provider_id}).all()
    return {name: Inventory(*values) for name, *values in rows}


_USED_OF_PROVIDER = (
    select(resource_classes.c.name, inventories.c.used, inventories.c.resource_class_id)
    .join(resource_classes, resource_classes.c.id == inventories.c.resource_class_id)
    .where(inventories.c.resource_provider_id == bindparam("b_provider"))
)


def _used_of_provider(connection: Connection, provider_id: int) -> Dict[str, Tuple[int, int]]:
    """{class name: (allocated amount, class id)} of each inventory row of the provider."""
    rows = driver_sql.fetch_all(connection, _USED_OF_PROVIDER, {"b_provider": provider_id})
    return {name: (used, class_id) for name, used, class_id in rows}


def _usage(connection: Connection, provider_id: int) -> Dict[str, int]:
    query = (
        select(resource_classes.c.name, func.sum(allocations.c.used))
        .join(allocations, allocations.c.resource_class_id == resource_classes.c.id)
        .where(allocations.c.resource_provider_id == provider_id)
        .group_by(resource_classes.c.name)
    )
    return {name: int(used) for name, used in connection.execute(query)}


def replace_all(
    connection: Connection,
    provider: Provider,
    wanted: Dict[str, Inventory],
    check_in_use: bool = True,
) -> None:
    """Set the provider's whole inventory (PUT .../inventories); bumps the generation.
    The reshaper (1.30) moves allocations in the same transaction and checks after
    it instead (``check_in_use=False``)."""
    class_ids = resource_class.require_ids(connection, wanted)
    used = _used_of_provider(connection, provider.id)
    removed = set(used) - set(wanted)
    busy = [name for name in removed if used[name][0]]
    if busy and check_in_use:
        # In upstream's order: by its class ids (its query groups by them).
        raise InventoryInUse(
            provider.uuid, sorted(busy, key=lambda name: resource_class.upstream_id(name, used[name][1]))
        )
    bump_generation(connection, provider)
    if used:  # a new provider has no rows to delete (the load path: one statement fewer)
        driver_sql.execute(connection, _DELETE_ALL, {"b_provider": provider.id})
    if wanted:
        driver_sql.execute_many(
            connection,
            _INSERT,
            [
                {
                    "b_provider": provider.id,
                    "b_class": class_ids[name],
                    "b_used": used[name][0] if name in used else 0,  # the allocations stay: so does their sum
                    **{f"b_{field}": value for field, value in inventory.as_dict().items()},
                }
                for name, inventory in wanted.items()
            ],
        )


def add(connection: Connection, provider: Provider, name: str, inventory: Inventory) -> None:
    current = of_provider(connection, provider.id)
    if name in current:
        raise InventoryExists(provider.uuid, name)
    current[name] = inventory
    replace_all(connection, provider, current)


def update(connection: Connection, provider: Provider, name: str, inventory: Inventory) -> None:
    current = of_provider(connection, provider.id)
    if name not in current:
        if not resource_class.ids_by_name(connection, [name]):
            raise ResourceClassNotFound(name)
        raise InventoryNotFound(provider.uuid, name)
    current[name] = inventory
    replace_all(connection, provider, current)


def delete(connection: Connection, provider: Provider, name: str) -> None:
    current = of_provider(connection, provider.id)
    if name not in current:
        raise InventoryNotFound(provider.uuid, name)
    del current[name]
    replace_all(connection, provider, current)


def usages(connection: Connection, provider_id: int) -> Dict[str, int]:
    """Usage of every inventoried class (0 when unused) plus any other allocated class."""
    used = _usage(connection, provider_id)
    result = {name: 0 for name in of_provider(connection, provider_id)}
    result.update(used)
    return result
