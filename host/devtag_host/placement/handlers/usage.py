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


# Upstream's pattern, as Python's re reads it ("^all" has no end: "allx" passes).
_CONSUMER_TYPE = "^[A-Z0-9_]+$|^all|^unknown$"


def _check_value(key: str, value: str) -> None:
    """One value against upstream's schema, keyword by keyword in its order."""
    prefix = "Invalid query string parameters: "
    if key == "consumer_type" and not re.search(_CONSUMER_TYPE, value):
        raise errors.bad_request(f"{prefix}{value[:300]!r} does not match {_CONSUMER_TYPE!r}")
    if not value:
        raise errors.bad_request(f"{prefix}'' should be non-empty")
    if len(value) > 255:
        raise errors.bad_request(f"{prefix}{value[:300]!r} is too long")


def project_usages(call: Call) -> Reply:
    allowed = {"project_id", "user_id", "consumer_type"} if call.want(38) else {"project_id", "user_id"}
    query = call.query_dict(allowed, required=("project_id",))
    # jsonschema reports the error of the property whose name sorts last.
    for key in sorted(query, reverse=True):
        _check_value(key, query[key])
    consumer_type = query.get("consumer_type")
    with call.store.read() as connection:
        if call.want(38):  # grouped by consumer type, with a consumer count
            usages = allocation.usages_by_consumer_type(
                connection, query["project_id"], query.get("user_id"), consumer_type
            )
            return Reply(200, {"usages": usages}, cache_headers(call))
        flat = allocation.usages_by_project(connection, query["project_id"], query.get("user_id"))
    return Reply(200, {"usages": flat}, cache_headers(call))
