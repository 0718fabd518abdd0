"""Body of POST /reshaper (1.30; mappings 1.34; consumer_type 1.38): upstream's
schema, key for key and in its key order."""

from copy import deepcopy

from . import allocation
from .inventory import PUT_ALL


def _with_allocations(post: dict) -> dict:
    allocations = deepcopy(post)
    allocations["minProperties"] = 0  # nothing may be allocated against what moves
    return {
        "type": "object",
        "properties": {
            "inventories": {
                "type": "object",
                "patternProperties": {allocation.UUID_KEY: deepcopy(PUT_ALL)},
                "minProperties": 1,
                "additionalProperties": False,
            },
            "allocations": allocations,
        },
        "required": ["inventories", "allocations"],
        "additionalProperties": False,
    }


POST_V1_30 = _with_allocations(allocation.POST_V1_28)
POST_V1_34 = _with_allocations(allocation.POST_V1_34)
POST_V1_38 = _with_allocations(allocation.POST_V1_38)


def post_schema(minor: int) -> dict:
    return POST_V1_38 if minor >= 38 else POST_V1_34 if minor >= 34 else POST_V1_30
