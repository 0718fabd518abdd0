"""/resource_providers and /resource_providers/{uuid}."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any, Dict

from .. import errors
from ..errors import Http, Rules, mapped
from ..exception import ResourceClassNotFound, ResourceProviderNotFound, TraitNotFound
from ..objects import resource_class, trait
from ..objects import resource_provider as rp
from ..query import TraitFilter, parse_member_of, parse_traits
from ..schemas import resource_provider as schema
from ..web import (
    Call,
    Reply,
    cache_headers,
    fits_nowhere,
    is_uuid,
    normal_uuid,
    parse_resources,
    provider_url,
    validate,
)


def represent(call: Call, provider: rp.Provider) -> Dict[str, Any]:
    url = provider_url(provider.uuid)
    links = [
        {"rel": "self", "href": url},
        {"rel": "inventories", "href": f"{url}/inventories"},
        {"rel": "usages", "href": f"{url}/usages"},
    ]
    if call.want(1):
        links.append({"rel": "aggregates", "href": f"{url}/aggregates"})
    if call.want(6):
        links.append({"rel": "traits", "href": f"{url}/traits"})
    if call.want(11):
        links.append({"rel": "allocations", "href": f"{url}/allocations"})
    body: Dict[str, Any] = {"uuid": provider.uuid, "name": provider.name, "generation": provider.generation}
    if call.want(14):
        body["parent_provider_uuid"] = provider.parent_provider_uuid
        body["root_provider_uuid"] = provider.root_provider_uuid
    body["links"] = links
    return body


# Names in the query that do not exist: the request is bad, in upstream's words.
_REWORDED: Rules = {
    ResourceClassNotFound: Http(400, prefix="Invalid resource class in resources parameter: "),
    TraitNotFound: Http(400, prefix='Invalid trait(s) in "required" parameter: '),
}


def list_providers(call: Call) -> Reply:
    allowed = {"name", "uuid"}
    if call.want(3):
        allowed.add("member_of")
    if call.want(4):
        allowed.add("resources")
    if call.want(14):
        allowed.add("in_tree")
    if call.want(18):
        allowed.add("required")
    query = call.query_dict(allowed)
    filters: Dict[str, Any] = {}
    if "name" in query:
        filters["name"] = query["name"]
    for key in ("uuid", "in_tree"):
        if key in query:
            if not is_uuid(query[key]):
                raise errors.bad_request(f"Invalid query string parameters: '{query[key][:40]}' is not a 'uuid'")
            filters[key] = query[key]  # as upstream: looked up as spelled (upper case finds nothing)
    if "member_of" in query:
        aggregates = parse_member_of(call.values("member_of"), call.version)
        filters["member_of"] = aggregates.required
        filters["forbidden_aggregates"] = aggregates.forbidden
    wanted_traits = parse_traits(call.values("required"), call.version) if "required" in query else TraitFilter()
    wanted = parse_resources(query["resources"]) if "resources" in query else {}
    with call.store.read() as connection, mapped(_REWORDED):
        # Upstream's order: an unknown in_tree provider, then the required traits (400
        # for an unknown one; no provider has them: none), the forbidden ones (400),
        # no provider in member_of (none), the resource classes (400).  The "none"
        # short cuts matter only when a later name is unknown: checked only then.
        later_unknown = len(resource_class.ids_by_name(connection, wanted)) < len(wanted)
        if "in_tree" in filters and rp.get(connection, filters["in_tree"]) is None:
            return Reply(200, {"resource_providers": []}, cache_headers(call))
        ordered = [name for any_of in wanted_traits.required for name in sorted(any_of)]
        found = trait.require_ids(connection, ordered)
        filters["required_trait_ids"] = [{found[name] for name in any_of} for any_of in wanted_traits.required]
        later_unknown = later_unknown or len(trait.ids_by_name(connection, wanted_traits.forbidden)) < len(
            wanted_traits.forbidden
        )
        if (
            later_unknown
            and ordered
            and not rp.list_providers(connection, required_trait_ids=filters["required_trait_ids"])
        ):
            return Reply(200, {"resource_providers": []}, cache_headers(call))
        found = trait.require_ids(connection, sorted(wanted_traits.forbidden))
        filters["forbidden_trait_ids"] = set(found.values())
        if (
            later_unknown
            and filters.get("member_of")
            and not rp.list_providers(connection, member_of=filters["member_of"])
        ):
            return Reply(200, {"resource_providers": []}, cache_headers(call))
        if wanted:
            ids = resource_class.require_ids(connection, wanted)
            if fits_nowhere(wanted):
                return Reply(200, {"resource_providers": []}, cache_headers(call))
            filters["resources"] = {ids[name]: amount for name, amount in wanted.items()}
        providers = rp.list_providers(connection, **filters)
    body = {"resource_providers": [represent(call, provider) for provider in providers]}
    return Reply(200, body, cache_headers(call))


def create_provider(call: Call) -> Reply:
    body = validate(call.body, schema.POST_V1_14 if call.want(14) else schema.POST_V1_0)
    uuid = normal_uuid(body["uuid"]) if "uuid" in body else str(uuidlib.uuid4())
    parent = body.get("parent_provider_uuid")
    provider = rp.create_new(call.store, body["name"], uuid, normal_uuid(parent) if parent else None)
    location = {"location": provider_url(provider.uuid)}
    if call.want(20):  # 1.20: the new provider, as GET shows it
        return Reply(200, represent(call, provider), {**location, **cache_headers(call)})
    return Reply(201, None, location)


def get_provider(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
    return Reply(200, represent(call, provider), cache_headers(call))


def update_provider(call: Call) -> Reply:
    with call.store.write() as connection:
        # As upstream: an unknown provider is a 404 whatever the body says.
        provider = rp.get_or_404(connection, call.params["uuid"])
        body = validate(call.body, schema.PUT_V1_14 if call.want(14) else schema.PUT_V1_0)
        parent = body.get("parent_provider_uuid")
        provider = rp.update(
            connection,
            provider,
            body["name"],
            normal_uuid(parent) if parent else None,
            set_parent="parent_provider_uuid" in body,
            allow_reparent=call.want(37),
        )
    return Reply(200, represent(call, provider), cache_headers(call))  # 1.15, as upstream


_DELETE_WORDS: Rules = {
    ResourceProviderNotFound: Http(404, detail=lambda exc: f"{exc} for delete"),
}


def delete_provider(call: Call) -> Reply:
    with call.store.write() as connection, mapped(_DELETE_WORDS):
        rp.delete(connection, rp.get_or_404(connection, call.params["uuid"]))
    return Reply(204)
