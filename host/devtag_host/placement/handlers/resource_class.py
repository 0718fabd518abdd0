"""/resource_classes (1.2)."""

from __future__ import annotations

import re
from typing import Any, Dict

from .. import errors
from ..objects import resource_class
from ..schemas import resource_class as schema
from ..web import Call, Reply, cache_headers, decode_json, validate

_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]+\Z")


def _represent(name: str) -> Dict[str, Any]:
    return {"name": name, "links": [{"rel": "self", "href": f"/resource_classes/{name}"}]}


def list_classes(call: Call) -> Reply:
    with call.store.read() as connection:
        names = resource_class.list_all(connection)
    return Reply(200, {"resource_classes": [_represent(name) for name in names]}, cache_headers(call))


def create_class(call: Call) -> Reply:
    body = validate(call.body, schema.POST)
    with call.store.write() as connection:
        if not resource_class.create(connection, body["name"]):
            raise errors.conflict(
                f"Conflicting resource class already exists: {body['name']}"
            )  # upstream names no code
    return Reply(201, None, {"location": f"/resource_classes/{body['name']}"})


def get_class(call: Call) -> Reply:
    name = call.params["name"]
    with call.store.read() as connection:
        if not resource_class.exists(connection, name):
            raise errors.not_found(f"No such resource class {name}.")
    return Reply(200, _represent(name), cache_headers(call))


def put_class(call: Call) -> Reply:
    name = call.params["name"]
    if call.want(7):
        if not _CUSTOM.match(name) or len(name) > 255:
            validate({"name": name}, schema.PUT_V1_2)  # upstream checks the name as this body
            raise errors.bad_request(f"JSON does not validate: {name[:300]!r} does not match '^CUSTOM_[A-Z0-9_]+$'")
        with call.store.write() as connection:
            created = resource_class.create(connection, name)
        return Reply(201 if created else 204, None, {"location": f"/resource_classes/{name}"})
    body = validate(decode_json(b"") if call.body is None else call.body, schema.PUT_V1_2)
    with call.store.write() as connection:
        resource_class.rename(connection, name, body["name"])
    return Reply(200, _represent(body["name"]))


def delete_class(call: Call) -> Reply:
    with call.store.write() as connection:
        resource_class.delete(connection, call.params["name"])
    return Reply(204)
