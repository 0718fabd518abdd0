"""Bodies of POST /resource_classes and PUT /resource_classes/{name} (< 1.7)."""

NAME = {"type": "string", "pattern": "^CUSTOM_[A-Z0-9_]+$", "maxLength": 255}

POST = {"type": "object", "properties": {"name": NAME}, "required": ["name"], "additionalProperties": False}
PUT_V1_2 = POST
