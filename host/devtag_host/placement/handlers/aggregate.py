"""/resource_providers/{uuid}/aggregates (1.1)."""

from __future__ import annotations

from ..objects import aggregate
from ..objects import resource_provider as rp
from ..schemas import aggregate as schema
from ..web import Call, Reply, cache_headers, normal_uuid, validate


def get_aggregates(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        aggregates = aggregate.of_provider(connection, provider.id)
    return Reply(200, {"aggregates": aggregates}, cache_headers(call))


def set_aggregates(call: Call) -> Reply:
    body = validate(call.body, schema.PUT)
    wanted = sorted({normal_uuid(item) for item in body})
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        aggregate.set_for_provider(connection, provider, wanted)
    return Reply(200, {"aggregates": wanted})
