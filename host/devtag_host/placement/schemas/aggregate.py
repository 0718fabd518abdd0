"""Body of PUT /resource_providers/{uuid}/aggregates: a plain list (1.1-1.18), an
object with the provider generation (1.19)."""

PUT = {
    "type": "array",
    "items": {"type": "string", "format": "uuid"},
    "uniqueItems": True,
}

PUT_V1_19 = {
    "type": "object",
    "properties": {"aggregates": PUT, "resource_provider_generation": {"type": "integer"}},
    "required": ["aggregates", "resource_provider_generation"],
    "additionalProperties": False,
}
