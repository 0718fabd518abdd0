"""/resource_providers/{uuid}/aggregates (1.1; with the provider generation 1.19)."""

from __future__ import annotations

from typing import Any, Dict, List

from ..objects import aggregate
from ..objects import resource_provider as rp
from ..objects.resource_provider import check_generation
from ..schemas import aggregate as schema
from ..web import Call, Reply, cache_headers, normal_uuid, validate


def _body(call: Call, aggregates: List[str], generation: int) -> Dict[str, Any]:
    body: Dict[str, Any] = {"aggregates": aggregates}
    if call.want(19):
        body["resource_provider_generation"] = generation
    return body


def get_aggregates(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        aggregates = aggregate.of_provider(connection, provider.id)
    return Reply(200, _body(call, aggregates, provider.generation), cache_headers(call))


def set_aggregates(call: Call) -> Reply:
    """Before 1.19 a plain list and no generation; from 1.19 the generation the client
    read is compared (409 ``placement.concurrent_update``) and bumped, as upstream."""
    if call.want(19):
        body = validate(call.body, schema.PUT_V1_19)
        listed, seen = body["aggregates"], body["resource_provider_generation"]
    else:
        listed, seen = validate(call.body, schema.PUT), None
    wanted = sorted({normal_uuid(item) for item in listed})
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        if seen is not None:
            check_generation(provider, seen, rp.GENERATION_CHANGED)
            rp.bump_generation(connection, provider)
        aggregate.set_for_provider(connection, provider, wanted)
    # The list as the client sent it, as upstream answers (a GET reads them sorted).
    return Reply(200, _body(call, list(listed), provider.generation), cache_headers(call))
