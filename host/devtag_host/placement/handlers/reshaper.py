"""POST /reshaper (1.30)."""

from __future__ import annotations

from typing import Dict, Tuple

from .. import errors
from ..errors import Http, Rules, mapped
from ..exception import PlacementException, ResourceClassNotFound, ResourceProviderNotFound
from ..objects import inventory as inv
from ..objects import reshaper
from ..schemas import reshaper as schema
from ..web import Call, Reply, normal_uuid, validate
from .allocation import merged_resources, wanted_allocations


def _provider_not_found(exc: PlacementException) -> str:
    uuid = exc.uuid if isinstance(exc, ResourceProviderNotFound) else "?"
    return f"Resource provider {uuid} in inventories not found: {exc}"


_REWORDED: Rules = {
    ResourceProviderNotFound: Http(400, errors.RESOURCE_PROVIDER_NOT_FOUND, detail=_provider_not_found),
    ResourceClassNotFound: Http(400, prefix="malformed reshaper data: "),
}


def reshape(call: Call) -> Reply:
    body = validate(call.body, schema.post_schema(call.version.minor))
    inventories: Dict[str, Tuple[int, Dict[str, inv.Inventory]]] = {}
    for uuid, item in body["inventories"].items():
        # No capacity check of the inventories here: upstream's reshaper has none.
        wanted = {name: inv.Inventory.from_body(one) for name, one in item["inventories"].items()}
        inventories[normal_uuid(uuid)] = (item["resource_provider_generation"], wanted)
    consumers = [
        wanted_allocations(call, consumer, merged_resources(item), item)
        for consumer, item in body["allocations"].items()
    ]
    with call.store.write() as connection, mapped(_REWORDED):
        reshaper.reshape(connection, inventories, consumers)
    return Reply(204)
