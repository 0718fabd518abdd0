"""The device-role-tagging JSON Schema, shared by the host and the guest agent.

Both sides load the *same* file (installed as package data of ``devtag_schema``)
so that what the host writes and what the agent accepts can never drift apart.

The schema is written in JSON Schema 2020-12 but uses only keywords whose meaning
is identical in draft 7 (no ``$ref`` siblings, no ``prefixItems``,
``unevaluated*`` or ``dependent*``).  That lets the guest agent validate with the
``jsonschema`` that distro images ship, including 3.2 (Ubuntu 22.04, RHEL 9),
which knows draft 7 but not 2020-12.  This module must stay importable on
Python 3.9 with only the standard library and ``jsonschema``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Dict, List

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("device-role-tagging-1.json")

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "describe_errors",
    "load_schema",
    "reference_validator",
]


@functools.cache
def _schema_text() -> str:
    return SCHEMA_PATH.read_text(encoding="utf-8")


def load_schema() -> Dict[str, Any]:
    """Return a fresh copy of the schema document (callers may mutate it)."""
    return json.loads(_schema_text())


@functools.cache
def reference_validator() -> Any:
    """A ``jsonschema`` validator for the schema, built once per process.

    Uses the 2020-12 validator where the installed ``jsonschema`` has it and
    draft 7 otherwise; the schema means the same under both (see module doc).
    """
    import jsonschema  # imported lazily: the host may never need it

    cls = getattr(jsonschema, "Draft202012Validator", None) or jsonschema.Draft7Validator
    return cls(load_schema())


def describe_errors(document: Any, limit: int = 5) -> List[str]:
    """Human-readable reasons why ``document`` is invalid (empty when valid).

    Each reason names the JSON path of the offending value, e.g.
    ``devices/3/address: 'xx0000:00:02.0yy' does not match ...``.
    """
    validator = reference_validator()
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    reasons = []
    for error in errors[:limit]:
        where = "/".join(str(p) for p in error.absolute_path) or "(document)"
        reasons.append(f"{where}: {error.message}")
    if len(errors) > limit:
        reasons.append(f"... and {len(errors) - limit} more")
    return reasons
