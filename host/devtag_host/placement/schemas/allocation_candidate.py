"""The query string of GET /allocation_candidates, microversion by microversion, as
upstream's schemas: each key's last value, a string.

1.10 ``resources``; 1.16 ``limit``; 1.17 ``required``; 1.21 ``member_of``; 1.25 the
three become group keys (``resources``, ``required``, ``member_of``, each with an
optional numeric suffix) and ``group_policy`` arrives; 1.31 ``in_tree`` (a group
key); 1.33 string suffixes; 1.35 ``root_required``; 1.36 ``same_subtree``.
"""

from copy import deepcopy
from typing import Any, Dict, Tuple

GET_1_10: Dict[str, Any] = {
    "type": "object",
    "properties": {"resources": {"type": "string"}},
    "required": ["resources"],
    "additionalProperties": False,
}

GET_1_16 = deepcopy(GET_1_10)
# A query value is a string; upstream's schema takes an integer too.
GET_1_16["properties"]["limit"] = {
    "type": ["integer", "string"],
    "pattern": "^[1-9][0-9]*$",
    "minimum": 1,
    "minLength": 1,
}

GET_1_17 = deepcopy(GET_1_16)
GET_1_17["properties"]["required"] = {"type": ["string"]}

GET_1_21 = deepcopy(GET_1_17)
GET_1_21["properties"]["member_of"] = {"type": ["string"]}

_NUMBERED = "[1-9][0-9]*"
_NAMED = "[a-zA-Z0-9_-]{1,64}"


def _group_keys(suffix: str, keys: Tuple[str, ...]) -> Dict[str, Any]:
    return {f"^{key}({suffix})?$": {"type": "string"} for key in keys}


GET_1_25 = deepcopy(GET_1_21)
for _replaced in ("resources", "required", "member_of"):
    del GET_1_25["properties"][_replaced]
del GET_1_25["required"]
GET_1_25["patternProperties"] = _group_keys(_NUMBERED, ("resources", "required", "member_of"))
GET_1_25["properties"]["group_policy"] = {"type": "string", "enum": ["none", "isolate"]}

GET_1_31 = deepcopy(GET_1_25)
GET_1_31["patternProperties"] = _group_keys(_NUMBERED, ("resources", "required", "member_of", "in_tree"))

GET_1_33 = deepcopy(GET_1_31)
GET_1_33["patternProperties"] = _group_keys(_NAMED, ("resources", "required", "member_of", "in_tree"))

GET_1_35 = deepcopy(GET_1_33)
GET_1_35["properties"]["root_required"] = {"type": ["string"]}

GET_1_36 = deepcopy(GET_1_35)
GET_1_36["properties"]["same_subtree"] = {"type": ["string"]}

# (first microversion, its schema), newest first.
BY_VERSION: Tuple[Tuple[int, Dict[str, Any]], ...] = (
    *((36, GET_1_36), (35, GET_1_35), (33, GET_1_33), (31, GET_1_31), (25, GET_1_25)),
    *((21, GET_1_21), (17, GET_1_17), (16, GET_1_16), (10, GET_1_10)),
)
