"""Body of PUT /resource_providers/{uuid}/traits, and the custom trait name."""

CUSTOM_TRAIT = {"type": "string", "pattern": "^CUSTOM_[A-Z0-9_]+$", "maxLength": 255}

PUT_PROVIDER_TRAITS = {
    "type": "object",
    "properties": {
        "traits": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z0-9_]+$", "maxLength": 255}},
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["traits", "resource_provider_generation"],
    "additionalProperties": False,
}
