"""What every handler sees (``Call``) and returns (``Reply``), and the small
parsing helpers they share: body validation, query strings, links."""

from __future__ import annotations

import datetime
import uuid as uuidlib
from dataclasses import dataclass, field
from email.utils import format_datetime
from typing import Any, Dict, List, Optional, Set, Tuple

import jsonschema

try:  # compiled validator: a tenth of the reference's cost per request body
    import jsonschema_rs
except ImportError:  # pragma: no cover - exercised only without the host extra
    jsonschema_rs = None  # type: ignore[assignment]  # mypy's only spelling of an optional module

import devtag_schema

from . import errors
from .candidate_settings import UPSTREAM_DEFAULTS, CandidateSettings
from .db import Store
from .errors import PlacementError
from .microversion import Version

_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("uuid")
def _is_uuid(value: object) -> bool:
    return not isinstance(value, str) or is_uuid(value)


@dataclass
class Call:
    """One API request, already authenticated and version-negotiated."""

    store: Store
    version: Version
    params: Dict[str, str]
    query: List[Tuple[str, str]]
    body: Any = None
    candidate_settings: CandidateSettings = UPSTREAM_DEFAULTS

    def want(self, minor: int) -> bool:
        return self.version.at_least(minor)

    def query_dict(self, allowed: Set[str], required: Tuple[str, ...] = ()) -> Dict[str, str]:
        """The query as a dict (last value wins); else the 400 upstream's jsonschema
        ranks first: a missing ``required`` key, then every unexpected key."""
        result = dict(self.query)
        for key in required:
            if key not in result:
                raise errors.bad_request(f"Invalid query string parameters: '{key}' is a required property")
        extras = sorted(key for key in result if key not in allowed)
        if extras:
            joined = ", ".join(repr(key) for key in extras)
            verb = "was" if len(extras) == 1 else "were"
            raise errors.bad_request(
                f"Invalid query string parameters: Additional properties are not allowed ({joined} {verb} unexpected)"
            )
        return result

    def values(self, key: str) -> List[str]:
        """Every value of a repeated query parameter, in order."""
        return [value for name, value in self.query if name == key]


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: Dict[str, str] = field(default_factory=dict)


_VALIDATORS: Dict[int, Tuple[Any, Any]] = {}


def _validators(schema: Dict[str, Any]) -> Tuple[Any, Any]:
    """(fast ``is_valid``, reference validator) for ``schema``, built once per schema."""
    pair = _VALIDATORS.get(id(schema))
    if pair is None:
        # ``pattern`` as ECMA-262 (and jsonschema-rs) read ``$``: the end, not before a final newline.
        cls = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": devtag_schema.pattern_keyword})
        reference = cls(schema, format_checker=_FORMATS)
        fast = reference.is_valid
        if jsonschema_rs is not None:
            fast = jsonschema_rs.Draft4Validator(schema, formats={"uuid": is_uuid}, validate_formats=True).is_valid
        pair = _VALIDATORS[id(schema)] = (fast, reference)
    return pair


def validate(body: Any, schema: Dict[str, Any]) -> Any:
    """``body`` if it matches ``schema`` (a module-level constant), else 400.

    A valid body costs one pass of the compiled validator (jsonschema-rs); only a
    body it rejects goes through the reference ``jsonschema``, which writes the
    message Placement's clients expect.  tests/placement/test_body_validation.py
    checks that the two agree.
    """
    fast, reference = _validators(schema)
    if fast(body):
        return body
    error = jsonschema.exceptions.best_match(reference.iter_errors(body))
    if error is not None:
        raise PlacementError(400, f"JSON does not validate: {error.message[:500]}")
    # The validators disagree (the test-suite checks they do not): the compiled one decides.
    raise PlacementError(400, "JSON does not validate")  # pragma: no cover


def normal_uuid(value: str) -> str:
    return str(uuidlib.UUID(value))


def is_uuid(value: str) -> bool:
    """Upstream's test (oslo.utils' ``is_uuid_like``): the hex digits, once the
    ``urn:``/``uuid:`` prefixes, braces and dashes are gone, are a UUID's, in any
    case.  (``uuid.UUID`` alone also takes ``int()`` spellings such as underscores.)"""
    if not isinstance(value, str):
        return False
    try:
        canonical = str(uuidlib.UUID(value)).replace("-", "")
    except ValueError:
        return False
    return canonical == value.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "").lower()


def parse_resources(value: str) -> Dict[str, int]:
    """``VCPU:2,MEMORY_MB:1024`` -> {"VCPU": 2, "MEMORY_MB": 1024}, else 400."""
    form = "?resources=VCPU:2,MEMORY_MB:1024"
    if not value.strip():
        raise errors.bad_request(
            "Badly formed resources parameter. Expected resources query string parameter in form: "
            f"{form}. Got: empty string."
        )
    result: Dict[str, int] = {}
    for item in value.split(","):
        name, sep, amount = item.partition(":")
        if not sep or ":" in amount:
            raise errors.bad_request(
                f"Badly formed resources parameter. Expected resources query string parameter in form: "
                f"{form}. Got: {item[:100]}."
            )
        try:
            number = int(amount)
        except ValueError:
            raise errors.bad_request(
                f"Requested resource {name[:100]} expected positive integer amount. Got: {amount[:40]}."
            ) from None
        if number < 1:
            raise errors.bad_request(f"Requested resource {name[:100]} requires amount >= 1. Got: {number}.")
        result[name] = number
    return result


def parse_member_of(value: str) -> Set[str]:
    if "," in value and not value.startswith("in:"):
        raise errors.bad_request(
            f"Multiple values for 'member_of' must be prefixed with the 'in:' keyword. Got: {value}"
        )
    values = set(value[3:].split(",")) if value.startswith("in:") else {value}
    for item in values:
        if not is_uuid(item):
            raise errors.bad_request(
                f"Invalid query string parameters: Expected 'member_of' parameter to contain valid UUID(s). Got: {item}"
            )
    return {normal_uuid(item) for item in values}


def parse_traits(value: str) -> Set[str]:
    names = {item.strip() for item in value.split(",")}
    if not all(names):
        raise errors.bad_request(
            "Invalid query string parameters: Expected 'required' parameter value of the form: "
            f"HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {value[:200]}"
        )
    return names


def provider_url(uuid: str) -> str:
    return f"/resource_providers/{uuid}"


def cache_headers(call: Call, when: Optional[datetime.datetime] = None) -> Dict[str, str]:
    """1.15: last-modified and cache-control on GET responses."""
    if not call.want(15):
        return {}
    when = when or datetime.datetime.now(datetime.timezone.utc)
    return {"last-modified": format_datetime(when, usegmt=True), "cache-control": "no-cache"}
