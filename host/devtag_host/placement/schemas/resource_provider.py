"""Bodies of POST /resource_providers and PUT /resource_providers/{uuid}."""

from copy import deepcopy
from typing import Any

POST_V1_0: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 200},  # empty: refused by the object, as upstream
        "uuid": {"type": "string", "format": "uuid"},
    },
    "required": ["name"],
    "additionalProperties": False,
}
# 1.14: nested providers.
POST_V1_14 = deepcopy(POST_V1_0)
POST_V1_14["properties"]["parent_provider_uuid"] = {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]}

PUT_V1_0 = deepcopy(POST_V1_0)
PUT_V1_0["properties"].pop("uuid")
PUT_V1_14 = deepcopy(POST_V1_14)
PUT_V1_14["properties"].pop("uuid")
