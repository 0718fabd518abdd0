"""Validate metadata documents against the shared schema, fast.

The reference ``jsonschema`` validator needs ~150 us per device (~37 ms for a
256-device domain on the development machine), which alone blows the host's
latency budget.  On the host we therefore validate with ``jsonschema-rs``, a
compiled 2020-12 validator (~0.2 ms for 256 devices), and fall back to
``jsonschema`` when it is not installed.  ``jsonschema`` stays the arbiter: it
produces the error messages, the guest agent uses it, and the test-suite checks
that both validators agree on every document it has.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import devtag_schema

from ..errors import RuntimeFailure


class InvalidDocumentError(RuntimeFailure, ValueError):
    """A metadata document the schema rejects; the message lists the reasons (exit status 1)."""


@functools.cache
def _fast_is_valid() -> Callable[[Any], bool]:
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - exercised only without the host extra
        return devtag_schema.reference_validator().is_valid
    return jsonschema_rs.validator_for(devtag_schema.load_schema()).is_valid


def is_valid_document(document: Any) -> bool:
    return _fast_is_valid()(document)


def validate_document(document: Any) -> None:
    """Raise :class:`InvalidDocumentError` unless ``document`` matches the schema."""
    if _fast_is_valid()(document):
        return
    reasons = devtag_schema.describe_errors(document) or ["rejected by the schema"]
    raise InvalidDocumentError("invalid devices document: " + "; ".join(reasons))
