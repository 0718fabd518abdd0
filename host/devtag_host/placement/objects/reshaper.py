"""POST /reshaper (1.30): move inventory and the allocations against it between
providers (a flat compute node's VGPU into a child provider...) in one
transaction, so no allocation is ever lost or counted twice."""

from __future__ import annotations

from typing import Dict, List, Tuple

from sqlalchemy import and_, exists, select
from sqlalchemy.engine import Connection

from ..db import allocations, inventories, resource_classes, resource_providers
from ..exception import AllocationProviderNotFound, GenerationConflict, InventoryInUse, ResourceProviderNotFound
from . import allocation, consumer
from . import inventory as inv
from . import resource_provider as rp


def reshape(
    connection: Connection,
    wanted_inventories: Dict[str, Tuple[int, Dict[str, inv.Inventory]]],
    wanted_allocations: List[allocation.ConsumerAllocations],
) -> None:
    """``wanted_inventories``: {provider uuid: (generation read, {class: inventory})};
    ``wanted_allocations``: the complete allocations of every consumer that moves.

    Upstream's order of checks: each provider of the inventories (in the body's
    order) exists and has the generation read, then each consumer's generation,
    then the allocations' providers exist, then classes, usage and capacity."""
    providers = []
    for uuid, (generation, wanted) in wanted_inventories.items():
        provider = rp.get(connection, uuid)
        if provider is None:
            raise ResourceProviderNotFound(uuid)
        if provider.generation != generation:
            raise GenerationConflict(
                f"resource provider generation conflict for provider {uuid}: actual: {provider.generation}, "
                f"given: {generation}",
                uuid,
            )
        providers.append((provider, wanted))
    existing = consumer.by_uuid(connection, [item.consumer for item in wanted_allocations])
    for item in wanted_allocations:
        if item.check_generation:
            consumer.check_generation(existing.get(item.consumer), item.generation)
    named = [uuid for item in wanted_allocations for uuid in item.resources]
    known = rp.ids_by_uuid(connection, named)
    for uuid in named:
        if uuid not in known:
            raise AllocationProviderNotFound(uuid)
    for provider, wanted in providers:
        if wanted:
            # Upstream sets a non-empty inventory twice (an interim union of the old
            # and the new one before the allocations move, then the new one): two
            # generations; an empty one once.  Clients see the generation.
            rp.bump_generation(connection, provider)
        inv.replace_all(connection, provider, wanted, check_in_use=False)
    if wanted_allocations:
        allocation.replace(connection, wanted_allocations)
    _no_allocation_without_inventory(connection, [provider.id for provider, _wanted in providers])


def _no_allocation_without_inventory(connection: Connection, provider_ids: List[int]) -> None:
    """Allocations of consumers the request did not move may not lose their inventory."""
    if not provider_ids:
        return
    orphan = connection.execute(
        select(resource_providers.c.uuid, resource_classes.c.name)
        .select_from(
            allocations.join(resource_providers, resource_providers.c.id == allocations.c.resource_provider_id).join(
                resource_classes, resource_classes.c.id == allocations.c.resource_class_id
            )
        )
        .where(
            allocations.c.resource_provider_id.in_(provider_ids),
            ~exists().where(
                and_(
                    inventories.c.resource_provider_id == allocations.c.resource_provider_id,
                    inventories.c.resource_class_id == allocations.c.resource_class_id,
                )
            ),
        )
        .limit(1)
    ).first()
    if orphan is not None:
        raise InventoryInUse(orphan[0], [orphan[1]])
