"""The query of ``GET /allocation_candidates`` as request groups, version by
version: one unsuffixed group (1.10), ``required`` 1.17, ``member_of`` 1.21,
forbidden traits 1.22, repeated ``member_of`` 1.24,
numbered groups and ``group_policy`` 1.25, ``in_tree``/``in_treeN`` 1.31,
forbidden aggregates 1.32, string suffixes 1.33, ``root_required`` 1.35,
``same_subtree`` and resourceless groups 1.36, ``required=in:`` 1.39.

Pure parsing: the errors are OpenStack Placement's 400s, worded as it words them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from . import errors
from .microversion import Version
from .query import AggregateFilter, TraitFilter, parse_member_of, parse_traits, parse_traits_value, parse_uuid
from .web import parse_resources

_NUMBERED = re.compile(r"^(resources|required|member_of|in_tree)([1-9][0-9]*)?$")
_NAMED = re.compile(r"^(resources|required|member_of|in_tree)([a-zA-Z0-9_-]{1,64})?$")


@dataclass
class Group:
    """One request group; ``suffix`` "" is the unsuffixed group (resources may be
    spread over a tree and its sharing providers), any other suffix must be met
    by one provider."""

    suffix: str
    resources: Dict[str, int] = field(default_factory=dict)
    traits: TraitFilter = field(default_factory=TraitFilter)
    aggregates: AggregateFilter = field(default_factory=AggregateFilter)
    in_tree: Optional[str] = None

    @property
    def same_provider(self) -> bool:
        return self.suffix != ""


@dataclass
class CandidateRequest:
    groups: List[Group]
    limit: Optional[int] = None
    group_policy: Optional[str] = None
    root_traits: TraitFilter = field(default_factory=TraitFilter)
    same_subtrees: List[Set[str]] = field(default_factory=list)

    def trait_names(self) -> Set[str]:
        names = set(self.root_traits.names())
        for group in self.groups:
            names |= group.traits.names()
        return names

    def ordered_trait_names(self) -> List[str]:
        """Every trait named, in the order upstream looks them up (group by group,
        the required ones in query order, then the forbidden, then root_required): an
        unknown trait's 400 names the first unknown one of this order."""
        ordered: List[str] = []
        for traits in [*(group.traits for group in self.groups), self.root_traits]:
            ordered.extend(name for any_of in traits.required for name in sorted(any_of))
            ordered.extend(sorted(traits.forbidden))
        return list(dict.fromkeys(ordered))

    def class_names(self) -> Set[str]:
        return {name for group in self.groups for name in group.resources}


def _unexpected(key: str) -> errors.PlacementError:
    return errors.bad_request(
        f"Invalid query string parameters: Additional properties are not allowed ('{key[:100]}' was unexpected)"
    )


