"""Body of PUT /resource_providers/{uuid}/aggregates (1.1-1.18: a plain list)."""

PUT = {
    "type": "array",
    "items": {"type": "string", "format": "uuid"},
    "uniqueItems": True,
}
