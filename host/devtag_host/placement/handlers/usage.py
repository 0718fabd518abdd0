"""/resource_providers/{uuid}/usages and /usages (1.9)."""

from __future__ import annotations

import re

from ..objects import allocation, inventory
from ..objects import resource_provider as rp
from ..web import Call, Reply, cache_headers, query_error


def provider_usages(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        usages = inventory.usages(connection, provider.id)
    return Reply(200, {"resource_provider_generation": provider.generation, "usages": usages}, cache_headers(call))


# Upstream's pattern, as Python's re reads it ("^all" has no end: "allx" passes).
_CONSUMER_TYPE = "^[A-Z0-9_]+$|^all|^unknown$"


_ID = {"type": "string", "minLength": 1, "maxLength": 255}
_SCHEMAS = {"project_id": _ID, "user_id": _ID, "consumer_type": {"type": "string", "pattern": _CONSUMER_TYPE, **_ID}}


def _check_value(key: str, value: str) -> None:
    """One value against upstream's schema, keyword by keyword in its order."""
    bad_type = key == "consumer_type" and not re.search(_CONSUMER_TYPE, value)
    if bad_type or not value or len(value) > 255:
        raise query_error(key, value, _SCHEMAS[key])


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
