"""Query-string filters shared by ``GET /resource_providers`` and
``GET /allocation_candidates``: traits (``required``, forbidden ``!T`` 1.22,
any-of ``in:A,B`` 1.39) and aggregates (``member_of``, repeated 1.24,
forbidden ``!``/``!in:`` 1.32).  Pure parsing: no database, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, List, Sequence, Set

from . import errors
from .microversion import Version
from .web import is_uuid, normal_uuid


@dataclass
class TraitFilter:
    """``required``: every set must meet the provider's traits (each set is an any-of);
    ``forbidden``: none of them may be there."""

    required: List[FrozenSet[str]] = field(default_factory=list)
    forbidden: Set[str] = field(default_factory=set)

    def names(self) -> Set[str]:
        return set().union(*self.required, self.forbidden)

    def __bool__(self) -> bool:
        return bool(self.required or self.forbidden)


@dataclass
class AggregateFilter:
    """``required``: the provider is in at least one aggregate of every set;
    ``forbidden``: in none of them."""

    required: List[FrozenSet[str]] = field(default_factory=list)
    forbidden: Set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.required or self.forbidden)

    def admits(self, aggregates: Set[str]) -> bool:
        return all(aggregates & wanted for wanted in self.required) and not aggregates & self.forbidden


def parse_traits_value(value: str, *, allow_forbidden: bool, allow_any: bool) -> TraitFilter:
    """One ``required`` value, worded as OpenStack Placement words its 400s."""
    if value.startswith("in:"):
        if not allow_any:
            raise errors.bad_request(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported "
                f"since microversion 1.39. Got: {value[:200]}"
            )
        names = {item.strip() for item in value[3:].split(",")}
        if not all(names):
            raise errors.bad_request(
                "Invalid query string parameters: Expected 'required' parameter value of the form: "
                f"in:HW_CPU_X86_VMX,CUSTOM_MAGIC. Got an empty trait in: {value[:200]}"
            )
        if any(name.startswith("!") for name in names):
            raise errors.bad_request(
                "Invalid query string parameters: The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' does not support "
                f"forbidden traits. Got: {value[:200]}"
            )
        return TraitFilter([frozenset(names)], set())
    items = [item.strip() for item in value.split(",")]
    forbidden = {item.lstrip("!") for item in items if item.startswith("!")}
    if not all(items) or not all(forbidden):
        form = "HW_CPU_X86_VMX,!CUSTOM_MAGIC" if allow_forbidden else "HW_CPU_X86_VMX,CUSTOM_MAGIC"
        raise errors.bad_request(
            "Invalid query string parameters: Expected 'required' parameter value of the form: "
            f"{form}. Got an empty trait in: {value[:200]}"
        )
    if forbidden and not allow_forbidden:
        raise errors.bad_request(
            "Invalid query string parameters: Expected 'required' parameter value of the form: "
            f"HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: {value[:200]}"
        )
    required = [frozenset([item]) for item in dict.fromkeys(items) if not item.startswith("!")]
    return TraitFilter(required, forbidden)


def parse_traits(values: Sequence[str], version: Version) -> TraitFilter:
    """All ``required<suffix>`` values: before 1.39 only the last one counts (as upstream)."""
    if not version.at_least(39):
        values = values[-1:]
    result = TraitFilter()
    for value in values:
        one = parse_traits_value(value, allow_forbidden=version.at_least(22), allow_any=version.at_least(39))
        result.required.extend(one.required)
        result.forbidden |= one.forbidden
    return result


def parse_member_of_value(value: str) -> AggregateFilter:
    if "," in value and not (value.startswith("in:") or value.startswith("!in:")):
        raise errors.bad_request(
            "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' keyword using the valid "
            f"microversion. Got: {value[:200]}"
        )
    required: Set[str] = set()
    forbidden: Set[str] = set()
    if value.startswith("!in:"):
        forbidden = set(value[4:].split(","))
    elif value.startswith("!"):
        forbidden = {value[1:]}
    elif value.startswith("in:"):
        required = set(value[3:].split(","))
    else:
        required = {value}
    for item in sorted(required | forbidden):
        if not is_uuid(item):
            raise errors.bad_request(
                "Invalid query string parameters: Expected 'member_of' parameter to contain valid UUID(s). "
                f"Got: {item[:200]}"
            )
    return AggregateFilter(
        [frozenset(normal_uuid(item) for item in required)] if required else [],
        {normal_uuid(item) for item in forbidden},
    )


def parse_member_of(values: Sequence[str], version: Version, suffix: str = "") -> AggregateFilter:
    """All ``member_of<suffix>`` values: several from 1.24 (AND), forbidden from 1.32."""
    if len(values) > 1 and not version.at_least(24):
        raise errors.bad_request(f"Multiple member_of{suffix} parameters are not supported")
    result = AggregateFilter()
    for value in values:
        one = parse_member_of_value(value)
        if one.forbidden and not version.at_least(32):
            raise errors.bad_request(
                f"Forbidden member_of{suffix} parameters are not supported in the specified microversion"
            )
        result.required.extend(one.required)
        result.forbidden |= one.forbidden
    return result


def parse_uuid(name: str, value: str) -> str:
    if not is_uuid(value.strip()):
        raise errors.bad_request(
            f"Invalid query string parameters: Expected '{name}' parameter to be a format of uuid. Got: {value[:200]}"
        )
    return normal_uuid(value.strip())
