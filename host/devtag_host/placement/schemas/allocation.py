"""Bodies of PUT /allocations/{consumer} (list 1.0-1.11, dict 1.12+) and POST /allocations (1.13).

Each schema is OpenStack Placement's, key for key and in its key order: the
reference validator reports the first of equally relevant errors in schema
order, and clients see that message (the differential test compares it).
"""

from copy import deepcopy
from typing import Any

# Upstream's key pattern for provider and consumer UUIDs (36 characters, then the
# ``uuid`` checks of the handlers); 32-character spellings are not keys here.
UUID_KEY = "^[0-9a-fA-F-]{36}$"
CLASS_KEY = "^[A-Z0-9_]+$"

# No maximum, as upstream: an amount beyond any inventory's max_unit is refused
# by the provider and capacity checks (400 unknown provider, 409 max_unit), not
# by the schema.  The amounts never reach SQL unless they fit an inventory.
_RESOURCES: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {CLASS_KEY: {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
_PROJECT = {"type": "string", "minLength": 1, "maxLength": 255}

PUT_V1_0: dict[str, Any] = {
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
                    "resources": deepcopy(_RESOURCES),
                },
                "required": ["resource_provider", "resources"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["allocations"],
    "additionalProperties": False,
}
# 1.8: project and user are required.
PUT_V1_8 = deepcopy(PUT_V1_0)
PUT_V1_8["properties"]["project_id"] = deepcopy(_PROJECT)
PUT_V1_8["properties"]["user_id"] = deepcopy(_PROJECT)
PUT_V1_8["required"] = ["allocations", "project_id", "user_id"]

PUT_V1_12: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allocations": {
            "type": "object",
            "minProperties": 1,
            "patternProperties": {
                UUID_KEY: {
                    "type": "object",
                    "properties": {"generation": {"type": "integer"}, "resources": deepcopy(_RESOURCES)},
                    "required": ["resources"],
                    "additionalProperties": False,
                }
            },
            "additionalProperties": False,
        },
        "project_id": deepcopy(_PROJECT),
        "user_id": deepcopy(_PROJECT),
    },
    "additionalProperties": False,
    "required": ["allocations", "project_id", "user_id"],
}

# POST (1.13) may empty a consumer's allocations.
_POST_ONE = deepcopy(PUT_V1_12)
_POST_ONE["properties"]["allocations"]["minProperties"] = 0


def _post(one: dict) -> dict:
    return {"type": "object", "minProperties": 1, "additionalProperties": False, "patternProperties": {UUID_KEY: one}}


POST_V1_13 = _post(_POST_ONE)

# 1.28: a consumer generation (null for a new consumer), and PUT may empty the allocations.
PUT_V1_28 = deepcopy(_POST_ONE)
PUT_V1_28["properties"]["consumer_generation"] = {"type": ["integer", "null"], "additionalProperties": False}
PUT_V1_28["required"].append("consumer_generation")
POST_V1_28 = _post(PUT_V1_28)

# 1.34: ``mappings`` (request group suffix -> provider uuids) may come along; it is ignored.
# The key pattern is unanchored, as upstream's.
_MAPPINGS = {
    "type": "object",
    "minProperties": 1,
    "patternProperties": {
        "[a-zA-Z0-9_-]{1,64}": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "uuid"}}
    },
}
PUT_V1_34 = deepcopy(PUT_V1_28)
PUT_V1_34["properties"]["mappings"] = _MAPPINGS
POST_V1_34 = _post(PUT_V1_34)

# 1.38: a consumer type is required.
CONSUMER_TYPE = {"type": "string", "pattern": "^[A-Z0-9_]+$", "minLength": 1, "maxLength": 255}
PUT_V1_38 = deepcopy(PUT_V1_34)
PUT_V1_38["properties"]["consumer_type"] = CONSUMER_TYPE
PUT_V1_38["required"].append("consumer_type")
POST_V1_38 = _post(PUT_V1_38)


def put_schema(minor: int) -> dict:
    """The PUT /allocations/{consumer} body from 1.12 on."""
    return PUT_V1_38 if minor >= 38 else PUT_V1_34 if minor >= 34 else PUT_V1_28 if minor >= 28 else PUT_V1_12


def post_schema(minor: int) -> dict:
    return POST_V1_38 if minor >= 38 else POST_V1_34 if minor >= 34 else POST_V1_28 if minor >= 28 else POST_V1_13
