"""Bodies of PUT /allocations/{consumer} (list 1.0-1.11, dict 1.12+) and POST /allocations (1.13)."""

from copy import deepcopy

from ..db import MAX_INT

_RESOURCES = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {"^[0-9A-Z_]+$": {"type": "integer", "minimum": 1, "maximum": MAX_INT}},
    "additionalProperties": False,
}
_PROJECT = {"type": "string", "minLength": 1, "maxLength": 255}

PUT_V1_0 = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "resource_provider": {
                        "type": "object",
                        "properties": {"uuid": {"type": "string", "format": "uuid"}},
                        "additionalProperties": False,
                        "required": ["uuid"],
                    },
                    "resources": _RESOURCES,
                },
                "required": ["resource_provider", "resources"],
                "additionalProperties": False,
            },
        },
        "project_id": _PROJECT,
        "user_id": _PROJECT,
    },
    "required": ["allocations"],
    "additionalProperties": False,
}
PUT_V1_8 = deepcopy(PUT_V1_0)
PUT_V1_8["required"] = ["allocations", "project_id", "user_id"]

_DICT_ALLOCATIONS = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {
        "^[0-9a-fA-F-]{32,36}$": {
            "type": "object",
            "properties": {"generation": {"type": "integer"}, "resources": _RESOURCES},
            "required": ["resources"],
            "additionalProperties": False,
        }
    },
    "additionalProperties": False,
}
PUT_V1_12 = {
    "type": "object",
    "properties": {"allocations": _DICT_ALLOCATIONS, "project_id": _PROJECT, "user_id": _PROJECT},
    "required": ["allocations", "project_id", "user_id"],
    "additionalProperties": False,
}

_POST_ONE = deepcopy(PUT_V1_12)
_POST_ONE["properties"]["allocations"]["minProperties"] = 0
POST_V1_13 = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {"^[0-9a-fA-F-]{32,36}$": _POST_ONE},
    "additionalProperties": False,
}
