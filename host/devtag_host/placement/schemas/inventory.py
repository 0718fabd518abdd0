"""Bodies of the inventory requests: OpenStack Placement's schemas, key for key
and in its key order (the reference validator reports the first of equally
relevant errors in schema order).  Upstream sets no lower bound on
``allocation_ratio``: the capacity check refuses what cannot hold anything."""

from copy import deepcopy
from typing import Any

from ..db import MAX_INT

SQL_SP_FLOAT_MAX = 3.40282e38


def _count(minimum: int) -> dict:
    return {"type": "integer", "maximum": MAX_INT, "minimum": minimum}


PUT_ONE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "total": _count(1),
        "reserved": _count(0),
        "min_unit": _count(1),
        "max_unit": _count(1),
        "step_size": _count(1),
        "allocation_ratio": {"type": "number", "maximum": SQL_SP_FLOAT_MAX},
    },
    "required": ["total", "resource_provider_generation"],
    "additionalProperties": False,
}

POST = deepcopy(PUT_ONE)
POST["properties"]["resource_class"] = {"type": "string", "pattern": "^[A-Z0-9_]+$"}
POST["required"] = ["total", "resource_class"]

# One record of a PUT of all inventories (the generation may come along, unused).
_ONE_IN_SET = deepcopy(PUT_ONE)
_ONE_IN_SET["required"] = ["total"]

# Keys not matching the pattern are not refused here: they are unknown resource classes.
PUT_ALL = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "inventories": {"type": "object", "patternProperties": {"^[A-Z0-9_]+$": _ONE_IN_SET}},
    },
    "required": ["resource_provider_generation", "inventories"],
    "additionalProperties": False,
}
