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
from .db import MAX_INT
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
    # The suffixes in the order of their first key in the query: upstream searches
    # the groups in this order and stops at the first group without candidates.
    lookup_order: List[str] = field(default_factory=list)

    def groups_in_lookup_order(self) -> List[Group]:
        by_suffix = {group.suffix: group for group in self.groups}
        return [by_suffix[suffix] for suffix in self.lookup_order]

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


_LIMIT = re.compile(r"^[1-9][0-9]*$")


def parse(query: List[Tuple[str, str]], version: Version) -> CandidateRequest:
    """``query`` as (key, value) pairs, in order, once it matches the query's schema
    (``schemas/allocation_candidate.py``), checked in upstream's order: the
    request-wide parameters, then the group keys one by one as they come (every
    occurrence of a key is parsed)."""
    pattern = _NAMED if version.at_least(33) else _NUMBERED
    values: Dict[str, List[str]] = {}
    for key, value in query:
        values.setdefault(key, []).append(value)

    request = CandidateRequest(groups=[])
    if "limit" in values:
        # Upstream takes the first value (the schema checked the last one).
        first = values["limit"][0]
        if not _LIMIT.search(first):  # upstream fails with a 500 there
            raise errors.bad_request(f"Invalid query string parameters: {first[:100]!r} does not match '^[1-9][0-9]*$'")
        # A limit past any answer's size is no limit (upstream slices a list with it);
        # kept within what SQL's LIMIT binds.
        request.limit = MAX_INT if len(first) > 10 else min(int(first), MAX_INT)
    if "group_policy" in values:
        # Likewise the first value: only "isolate" isolates.
        request.group_policy = values["group_policy"][0]
    if "root_required" in values:
        if len(values["root_required"]) > 1:
            raise errors.bad_request(
                "Query parameter 'root_required' may be specified only once.", errors.ILLEGAL_DUPLICATE_QUERYPARAM
            )
        request.root_traits = parse_traits_value(values["root_required"][0], allow_forbidden=True, allow_any=False)
        conflicts = {name for any_of in request.root_traits.required for name in any_of} & request.root_traits.forbidden
        if conflicts:
            raise errors.bad_request(
                f"Conflicting required and forbidden traits found in root_required: {', '.join(sorted(conflicts))}",
                errors.QUERYPARAM_BAD_VALUE,
            )
    for value in values.get("same_subtree", []):
        suffixes = {item.strip() for item in value.split(",")}
        if "" in suffixes:
            raise errors.bad_request(
                "Empty string (unsuffixed group) can not be specified in `same_subtree` ",
                errors.QUERYPARAM_BAD_VALUE,
            )
        request.same_subtrees.append(suffixes)

    by_suffix: Dict[str, Group] = {}
    for key, value in query:
        match = pattern.match(key)
        if match is None:  # a request-wide parameter
            continue
        prefix, suffix = match.group(1), match.group(2) or ""
        group = by_suffix.setdefault(suffix, Group(suffix))
        if prefix == "resources":
            group.resources = parse_resources(value)
        elif prefix == "required":
            group.traits = parse_traits(values[key], version)
        elif prefix == "member_of":
            group.aggregates = parse_member_of(values[key], version, suffix)
        else:
            group.in_tree = parse_uuid("in_tree", value)

    _check_groups(by_suffix, request, version)
    request.groups = [by_suffix[suffix] for suffix in sorted(by_suffix)]
    request.lookup_order = list(by_suffix)
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
