"""/traits and /resource_providers/{uuid}/traits (1.6)."""

from __future__ import annotations

import re
from typing import Any, Dict

from .. import errors
from ..objects import resource_provider as rp
from ..objects import trait
from ..schemas import trait as schema
from ..web import Call, Reply, cache_headers, validate

_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]+\Z")


def list_traits(call: Call) -> Reply:
    query = call.query_dict({"name", "associated"})
    filters: Dict[str, Any] = {}
    name = query.get("name")
    if name is not None:
        # Upstream's parsing: OP:VALUE, where only "in" and "startswith" filter;
        # any other OP lists every trait (no error), and no colon is a 400.
        op, colon, value = name.partition(":")
        if not colon:
            raise errors.bad_request(
                "Badly formatted name parameter. Expected name query string parameter in form: "
                f'?name=[in|startswith]:[name1,name2|prefix]. Got: "{name}"'
            )
        if op == "in":
            filters["names"] = value.split(",")
        elif op == "startswith":
            filters["prefix"] = value
    if "associated" in query:
        value = query["associated"].lower()
        if value not in ("true", "false"):
            raise errors.bad_request('The query parameter "associated" only accepts "true" or "false"')
        filters["associated"] = value == "true"
    with call.store.read() as connection:
        names = trait.list_traits(connection, **filters)
    return Reply(200, {"traits": names}, cache_headers(call))


def get_trait(call: Call) -> Reply:
    name = call.params["name"]
    with call.store.read() as connection:
        found = trait.ids_by_name(connection, [name])
    if not found:
        raise errors.not_found(f"No such trait(s): {name}.")
    return Reply(204, None, cache_headers(call))


def put_trait(call: Call) -> Reply:
    name = call.params["name"]
    if not _CUSTOM.match(name) or len(name) > 255:
        raise errors.bad_request(
            "The trait is invalid. A valid trait must be no longer than 255 characters, start with the prefix "
            '"CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"'
        )
    with call.store.write() as connection:
        created = trait.create(connection, name)
    return Reply(201 if created else 204, None, {"location": f"/traits/{name}", **cache_headers(call)})


def delete_trait(call: Call) -> Reply:
    with call.store.write() as connection:
        trait.delete(connection, call.params["name"])
    return Reply(204)


def get_provider_traits(call: Call) -> Reply:
    with call.store.read() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        names = trait.of_provider(connection, provider.id)
    return Reply(200, {"traits": names, "resource_provider_generation": provider.generation}, cache_headers(call))


def set_provider_traits(call: Call) -> Reply:
    body = validate(call.body, schema.PUT_PROVIDER_TRAITS)  # as upstream: the body before the provider
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        rp.check_generation(provider, body["resource_provider_generation"], rp.GENERATION_CHANGED)  # then this
        found = trait.ids_by_name(connection, body["traits"])
        missing = sorted(set(body["traits"]) - set(found))
        if missing:  # upstream names them all here (in no particular order)
            raise errors.bad_request(f"No such trait {', '.join(missing)}")
        trait.set_for_provider(connection, provider, body["traits"], found)
    names = sorted(set(body["traits"]))
    return Reply(200, {"traits": names, "resource_provider_generation": provider.generation}, cache_headers(call))


def delete_provider_traits(call: Call) -> Reply:
    with call.store.write() as connection:
        provider = rp.get_or_404(connection, call.params["uuid"])
        trait.set_for_provider(connection, provider, [])
    return Reply(204)
