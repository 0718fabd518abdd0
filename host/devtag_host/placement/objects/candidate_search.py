"""The general path of ``GET /allocation_candidates``: sharing providers,
nested trees (1.29), granular groups (1.25), ``group_policy``, ``in_tree``,
``root_required``, ``same_subtree`` and ``mappings`` (1.34).

Decides which candidates the answer holds and in which order, following OpenStack
Placement's semantics and settings: the rows come from ``candidate_world``, each
group's parts per anchor tree from ``candidate_parts``; every group of a candidate is
anchored on the same tree, whose picks ``candidate_walk`` tries; the anchors' searches
are then taken depth-first or round-robin, up to ``max_allocation_candidates`` and
``limit``, randomized or not, and cut short after ``MAX_SEARCH_STEPS``.

The flat case without sharing providers never comes here: ``flat_candidates``
answers it with one cached SQL statement.
"""

from __future__ import annotations

import itertools
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

import os_traits
from sqlalchemy.engine import Connection

from ..candidate_request import CandidateRequest
from ..candidate_settings import BREADTH_FIRST, UPSTREAM_DEFAULTS, CandidateSettings
from ..exception import ResourceClassNotFound
from . import resource_class, trait
from .candidate_parts import Filters, Part, anchors_of_sharing, same_provider_parts, tree_parts
from .candidate_walk import Candidate, Plan, SearchExhausted, anchor_candidates
from .candidate_world import World, load

# A guard for the service: a search that would look at more picks than this (an
# answer of billions of candidates asked for without ``limit`` or
# ``max_allocation_candidates``) stops and answers what it found, marked as cut
# short (``Found.cut_after``): the answer says so in a header, the log and the metrics.
MAX_SEARCH_STEPS = 2_000_000


@dataclass
class Found:
    """The candidates, in the answer's order, and what they were searched in."""

    candidates: List[Candidate]
    world: World
    suffixes: List[str] = field(default_factory=list)  # the groups' suffixes, in the parts' order
    cut_after: Optional[int] = None  # the search stopped after this many steps: candidates may be missing


def search(
    connection: Connection,
    request: CandidateRequest,
    nested_aware: bool,
    settings: CandidateSettings = UPSTREAM_DEFAULTS,
    limit: Optional[int] = None,
) -> Tuple[Found, Dict[str, int], Dict[str, int]]:
    """(found, class ids by name, trait ids by name); 400 for unknown classes or traits.
    ``limit`` (the request's, or less to know only whether there is a candidate) may
    stop the search early; the candidates found are then at most that many."""
    class_ids = resource_class.ids_by_name(connection, request.class_names())
    unknown = sorted(request.class_names() - set(class_ids))
    if unknown:
        raise ResourceClassNotFound(unknown[0])
    trait_ids = trait.require_ids(connection, request.ordered_trait_names()) if request.trait_names() else {}
    shares_id = trait.ids_by_name(connection, [os_traits.MISC_SHARES_VIA_AGGREGATE]).get(
        os_traits.MISC_SHARES_VIA_AGGREGATE
    )
    with_aggregates = any(group.aggregates for group in request.groups)
    world = load(connection, trait_ids.values(), shares_id, with_aggregates)
    by_uuid = {uuid: rp_id for rp_id, uuid in world.uuid.items()} if any(g.in_tree for g in request.groups) else {}
    filters: List[Filters] = []
    for group in request.groups:
        tree_root = None
        if group.in_tree is not None:
            if group.in_tree not in by_uuid:
                return Found([], world), class_ids, trait_ids
            tree_root = world.root[by_uuid[group.in_tree]]
        filters.append(
            Filters(
                group,
                {class_ids[name]: amount for name, amount in group.resources.items()},
                [frozenset(trait_ids[name] for name in any_of) for any_of in group.traits.required],
                {trait_ids[name] for name in group.traits.forbidden},
                tree_root,
            )
        )
    root_required = [frozenset(trait_ids[name] for name in any_of) for any_of in request.root_traits.required]
    root_forbidden = {trait_ids[name] for name in request.root_traits.forbidden}
    no_traits: Set[int] = set()

    def root_ok(root: int) -> bool:
        have = world.traits.get(root, no_traits)
        return all(have & any_of for any_of in root_required) and not have & root_forbidden

    anchors_of = anchors_of_sharing(world)
    # Per group: {anchor root: [part, ...]}
    per_group: List[Dict[int, List[Part]]] = []
    for f in filters:
        search_parts = same_provider_parts if f.group.same_provider else tree_parts
        parts = search_parts(world, f, anchors_of)
        if root_required or root_forbidden:
            parts = {anchor: found for anchor, found in parts.items() if root_ok(anchor)}
        if not parts:
            return Found([], world), class_ids, trait_ids
        per_group.append(parts)
    suffixes = [f.group.suffix for f in filters]
    combined, cut_after = _combine(world, request, filters, per_group, nested_aware, settings, limit)
    return Found(combined, world, suffixes, cut_after), class_ids, trait_ids


