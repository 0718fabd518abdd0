"""Body of PUT /resource_providers/{uuid}/traits, and the custom trait name."""

# Upstream's schemas, in its key order; a provider's traits are any names (unknown ones are refused by name).
TRAIT = {"type": "string", "minLength": 1, "maxLength": 255}
CUSTOM_TRAIT = {**TRAIT, "pattern": "^CUSTOM_[A-Z0-9_]+$"}

PUT_PROVIDER_TRAITS = {
    "type": "object",
    "properties": {
        "traits": {"type": "array", "items": TRAIT},
        "resource_provider_generation": {"type": "integer"},
    },
    "required": ["traits", "resource_provider_generation"],
    "additionalProperties": False,
}
