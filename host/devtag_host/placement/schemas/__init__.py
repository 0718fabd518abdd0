"""jsonschema documents of the request bodies, one module per resource."""
