"""/resource_providers and /resource_providers/{uuid}."""

from __future__ import annotations

from typing import Any, Dict

from .. import errors
from ..errors import Http, mapped
from ..exception import TraitNotFound
from ..objects import resource_class, trait
from ..objects import resource_provider as rp
from ..query import parse_member_of, parse_traits
from ..schemas import resource_provider as schema
from ..web import Call, Reply, cache_headers, is_uuid, normal_uuid, parse_resources, provider_url, validate


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
    wanted_traits = parse_traits(call.values("required"), call.version) if "required" in query else None
    with call.store.read() as connection:
        if "resources" in query:
            wanted = parse_resources(query["resources"])
            ids = resource_class.ids_by_name(connection, wanted)
            unknown = [name for name in wanted if name not in ids]
            if unknown:
                raise errors.bad_request(
                    f"Invalid resource class in resources parameter: No such resource class {unknown[0]}."
                )
            filters["resources"] = {ids[name]: amount for name, amount in wanted.items()}
        if wanted_traits:
            # Upstream looks the required groups up in order, then the forbidden ones.
            ordered = [name for any_of in wanted_traits.required for name in sorted(any_of)]
            with mapped({TraitNotFound: Http(400, prefix='Invalid trait(s) in "required" parameter: ')}):
                found = trait.require_ids(connection, [*ordered, *sorted(wanted_traits.forbidden)])
            filters["required_trait_ids"] = [{found[name] for name in any_of} for any_of in wanted_traits.required]
            filters["forbidden_trait_ids"] = {found[name] for name in wanted_traits.forbidden}
        providers = rp.list_providers(connection, **filters)
    body = {"resource_providers": [represent(call, provider) for provider in providers]}
    return Reply(200, body, cache_headers(call))


def create_provider(call: Call) -> Reply:
    body = validate(call.body, schema.POST_V1_14 if call.want(14) else schema.POST_V1_0)
    uuid = normal_uuid(body["uuid"]) if "uuid" in body else None
    parent = body.get("parent_provider_uuid")
    with call.store.write() as connection:
        provider = rp.create(connection, body["name"], uuid, normal_uuid(parent) if parent else None)
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


def delete_provider(call: Call) -> Reply:
    with call.store.write() as connection:
        rp.delete(connection, rp.get_or_404(connection, call.params["uuid"]))
    return Reply(204)