def parse(query: List[Tuple[str, str]], version: Version) -> CandidateRequest:
    """``query`` as (key, value) pairs, in order."""
    granular = version.at_least(25)
    pattern = _NAMED if version.at_least(33) else _NUMBERED
    request_wide = {"limit": 16, "group_policy": 25, "root_required": 35, "same_subtree": 36}
    seen: Dict[str, List[str]] = {}
    for key, value in query:
        if key in request_wide and version.at_least(request_wide[key]):
            seen.setdefault(key, []).append(value)
            continue
        match = pattern.match(key)
        if match is None:
            raise _unexpected(key)
        prefix, suffix = match.group(1), match.group(2) or ""
        if suffix and not granular:
            raise _unexpected(key)
        minimum = {"resources": 10, "required": 17, "member_of": 21, "in_tree": 31}[prefix]
        if not version.at_least(minimum):
            raise _unexpected(key)
        seen.setdefault(key, []).append(value)

    request = CandidateRequest(groups=[])
    # Upstream's query schema (limit, group_policy) is checked before any group is parsed.
    if "limit" in seen:
        value = seen["limit"][0]
        if not value.isdigit() or int(value) < 1 or len(value) > 18:
            raise errors.bad_request(f"Invalid query string parameters: '{value[:20]}' does not match '^[1-9][0-9]*$'")
        request.limit = int(value)
    if "group_policy" in seen:
        value = seen["group_policy"][0]
        if value not in ("none", "isolate"):
            raise errors.bad_request(
                f"Invalid query string parameters: '{value[:40]}' is not one of ['none', 'isolate']"
            )
        request.group_policy = value
    by_suffix: Dict[str, Group] = {}
    for key, values in seen.items():
        if key in request_wide and version.at_least(request_wide[key]):
            continue
        match = pattern.match(key)
        assert match is not None
        prefix, suffix = match.group(1), match.group(2) or ""
        group = by_suffix.setdefault(suffix, Group(suffix))
        if prefix == "resources":
            group.resources = parse_resources(values[-1])
        elif prefix == "required":
            group.traits = parse_traits(values, version)
        elif prefix == "member_of":
            group.aggregates = parse_member_of(values, version, suffix)
        else:
            group.in_tree = parse_uuid("in_tree", values[-1])

    if "root_required" in seen:
        if len(seen["root_required"]) > 1:
            raise errors.bad_request(
                "Query parameter 'root_required' may be specified only once.", errors.ILLEGAL_DUPLICATE_QUERYPARAM
            )
        request.root_traits = parse_traits_value(seen["root_required"][0], allow_forbidden=True, allow_any=False)
        conflicts = {name for any_of in request.root_traits.required for name in any_of} & request.root_traits.forbidden
        if conflicts:
            raise errors.bad_request(
                f"Conflicting required and forbidden traits found in root_required: {', '.join(sorted(conflicts))}",
                errors.QUERYPARAM_BAD_VALUE,
            )
    for value in seen.get("same_subtree", []):
        suffixes = {item.strip() for item in value.split(",")}
        if "" in suffixes:
            raise errors.bad_request(
                "Empty string (unsuffixed group) can not be specified in `same_subtree` ",
                errors.QUERYPARAM_BAD_VALUE,
            )
        request.same_subtrees.append(suffixes)

    _check_groups(by_suffix, request, version)
    request.groups = [by_suffix[suffix] for suffix in sorted(by_suffix)]
    if not request.group_policy and sum(1 for group in request.groups if group.same_provider) > 1:
        raise errors.bad_request(
            'The "group_policy" parameter is required when specifying more than one "resources{N}" parameter.'
        )
    return request


def _check_groups(by_suffix: Dict[str, Group], request: CandidateRequest, version: Version) -> None:
    if not version.at_least(25) and ("" not in by_suffix or not by_suffix[""].resources):
        raise errors.bad_request("Invalid query string parameters: 'resources' is a required property")
    if version.at_least(36):
        resourceless = [suffix for suffix, group in by_suffix.items() if not group.resources]
        if len(resourceless) == len(by_suffix):
            raise errors.bad_request(
                "There must be at least one resources or resources[$S] parameter.", errors.QUERYPARAM_MISSING_VALUE
            )
        in_subtrees = set().union(*request.same_subtrees)
        bad = [suffix for suffix in resourceless if suffix not in in_subtrees]
        if bad:
            raise errors.bad_request(
                f"Resourceless suffixed group request should be specified in `same_subtree` query param: "
                f"bad group(s) - {bad}.",
                errors.QUERYPARAM_BAD_VALUE,
            )
        unknown = [suffix for suffix in sorted(in_subtrees) if suffix not in by_suffix]
        if unknown:
            raise errors.bad_request(
                f"Real suffixes should be specified in `same_subtree`: {unknown} not found in {list(by_suffix)}.",
                errors.QUERYPARAM_BAD_VALUE,
            )
    else:
        # As upstream: only required traits make a group an orphan; a group with
        # just forbidden traits fails the "must specify resources" check below.
        orphans = [
            f"required{suffix}" for suffix, group in by_suffix.items() if group.traits.required and not group.resources
        ]
        if orphans:
            raise errors.bad_request(
                "All traits parameters must be associated with resources.  "
                f"Found the following orphaned traits keys: {', '.join(orphans)}"
            )
        orphans = [
            f"member_of{suffix}" for suffix, group in by_suffix.items() if group.aggregates and not group.resources
        ]
        if orphans:
            raise errors.bad_request(
                "All member_of parameters must be associated with resources. "
                f"Found the following orphaned member_of keys: {', '.join(orphans)}"
            )
        if not all(group.resources for group in by_suffix.values()):
            raise errors.bad_request("All request groups must specify resources.")
        if not by_suffix:
            raise errors.bad_request("At least one request group (`resources` or `resources{$S}`) is required.")
    if version.at_least(22):
        conflicting = []
        for suffix, group in by_suffix.items():
            for any_of in group.traits.required:
                if all(name in group.traits.forbidden for name in any_of):
                    conflicting.append(f"required{suffix}: ({', '.join(sorted(any_of))})")
        if conflicting:
            raise errors.bad_request(
                "Conflicting required and forbidden traits found in the following traits keys: "
                + ", ".join(sorted(conflicting))
            )
