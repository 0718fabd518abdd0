"""/resource_providers/{uuid}/usages and /usages (1.9)."""

from __future__ import annotations

from .. import errors
from ..objects import allocation, inventory
from ..objects import resource_provider as rp
from ..web import Call, Reply, cache_headers


def provider_usages(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        usages = inventory.usages(connection, provider.id)
    return Reply(200, {"resource_provider_generation": provider.generation, "usages": usages}, cache_headers(call))


def project_usages(call: Call) -> Reply:
    query = call.query_dict({"project_id", "user_id"})
    if "project_id" not in query:
        raise errors.bad_request("Invalid query string parameters: 'project_id' is a required property")
    for key, value in query.items():
        if not value or len(value) > 255:
            raise errors.bad_request(f"Invalid query string parameters: bad {key}")
    with call.store.read() as connection:
        usages = allocation.usages_by_project(connection, query["project_id"], query.get("user_id"))
    return Reply(200, {"usages": usages}, cache_headers(call))
