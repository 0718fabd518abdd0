"""/resource_providers/{uuid}/inventories[/{resource_class}]."""

from __future__ import annotations

from typing import Any, Dict

from .. import errors
from ..errors import Http, mapped
from ..exception import InventoryNotFound, ResourceClassNotFound
from ..objects import inventory as inv
from ..objects import resource_provider as rp
from ..objects.resource_provider import check_generation
from ..schemas import inventory as schema
from ..web import Call, Reply, cache_headers, provider_url, validate


def _one(generation: int, inventory: inv.Inventory) -> Dict[str, Any]:
    return {"resource_provider_generation": generation, **inventory.as_dict()}


def _all(generation: int, inventories: Dict[str, inv.Inventory]) -> Dict[str, Any]:
    return {
        "resource_provider_generation": generation,
        "inventories": {name: item.as_dict() for name, item in inventories.items()},
    }


def _cache_headers(call: Call, any_inventory: bool) -> Dict[str, str]:
    """1.15, as upstream: no-cache on every inventory answer; last-modified
    only when there is an inventory to date it by."""
    headers = cache_headers(call)
    if not any_inventory:
        headers.pop("last-modified", None)
    return headers


def list_inventories(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        inventories = inv.of_provider(connection, provider.id)
    return Reply(200, _all(provider.generation, inventories), _cache_headers(call, bool(inventories)))


def create_inventory(call: Call) -> Reply:
    body = validate(call.body, schema.POST)
    name = body["resource_class"]
    inventory = inv.Inventory.from_body(body)
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        inv.validate(name, inventory, call.want(26), provider.uuid, "create")
        prefix = f"Unable to create inventory for resource provider {provider.uuid}: "
        with mapped({ResourceClassNotFound: Http(400, prefix=prefix)}):
            inv.add(connection, provider, name, inventory)
    location = f"{provider_url(provider.uuid)}/inventories/{name}"
    return Reply(201, _one(provider.generation, inventory), {"location": location, **_cache_headers(call, True)})


def replace_inventories(call: Call) -> Reply:
    body = validate(call.body, schema.PUT_ALL)
    for item in body["inventories"].values():
        if not isinstance(item, dict):  # a key outside the schema's pattern: no schema checked it
            raise errors.bad_request(f"JSON does not validate: {repr(item)[:100]} is not of type 'object'")
    wanted = {name: inv.Inventory.from_body(item) for name, item in body["inventories"].items()}
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        check_generation(provider, body["resource_provider_generation"])  # before the capacities, as upstream
        for name, inventory in wanted.items():
            inv.validate(name, inventory, call.want(26), provider.uuid, "update")
        prefix = f"Unknown resource class in inventory for resource provider {provider.uuid}: "
        with mapped({ResourceClassNotFound: Http(400, prefix=prefix)}):
            inv.replace_all(connection, provider, wanted)
    return Reply(200, _all(provider.generation, dict(sorted(wanted.items()))), _cache_headers(call, bool(wanted)))


def delete_inventories(call: Call) -> Reply:
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        inv.replace_all(connection, provider, {})
    return Reply(204)


def get_inventory(call: Call) -> Reply:
    name = call.params["resource_class"]
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        inventories = inv.of_provider(connection, provider.id)
    if name not in inventories:
        raise errors.not_found(f"No inventory of class {name} for {provider.uuid}")
    return Reply(200, _one(provider.generation, inventories[name]), _cache_headers(call, True))


def update_inventory(call: Call) -> Reply:
    body = validate(call.body, schema.PUT_ONE)
    name = call.params["resource_class"]
    inventory = inv.Inventory.from_body(body)
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        check_generation(provider, body["resource_provider_generation"])
        inv.validate(name, inventory, call.want(26), provider.uuid, "update")
        # Upstream's words, which clients match.
        prefix = f"No inventory record with resource class for resource provider {provider.uuid}: "
        with mapped({InventoryNotFound: Http(400, prefix=prefix)}):
            inv.update(connection, provider, name, inventory)
    return Reply(200, _one(provider.generation, inventory), _cache_headers(call, True))


def delete_inventory(call: Call) -> Reply:
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        inv.delete(connection, provider, call.params["resource_class"])
    return Reply(204)
