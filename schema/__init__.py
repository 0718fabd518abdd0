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
import os
import re
from typing import Any, Dict, Iterator, List

SCHEMA_VERSION = 1
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device-role-tagging-1.json")  # a str

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_VERSION",
    "describe_errors",
    "load_schema",
    "pattern_keyword",
    "python_pattern",
    "reference_validator",
    "validator_class",
]


def python_pattern(pattern: str) -> str:
    """The schema's ECMA-262 ``pattern`` as a Python regular expression with the same meaning.

    In ECMA-262 (and in the Rust validator the host uses) ``$`` matches only at
    the very end of the string; Python's ``$`` also matches before a trailing
    newline, so ``"nic\\n"`` would pass ``^[a-z]+$`` in Python alone.  Every
    ``$`` outside a character class becomes ``\\Z`` (the end, full stop).
    """
    out = []
    in_class = False
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = "\\Z"
        out.append(char)
        index += 1
    return "".join(out)


@functools.cache
def _schema_text() -> str:
    """The schema file's text, read once per process."""
    with open(SCHEMA_PATH, encoding="utf-8") as handle:
        return handle.read()


def load_schema() -> Dict[str, Any]:
    """Return a fresh copy of the schema document (callers may mutate it)."""
    return json.loads(_schema_text())


def reference_validator() -> Any:
    """A ``jsonschema`` validator for the schema, built once per process.

    Uses the 2020-12 validator where the installed ``jsonschema`` has it and
    draft 7 otherwise; the schema means the same under both (see module doc).
    """
    return _reference_validator()


@functools.cache
def _reference_validator() -> Any:
    return validator_class()(load_schema())


def validator_class() -> Any:
    """The ``jsonschema`` validator class for the schema (2020-12, else draft 7), whose
    ``pattern`` reads ``$`` as ECMA-262 does (:func:`python_pattern`)."""
    import jsonschema  # imported lazily: the host may never need it

    cls = getattr(jsonschema, "Draft202012Validator", None) or jsonschema.Draft7Validator
    return jsonschema.validators.extend(cls, {"pattern": pattern_keyword})


_compiled: Dict[str, Any] = {}


def pattern_keyword(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``pattern`` keyword with ECMA-262's ``$`` (see :func:`python_pattern`)."""
    import jsonschema

    if not isinstance(instance, str):
        return
    compiled = _compiled.get(pattern)
    if compiled is None:
        compiled = _compiled[pattern] = re.compile(python_pattern(pattern))
    if not compiled.search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


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
