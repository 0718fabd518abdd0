"""Bodies of the inventory requests."""

from copy import deepcopy
from typing import Any

from ..db import MAX_INT

_FIELDS = {
    "total": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
    "reserved": {"type": "integer", "maximum": MAX_INT, "minimum": 0},
    "min_unit": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
    "max_unit": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
    "step_size": {"type": "integer", "maximum": MAX_INT, "minimum": 1},
    "allocation_ratio": {"type": "number", "maximum": 3.40282e38, "exclusiveMinimum": True, "minimum": 0},
}
RESOURCE_CLASS = {"type": "string", "pattern": "^[A-Z0-9_]+$", "maxLength": 255}

POST = {
    "type": "object",
    "properties": {"resource_class": RESOURCE_CLASS, **_FIELDS},
    "required": ["total", "resource_class"],
    "additionalProperties": False,
}

PUT_ONE: dict[str, Any] = {
    "type": "object",
    "properties": {"resource_provider_generation": {"type": "integer"}, **_FIELDS},
    "required": ["total", "resource_provider_generation"],
    "additionalProperties": False,
}

_ONE_IN_SET = deepcopy(PUT_ONE)
_ONE_IN_SET["properties"].pop("resource_provider_generation")
_ONE_IN_SET["required"] = ["total"]

PUT_ALL = {
    "type": "object",
    "properties": {
        "resource_provider_generation": {"type": "integer"},
        "inventories": {
            "type": "object",
            "patternProperties": {"^[A-Z0-9_]+$": _ONE_IN_SET},
            "additionalProperties": False,
        },
    },
    "required": ["inventories", "resource_provider_generation"],
    "additionalProperties": False,
}
