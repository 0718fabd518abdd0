"""What every handler sees (``Call``) and returns (``Reply``), and the small
parsing helpers they share: body validation, query strings, links."""

from __future__ import annotations

import datetime
import json
import re
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
from .db import MAX_INT, Store, fits_nowhere  # noqa: F401  (fits_nowhere: for the handlers)
from .errors import PlacementError
from .microversion import Version

_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("uuid")
def _is_uuid(value: object) -> bool:
    return not isinstance(value, str) or is_uuid(value)


# On an allocation-candidates answer whose search stopped at its step limit (the
# answer may miss candidates): the number of steps.  OpenStack Placement has no such
# limit; its clients ignore the header, operators see it in the log and the metrics.
CUT_SHORT_HEADER = "x-devtag-candidates-cut-short"


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
        raise PlacementError(400, f"JSON does not validate: {_described(error)}")
    # The validators disagree (the test-suite checks they do not): the compiled one decides.
    raise PlacementError(400, "JSON does not validate")  # pragma: no cover


# No placement document nests deeper than six levels (a reshaper body); this is
# far from the stdlib parser's recursion limit and from orjson's output limit.
MAX_JSON_DEPTH = 32


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def decode_json(body: bytes) -> Any:
    """The request body as JSON, else upstream's 400 ``Malformed JSON: ...``.

    Upstream's reading (strict UTF-8, then the stdlib parser), less what no
    database or client can take back: ``NaN``/``Infinity`` (not JSON), nesting
    beyond ``MAX_JSON_DEPTH``, lone surrogate escapes (``"\\ud800"`` is no
    text; UTF-8 cannot encode it) and NUL characters (PostgreSQL's text cannot
    hold one; no name or identifier of placement's has one)."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise errors.bad_request(f"Malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # UnicodeDecodeError and json.JSONDecodeError among them
        raise errors.bad_request(f"Malformed JSON: {exc}") from None
    _check_decoded(value, "\\u" in text)
    return value


def _check_decoded(value: Any, escapes: bool) -> None:
    """400 if ``value`` nests too deep or (when the text had ``\\u`` escapes)
    holds a string UTF-8 cannot encode.  Iterative: a walk of the containers only."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
            if escapes:
                for key in item:
                    _check_text(key)
        elif isinstance(item, list):
            children = item
        else:
            if escapes and isinstance(item, str):
                _check_text(item)
            continue
        if depth > MAX_JSON_DEPTH:
            raise errors.bad_request(f"Malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children if escapes or isinstance(child, (dict, list)))


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise errors.bad_request(
            f"Malformed JSON: lone surrogate {text[exc.start]!a} at character {exc.start}"
        ) from None
    if "\x00" in text:
        raise errors.bad_request("Malformed JSON: a string holds a NUL character (\\u0000)")


# jsonschema's description quotes the schema and the instance: bounded for a huge one.
MAX_ERROR_TEXT = 4000


def _described(error: Any) -> str:
    """jsonschema's whole text for ``error``, as upstream sends it: the message, then
    "Failed validating '<keyword>' in schema[...]" with the schema and the instance,
    on one line (upstream's error formatter, webob's ``strip_tags``, turns the newlines
    into spaces; clients such as osc-placement show the detail's last line)."""
    text = str(error).replace("\n", " ")
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "..."


def query_error(key: str, value: str, schema: Dict[str, Any]) -> PlacementError:
    """The 400 upstream's query-string schema gives for ``key=value``, where
    ``schema`` (upstream's, for that key) refuses ``value``: jsonschema's own text.
    Only called once a handler's own check has refused the value."""
    wrapper = {"type": "object", "properties": {key: schema}}
    cls = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": devtag_schema.pattern_keyword})
    error = jsonschema.exceptions.best_match(cls(wrapper, format_checker=_FORMATS).iter_errors({key: value}))
    text = _described(error) if error is not None else f"{value[:100]!r} is not valid for {key!r}"
    return errors.bad_request(f"Invalid query string parameters: {text}")


_QUERY_VALIDATORS: Dict[int, Any] = {}


def _query_valid(schema: Dict[str, Any]) -> Any:
    """``is_valid`` of ``schema`` for query values, built once per schema: Python's
    ``re.search`` for its patterns, as upstream's jsonschema reads them."""
    check = _QUERY_VALIDATORS.get(id(schema))
    if check is None:
        check = _QUERY_VALIDATORS[id(schema)] = jsonschema.Draft4Validator(schema).is_valid
    return check


def validate_query(query: List[Tuple[str, str]], schema: Dict[str, Any]) -> Dict[str, str]:
    """The query's last value of each key, if they match ``schema`` (upstream's schema
    of the route's query string, a module-level constant); else the 400 upstream's
    jsonschema ranks first: a missing required key, then the keys the schema does not
    allow (all of them), then a refused value, in the schema's order of properties."""
    last = dict(query)
    if _query_valid(schema)(last):
        return last
    prefix = "Invalid query string parameters: "
    for key in schema.get("required", ()):
        if key not in last:
            raise errors.bad_request(f"{prefix}{key!r} is a required property")
    properties: Dict[str, Any] = schema.get("properties", {})
    patterns = sorted(schema.get("patternProperties", {}))
    extras = sorted(key for key in last if key not in properties and not any(re.search(p, key) for p in patterns))
    if extras:
        joined = ", ".join(repr(key[:100]) for key in extras[:20])
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(pattern) for pattern in patterns)
            raise errors.bad_request(f"{prefix}{joined} {verb} not match any of the regexes: {regexes}")
        verb = "was" if len(extras) == 1 else "were"
        raise errors.bad_request(f"{prefix}Additional properties are not allowed ({joined} {verb} unexpected)")
    for key, subschema in properties.items():
        if key in last and not _query_valid(subschema)(last[key]):
            raise query_error(key, last[key], subschema)
    raise errors.bad_request(f"{prefix}the query does not match the route's schema")  # pragma: no cover


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


# The largest amount a query may name: a 64-bit SQL integer, past which OpenStack
# Placement fails with a 500 (its databases cannot bind it).  Amounts above MAX_INT
# (the largest ``max_unit``) are valid and fit nowhere, as upstream answers them.
MAX_AMOUNT = 2**63 - 1


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
            # Past 4300 digits int() refuses a number: out of range, not malformed.
            number = MAX_AMOUNT + 1 if len(amount) > 100 and amount.strip().lstrip("+").isdecimal() else int(amount)
        except ValueError:
            raise errors.bad_request(
                f"Requested resource {name[:100]} expected positive integer amount. Got: {amount[:40]}."
            ) from None
        if number < 1:
            raise errors.bad_request(f"Requested resource {name[:100]} requires amount >= 1. Got: {number}.")
        if number > MAX_AMOUNT:
            raise errors.bad_request(
                f"Requested resource {name[:100]} requires amount <= {MAX_AMOUNT}. Got: {amount.strip()[:40]}."
            )
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
