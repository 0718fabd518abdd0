"""Bodies of PUT /allocations/{consumer} (list 1.0-1.11, dict 1.12+) and POST /allocations (1.13)."""

from copy import deepcopy
from typing import Any

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
PUT_V1_12: dict[str, Any] = {
    "type": "object",
    "properties": {"allocations": _DICT_ALLOCATIONS, "project_id": _PROJECT, "user_id": _PROJECT},
    "required": ["allocations", "project_id", "user_id"],
    "additionalProperties": False,
}

_POST_ONE = deepcopy(PUT_V1_12)
_POST_ONE["properties"]["allocations"]["minProperties"] = 0
POST_V1_13: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {"^[0-9a-fA-F-]{32,36}$": _POST_ONE},
    "additionalProperties": False,
}

# 1.28: a consumer generation (null for a new consumer), and PUT may empty the allocations.
_GENERATION = {"type": ["integer", "null"]}
PUT_V1_28 = deepcopy(_POST_ONE)
PUT_V1_28["properties"]["consumer_generation"] = _GENERATION
PUT_V1_28["required"] = ["allocations", "project_id", "user_id", "consumer_generation"]
POST_V1_28 = deepcopy(POST_V1_13)
POST_V1_28["patternProperties"] = {"^[0-9a-fA-F-]{32,36}$": PUT_V1_28}

# 1.34: ``mappings`` (request group suffix -> provider uuids) may come along; it is ignored.
_MAPPINGS = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {
        "^[a-zA-Z0-9_-]{1,64}$": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "uuid"}}
    },
}
PUT_V1_34 = deepcopy(PUT_V1_28)
PUT_V1_34["properties"]["mappings"] = _MAPPINGS
POST_V1_34 = deepcopy(POST_V1_13)
POST_V1_34["patternProperties"] = {"^[0-9a-fA-F-]{32,36}$": PUT_V1_34}

# 1.38: a consumer type is required.
CONSUMER_TYPE = {"type": "string", "pattern": "^[A-Z0-9_]+$", "minLength": 1, "maxLength": 255}
PUT_V1_38 = deepcopy(PUT_V1_34)
PUT_V1_38["properties"]["consumer_type"] = CONSUMER_TYPE
PUT_V1_38["required"] = [*PUT_V1_34["required"], "consumer_type"]
POST_V1_38 = deepcopy(POST_V1_13)
POST_V1_38["patternProperties"] = {"^[0-9a-fA-F-]{32,36}$": PUT_V1_38}


def put_schema(minor: int) -> dict:
    """The PUT /allocations/{consumer} body from 1.12 on."""
    return PUT_V1_38 if minor >= 38 else PUT_V1_34 if minor >= 34 else PUT_V1_28 if minor >= 28 else PUT_V1_12


def post_schema(minor: int) -> dict:
    return POST_V1_38 if minor >= 38 else POST_V1_34 if minor >= 34 else POST_V1_28 if minor >= 28 else POST_V1_13