def _combine(
    world: World,
    request: CandidateRequest,
    filters: List[Filters],
    per_group: List[Dict[int, List[Part]]],
    nested_aware: bool,
    settings: CandidateSettings,
    limit: Optional[int],
) -> Tuple[List[Candidate], Optional[int]]:
    """Every pick of one part per group, anchored on the same tree, that meets
    ``group_policy``, ``same_subtree`` and the capacity of what several groups take
    from one provider, generated as ``settings`` say and cut short by ``limit``
    where the answer allows (``_generated``)."""
    numbered = [f.group.same_provider for f in filters]
    isolate = request.group_policy == "isolate" and sum(numbered) > 1
    suffix_index = {f.group.suffix: index for index, f in enumerate(filters)}
    subtrees = [[suffix_index[s] for s in subtree] for subtree in request.same_subtrees]
    # The parts of a pick take from distinct providers when at most one group takes
    # anything, or when every group is numbered and isolated (each part is one
    # provider, and isolate keeps them apart): then nothing needs summing.
    taking = [index for index, f in enumerate(filters) if f.amounts]
    apart = len(taking) < 2 or (isolate and all(numbered))
    # same_subtree: per part, the providers that are an ancestor (or itself) of each
    # of its providers; a pick meets a subtree when the intersection over its parts
    # holds one of their providers.
    commons: Dict[int, FrozenSet[int]] = {}
    if subtrees:
        lineage = world.lineage
        for parts in per_group:
            for listed in parts.values():
                for part in listed:
                    providers = part[0]
                    commons[id(part)] = (
                        lineage(providers[0])
                        if len(providers) == 1
                        else frozenset.intersection(*map(lineage, providers))
                    )
    seen: Optional[Set[Any]] = set() if world.sharing else None
    plan = Plan(world, nested_aware, numbered, isolate, not apart, subtrees, commons, seen, MAX_SEARCH_STEPS)
    anchors = sorted(set.intersection(*(set(parts) for parts in per_group)))
    searches = [anchor_candidates(plan, [parts[anchor] for parts in per_group]) for anchor in anchors]
    return _generated(searches, settings, limit)


def _generated(
    searches: List[Iterator[Candidate]], settings: CandidateSettings, limit: Optional[int]
) -> Tuple[List[Candidate], Optional[int]]:
    """The candidates of the anchors' ``searches`` as OpenStack Placement answers them.

    Upstream generates at most ``max_allocation_candidates`` in the order of its
    strategy (each anchor in turn, or round-robin over them), then answers ``limit``
    of that set: a random sample with ``randomize``, else any of them (a set's
    order).  Without ``randomize`` this takes ``limit`` candidates round-robin over
    the anchors of the generated set: the same answer where the strategy leaves no
    choice, spread over as many roots as upstream's set would, and found without
    generating the rest.  Also the number of steps after which the search stopped
    (``MAX_SEARCH_STEPS``), or None when it looked at everything it had to."""
    cap = settings.cap()
    breadth_first = settings.generation_strategy == BREADTH_FIRST
    found: List[Candidate] = []
    try:
        if settings.randomize or limit is None or (cap is not None and cap <= limit):
            _take(_round_robin(searches) if breadth_first else itertools.chain(*searches), cap, found)
            if settings.randomize:
                if limit is not None and limit < len(found):
                    found = random.sample(found, limit)
                else:
                    random.shuffle(found)
        elif breadth_first or cap is None:
            _take(_round_robin(searches), limit, found)
        else:  # depth-first up to the cap, then ``limit`` of those spread over their anchors
            per_anchor: List[List[Candidate]] = []
            budget = cap
            for search in searches:
                if budget <= 0:
                    break
                per_anchor.append([])
                _take(search, budget, per_anchor[-1])
                budget -= len(per_anchor[-1])
            _take(_round_robin([iter(listed) for listed in per_anchor]), limit, found)
    except SearchExhausted:
        return found, MAX_SEARCH_STEPS
    return found, None


def _take(candidates: Iterable[Candidate], most: Optional[int], into: List[Candidate]) -> None:
    """Append to ``into`` up to ``most`` (None: all) of ``candidates``; ``into`` keeps
    what came before a ``SearchExhausted``."""
    if most is None or most >= sys.maxsize:  # islice takes no more; no answer comes near it
        into.extend(candidates)
    elif most > 0:
        into.extend(itertools.islice(candidates, most))


def _round_robin(iterators: List[Iterator[Candidate]]) -> Iterator[Candidate]:
    """One item of each iterator in turn, dropping the exhausted ones."""
    active = list(iterators)
    while active:
        still: List[Iterator[Candidate]] = []
        for iterator in active:
            item = next(iterator, None)
            if item is not None:
                still.append(iterator)
                yield item
        active = still
