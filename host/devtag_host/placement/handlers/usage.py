"""/resource_providers/{uuid}/usages and /usages (1.9)."""

from __future__ import annotations

import re

from .. import errors
from ..objects import allocation, inventory
from ..objects import resource_provider as rp
from ..web import Call, Reply, cache_headers


def provider_usages(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        usages = inventory.usages(connection, provider.id)
    return Reply(200, {"resource_provider_generation": provider.generation, "usages": usages}, cache_headers(call))


_CONSUMER_TYPE = re.compile(r"^([A-Z0-9_]+|all|unknown)$")


def project_usages(call: Call) -> Reply:
    query = call.query_dict({"project_id", "user_id", "consumer_type"} if call.want(38) else {"project_id", "user_id"})
    if "project_id" not in query:
        raise errors.bad_request("Invalid query string parameters: 'project_id' is a required property")
    for key, value in query.items():
        if not value or len(value) > 255:
            raise errors.bad_request(f"Invalid query string parameters: bad {key}")
    consumer_type = query.get("consumer_type")
    if consumer_type is not None and not _CONSUMER_TYPE.match(consumer_type):
        raise errors.bad_request(
            f"Invalid query string parameters: '{consumer_type[:255]}' does not match '^([A-Z0-9_]+|all|unknown)$'"
        )
    with call.store.read() as connection:
        if call.want(38):  # grouped by consumer type, with a consumer count
            usages = allocation.usages_by_consumer_type(
                connection, query["project_id"], query.get("user_id"), consumer_type
            )
            return Reply(200, {"usages": usages}, cache_headers(call))
        flat = allocation.usages_by_project(connection, query["project_id"], query.get("user_id"))
    return Reply(200, {"usages": flat}, cache_headers(call))
