"""The general path of ``GET /allocation_candidates``: sharing providers,
nested trees (1.29), granular groups (1.25), ``group_policy``, ``in_tree``,
``root_required``, ``same_subtree`` and ``mappings`` (1.34).

It takes the providers, their traits and aggregates and the inventory rows from
``static_world`` (kept between requests, with this request's usage) or, without a
trustworthy change stamp, reads them, then combines in Python, following
OpenStack Placement's semantics:

* a suffixed group is met by one provider that has all of its resources,
  traits (its own) and aggregates (its own);
* the unsuffixed group may spread its classes over the providers of one tree
  and the sharing providers tied to that tree by an aggregate; its required
  traits must be on the union of those providers and its forbidden traits on
  none of them; its aggregates on each provider of the tree or that provider's
  root, and on each sharing provider itself;
* every group of a candidate is anchored on the same tree; with
  ``group_policy=isolate`` the suffixed groups use distinct providers;
* before 1.29 a candidate never uses two providers of one tree.

The flat case without sharing providers never comes here: ``allocation_candidate``
answers it with one cached SQL statement.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import sys
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Set, Tuple

import os_traits
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Select

from ..candidate_request import CandidateRequest, Group
from ..candidate_settings import BREADTH_FIRST, UPSTREAM_DEFAULTS, CandidateSettings
from ..db import provider_traits
from ..exception import ResourceClassNotFound
from . import resource_class, static_world, trait
from .raw_rows import fetch_all, joined_ids, split_ids

# A guard for the service: a search that would look at more picks than this (an
# answer of billions of candidates asked for without ``limit`` or
# ``max_allocation_candidates``) stops and answers what it found, marked as cut
# short (``Found.cut_after``): the answer says so in a header, the log and the metrics.
MAX_SEARCH_STEPS = 2_000_000
# Below this many arrangements of an anchor's parts, the search runs without its quick
# feasibility checks (they cost more than trying the few arrangements).
_FEW_ARRANGEMENTS = 64


# An inventory row as read: (provider, class, capacity, used, min_unit, max_unit,
# step_size), the capacity as SQL computes it (a float).  ``amount`` fits when
# int(capacity) - used >= amount, min_unit <= amount <= max_unit and amount %
# step_size == 0 (``World.fitting``).
Row = static_world.Row
_EXACT_FLOATS = float(2**53)  # every integer up to here is a float, and differences of them are exact

# What one part of a candidate takes from each of its providers: (provider,
# ((class, amount), ...) by class id), one entry per provider.
Allocations = Tuple[Tuple[int, Tuple[Tuple[int, int], ...]], ...]


@dataclass
class World:
    """What the search needs of the database, read once per request."""

    uuid: Dict[int, str]
    parent: Dict[int, Optional[int]]
    root: Dict[int, int]
    traits: Mapping[int, AbstractSet[int]]  # provider -> its traits (at least the wanted ones)
    aggregates: Dict[int, Set[str]]  # read only when a group names aggregates or sharing providers exist
    # class -> {provider: its row}, for every class: the search reads the requested
    # ones, the summaries all of them (1.27), and one read of the table serves both.
    rows: Dict[int, Dict[int, Row]]
    sharing: Set[int]
    with_trait: Mapping[int, AbstractSet[int]] = field(default_factory=dict)  # wanted trait id -> its providers
    _fitting: Dict[Tuple[int, int], Set[int]] = field(default_factory=dict)
    _lineage: Dict[int, FrozenSet[int]] = field(default_factory=dict)
    kept: Optional[static_world.StaticWorld] = None  # what it was built on, if kept between requests
    # With ``kept``: the providers with a row in use -> [(class, used), ...] of those rows.
    in_use: Mapping[int, List[Tuple[int, int]]] = field(default_factory=dict)
    rows_in_use: Mapping[int, Mapping[int, Row]] = field(default_factory=dict)  # with ``kept``: class -> those rows

    def lineage(self, rp_id: int) -> FrozenSet[int]:
        """The provider and its ancestors (remembered, and built on the parent's)."""
        found = self._lineage.get(rp_id)
        if found is not None:
            return found
        chain: List[int] = []
        up: Optional[int] = rp_id
        while up is not None and up not in self._lineage and len(chain) <= len(self.parent):
            chain.append(up)  # the length bound: a loop is refused on write, but never hang on one
            up = self.parent.get(up)
        found = self._lineage.get(up, frozenset()) if up is not None else frozenset()
        for node in reversed(chain):
            found = self._lineage[node] = found | {node}
        return found

    def fitting(self, rc_id: int, amount: int) -> Set[int]:
        """The providers that can take ``amount`` of class ``rc_id`` (remembered: several
        groups may ask for the same)."""
        found = self._fitting.get((rc_id, amount))
        if found is None:
            if self.kept is None:
                found = _fitting_rows(self.rows.get(rc_id, {}), amount)
            else:
                found = self._fitting_on_kept(self.kept, rc_id, amount)
            self._fitting[(rc_id, amount)] = found
        return found

    def _fitting_on_kept(self, kept: static_world.StaticWorld, rc_id: int, amount: int) -> Set[int]:
        """``fitting`` from what the kept world remembers for its rows without usage,
        corrected by this request's rows in use: the class's other rows are not
        looked at again."""
        unused = kept.fitting_unused.get((rc_id, amount))
        if unused is None:
            unused = frozenset(_fitting_rows(kept.rows.get(rc_id, {}), amount))
            if len(kept.fitting_unused) < static_world.MAX_REMEMBERED_AMOUNTS:  # bounded: amounts come from queries
                kept.fitting_unused[(rc_id, amount)] = unused
        found = set(unused)
        in_use = self.rows_in_use.get(rc_id)
        if in_use:
            fit = _fitting_rows(in_use, amount)
            found.difference_update(in_use)
            found.update(fit)
        return found


def _fitting_rows(rows: Mapping[int, Row], amount: int) -> Set[int]:
    """The providers of ``rows`` (one class) that can take ``amount``: ``fits`` inlined,
    since this looks at every row of a class.  Below 2**53 the float difference is
    exact and compares as int(capacity) - used would."""
    return {
        rp_id
        for rp_id, (_rp, _rc, capacity, used, min_unit, max_unit, step_size) in rows.items()
        if (capacity - used >= amount if capacity < _EXACT_FLOATS else int(capacity) - used >= amount)
        and min_unit <= amount <= max_unit
        and amount % step_size == 0
    }


# One part of a candidate: the provider ids a group uses (sorted by id), what it
# takes from them, and the providers sorted by uuid (the group's ``mappings``
# entry, worked out once per part, not per candidate).  Parts are shared by every
# candidate that uses them.
Part = Tuple[Tuple[int, ...], Allocations, List[int]]

# What a part takes, as ((provider, class), amount) pairs.
Need = Tuple[Tuple[Tuple[int, int], int], ...]
# A part as the search tries it: (part, what it takes, the providers it takes from).
_Entry = Tuple[Part, Need, Tuple[int, ...]]

# A candidate: one part per group (in group order), and, only when two of its parts
# take from the same provider, their allocations merged (else None: the parts'
# allocations side by side are the candidate's).
Candidate = Tuple[Tuple[Part, ...], Optional[Allocations]]


@dataclass
class Found:
    """The candidates, in the answer's order, and what they were searched in."""

    candidates: List[Candidate]
    world: World
    suffixes: List[str] = field(default_factory=list)  # the groups' suffixes, in the parts' order
    cut_after: Optional[int] = None  # the search stopped after this many steps: candidates may be missing


@functools.lru_cache(maxsize=4)
def _providers_of_traits(dialect: str) -> Select[Any]:
    """SQL: each wanted trait (``b_traits``) with the joined ids of its providers."""
    return (
        select(provider_traits.c.trait_id, joined_ids(provider_traits.c.resource_provider_id, dialect))
        .where(provider_traits.c.trait_id.in_(bindparam("b_traits", expanding=True)))
        .group_by(provider_traits.c.trait_id)
    )


def load(
    connection: Connection,
    trait_ids: Iterable[int],
    shares_id: Optional[int],
    with_aggregates: bool = True,
) -> World:
    """The world of this request: the kept static rows with this request's usage
    (``static_world``), else everything read now (``read_all``)."""
    found = static_world.current(connection)
    if found is None:
        return read_all(connection, trait_ids, shares_id, with_aggregates)
    kept, usage = found
    empty: FrozenSet[int] = frozenset()
    wanted_traits = set(trait_ids) | ({shares_id} if shares_id is not None else set())
    with_trait = {trait_id: kept.with_trait.get(trait_id, empty) for trait_id in wanted_traits}
    sharing = set(with_trait[shares_id]) if shares_id is not None else set()
    rows, rows_in_use = static_world.with_usage(kept, usage)
    in_use: Dict[int, List[Tuple[int, int]]] = {}
    for rp_id, rc_id, used in usage:
        listed = in_use.get(rp_id)
        if listed is None:
            in_use[rp_id] = [(rc_id, used)]
        else:
            listed.append((rc_id, used))
    return World(
        kept.uuid,
        kept.parent,
        kept.root,
        kept.traits,  # all of a provider's traits: the search only intersects them with wanted ones
        kept.aggregates,
        rows,
        sharing,
        with_trait,
        _lineage=kept.lineage,
        kept=kept,
        in_use=in_use,
        rows_in_use=rows_in_use,
    )


def read_all(
    connection: Connection,
    trait_ids: Iterable[int],
    shares_id: Optional[int],
    with_aggregates: bool = True,
) -> World:
    """Read the providers, the wanted traits, the inventories and (when ``with_aggregates``
    or sharing providers exist) the aggregates: four statements built once, each row
    list fetched whole (row by row iteration cost more than SQLite's work)."""
    providers = fetch_all(connection, static_world.PROVIDERS)
    ids = [row[0] for row in providers]
    uuid: Dict[int, str] = dict(zip(ids, [row[1] for row in providers]))
    parent: Dict[int, Optional[int]] = dict(zip(ids, [row[2] for row in providers]))
    root: Dict[int, int] = dict(zip(ids, [row[3] for row in providers]))
    wanted_traits = set(trait_ids) | ({shares_id} if shares_id is not None else set())
    traits: Dict[int, Set[int]] = {}
    with_trait: Dict[int, Set[int]] = {trait_id: set() for trait_id in wanted_traits}
    if wanted_traits:
        query = _providers_of_traits(connection.dialect.name)
        for trait_id, joined in connection.execute(query, {"b_traits": sorted(wanted_traits)}).all():
            having = with_trait[trait_id] = set(split_ids(joined))
            for rp_id in having:
                traits.setdefault(rp_id, set()).add(trait_id)
    sharing = set(with_trait[shares_id]) if shares_id is not None else set()
    aggregates: Dict[int, Set[str]] = {}
    if with_aggregates or sharing:
        for rp_id, agg in fetch_all(connection, static_world.AGGREGATES):
            aggregates.setdefault(rp_id, set()).add(agg)
    rows: Dict[int, Dict[int, Row]] = {}
    for row in fetch_all(connection, static_world.INVENTORY):
        of_class = rows.get(row[1])
        if of_class is None:
            rows[row[1]] = {row[0]: row}
        else:
            of_class[row[0]] = row
    return World(uuid, parent, root, traits, aggregates, rows, sharing, with_trait)


@dataclass
class _Filters:
    """A group with names resolved to ids."""

    group: Group
    amounts: Dict[int, int]
    required: List[FrozenSet[int]]
    forbidden: Set[int]
    tree_root: Optional[int]


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
    filters: List[_Filters] = []
    for group in request.groups:
        tree_root = None
        if group.in_tree is not None:
            if group.in_tree not in by_uuid:
                return Found([], world), class_ids, trait_ids
            tree_root = world.root[by_uuid[group.in_tree]]
        filters.append(
            _Filters(
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

    anchors_of = _anchors_of_sharing(world)
    # Per group: {anchor root: [part, ...]}
    per_group: List[Dict[int, List[Part]]] = []
    for f in filters:
        search_parts = _same_provider_parts if f.group.same_provider else _tree_parts
        parts = search_parts(world, f, anchors_of)
        if root_required or root_forbidden:
            parts = {anchor: found for anchor, found in parts.items() if root_ok(anchor)}
        if not parts:
            return Found([], world), class_ids, trait_ids
        per_group.append(parts)
    suffixes = [f.group.suffix for f in filters]
    combined, cut_after = _combine(world, request, filters, per_group, nested_aware, settings, limit)
    return Found(combined, world, suffixes, cut_after), class_ids, trait_ids


class SearchExhausted(Exception):
    """The search looked at ``MAX_SEARCH_STEPS`` picks before it could finish."""


@dataclass
class _Plan:
    """What every anchor's search shares: the request-wide constraints."""

    world: World
    nested_aware: bool
    numbered: List[bool]  # per group: a suffixed group (group_policy=isolate keeps them apart when ``isolate``)
    isolate: bool
    track: bool  # several groups take resources: what they take from one provider must be summed
    subtrees: List[List[int]]  # same_subtree: group indexes
    commons: Dict[int, FrozenSet[int]]  # id(part) -> the common lineage of its providers (with ``subtrees``)
    seen: Optional[Set[Any]]  # with sharing providers: the candidates answered (one may recur under another anchor)
    steps: int = MAX_SEARCH_STEPS


def _combine(
    world: World,
    request: CandidateRequest,
    filters: List[_Filters],
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
    plan = _Plan(world, nested_aware, numbered, isolate, not apart, subtrees, commons, set() if world.sharing else None)
    plan.steps = MAX_SEARCH_STEPS  # the module's value now (the field's default was read at import)
    anchors = sorted(set.intersection(*(set(parts) for parts in per_group)))
    searches = [_anchor_candidates(plan, [parts[anchor] for parts in per_group]) for anchor in anchors]
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


def _anchor_candidates(plan: _Plan, lists: List[List[Part]]) -> Iterator[Candidate]:
    """The candidates of one anchor: groups assigned one at a time, and a branch cut
    as soon as its prefix over-allocates a provider or breaks ``group_policy=isolate``
    or ``same_subtree``.  The groups with the fewest parts go first (the tightest
    choices prune most); a candidate's parts stay in the request's group order.

    The search keeps its own stack (a generator per level would hand every
    candidate up through all of them) and, per (provider, class), the room left."""
    count = len(lists)
    if not count:
        return
    # The quick checks pay only where there are many arrangements to try.
    many = math.prod(len(listed) for listed in lists) > _FEW_ARRANGEMENTS
    room: Dict[Tuple[int, int], int] = {}
    if plan.track:
        found = _room(plan, lists, many)
        if found is None:
            return
        room = found
    if many and plan.isolate and not _isolation_may_fit(plan, lists):
        return
    order = sorted(range(count), key=lambda index: (len(lists[index]), index))
    position = {group: depth for depth, group in enumerate(order)}
    checks_at: List[List[List[int]]] = [[] for _ in range(count)]
    for subtree in plan.subtrees:  # checked once its last group (in ``order``) has a part
        checks_at[max(position[group] for group in subtree)].append(subtree)
    keep_apart = [plan.isolate and plan.numbered[group] for group in order]
    track = plan.track
    # Per level: (part, what it takes as ((provider, class), amount) pairs, its providers).
    levels: List[List[_Entry]] = []
    if track:
        needs: Dict[int, Need] = {}
        for group in order:
            level = []
            for part in lists[group]:
                need = needs.get(id(part))
                if need is None:
                    need = needs[id(part)] = tuple(
                        ((rp_id, rc_id), amount) for rp_id, amounts in part[1] for rc_id, amount in amounts
                    )
                level.append((part, need, tuple(rp_id for rp_id, _amounts in part[1])))
            levels.append(level)
    else:  # nothing to sum: only the parts themselves
        levels = [[(part, (), ()) for part in lists[group]] for group in order]
    one_need = [track and all(len(entry[1]) == 1 for entry in level) for level in levels]

    def viable(depth: int) -> List[_Entry]:
        """The level's parts that fit beside the levels above: what they hold does not
        change while this level tries its parts (each is released before the next)."""
        level = levels[depth]
        if track:
            if one_need[depth]:
                level = [entry for entry in level if room[entry[1][0][0]] >= entry[1][0][1]]
            else:
                level = [entry for entry in level if all(room[key] >= amount for key, amount in entry[1])]
        if keep_apart[depth]:
            level = [entry for entry in level if entry[0][0][0] not in isolated]
        return level

    pick: List[Part] = [listed[0] for listed in lists]
    commons = plan.commons
    holders: Dict[int, int] = {}  # provider -> how many assigned parts take from it
    shared = 0  # parts that take from a provider an earlier part takes from: the pick's allocations need merging
    isolated: Set[int] = set()
    # Per level, what its current part holds (released before the level's next part).
    held: List[Optional[Need]] = [None] * count
    held_by: List[Tuple[int, ...]] = [()] * count
    apart_rp: List[int] = [-1] * count
    shares: List[int] = [0] * count
    next_at: List[int] = [0] * count
    trying: List[List[_Entry]] = [[] for _ in range(count)]
    last = count - 1
    steps = plan.steps - len(levels[0])
    trying[0] = viable(0)
    depth = 0
    try:
        while depth >= 0:
            need = held[depth]
            if need is not None:  # release the level's previous part
                for key, amount in need:
                    room[key] += amount
                for rp_id in held_by[depth]:
                    holders[rp_id] -= 1
                shared -= shares[depth]
                shares[depth] = 0
                held[depth] = None
            if apart_rp[depth] >= 0:
                isolated.discard(apart_rp[depth])
                apart_rp[depth] = -1
            level = trying[depth]
            index = next_at[depth]
            if index == len(level):
                depth -= 1
                continue
            next_at[depth] = index + 1
            part, need, providers = level[index]
            if need:
                for key, amount in need:
                    room[key] -= amount
                held[depth] = need
                held_by[depth] = providers
                added = 0
                for rp_id in providers:
                    before = holders.get(rp_id, 0)
                    holders[rp_id] = before + 1
                    if before:
                        added += 1
                shares[depth] = added
                shared += added
            group = order[depth]
            pick[group] = part
            checks = checks_at[depth]
            if checks and not all(_same_subtree(commons, [pick[i] for i in subtree]) for subtree in checks):
                continue
            if keep_apart[depth]:
                apart_rp[depth] = part[0][0]
                isolated.add(part[0][0])
            if depth == last:
                candidate = _candidate(plan, tuple(pick), shared > 0)
                if candidate is not None:
                    yield candidate
            else:
                depth += 1
                next_at[depth] = 0
                steps -= len(levels[depth])
                if steps < 0:
                    raise SearchExhausted()
                trying[depth] = viable(depth)
    finally:
        plan.steps = steps


def _room(plan: _Plan, lists: List[List[Part]], check: bool) -> Optional[Dict[Tuple[int, int], int]]:
    """What each (provider, class) of the anchor's parts can still give (capacity left,
    at most max_unit); with ``check``, None when the groups together want more of a
    class than all of them have: a quick necessary condition, so that a request that
    cannot fit a tree (more groups than providers) is not searched through every
    arrangement."""
    rows = plan.world.rows
    room: Dict[Tuple[int, int], int] = {}
    for listed in lists:
        for part in listed:
            for rp_id, amounts in part[1]:
                for rc_id, _amount in amounts:
                    if (rp_id, rc_id) not in room:
                        _rp, _rc, capacity, used, _min_unit, max_unit, _step = rows[rc_id][rp_id]
                        room[(rp_id, rc_id)] = max(0, min(int(capacity) - used, max_unit))
    if not check:
        return room
    demand: Dict[int, int] = {}
    for listed in lists:
        for rc_id, amount in _amounts_of(listed[0]):
            demand[rc_id] = demand.get(rc_id, 0) + amount
    supply: Dict[int, int] = {}
    for (_rp_id, rc_id), left in room.items():
        supply[rc_id] = supply.get(rc_id, 0) + left
    if any(supply.get(rc_id, 0) < amount for rc_id, amount in demand.items()):
        return None
    return room


def _isolation_may_fit(plan: _Plan, lists: List[List[Part]]) -> bool:
    """Isolated groups have as many providers between them as there are groups."""
    numbered = [listed for listed, own in zip(lists, plan.numbered) if own]
    return len({part[0][0] for listed in numbered for part in listed}) >= len(numbered)


def _amounts_of(part: Part) -> List[Tuple[int, int]]:
    """What a part takes per class, summed over its providers (every part of a group takes the same)."""
    summed: Dict[int, int] = {}
    for _rp_id, amounts in part[1]:
        for rc_id, amount in amounts:
            summed[rc_id] = summed.get(rc_id, 0) + amount
    return list(summed.items())


def _candidate(plan: _Plan, pick: Tuple[Part, ...], merge: bool) -> Optional[Candidate]:
    """The candidate of a complete ``pick``, or None when it is not one: before 1.29
    two providers of one tree, or with sharing providers one already answered.
    ``merge``: two of its parts take from one provider (their allocations are summed)."""
    merged: Optional[Allocations] = None
    if merge:
        per_provider: Dict[int, Dict[int, int]] = {}
        for part in pick:
            for rp_id, amounts in part[1]:
                summed = per_provider.setdefault(rp_id, {})
                for rc_id, amount in amounts:
                    summed[rc_id] = summed.get(rc_id, 0) + amount
        merged = tuple((rp_id, tuple(sorted(summed.items()))) for rp_id, summed in per_provider.items())
    if not plan.nested_aware:  # before 1.29, never two providers of one tree
        root = plan.world.root
        entries = merged if merged is not None else [entry for part in pick for entry in part[1]]
        if len({root[rp_id] for rp_id, _amounts in entries}) != len(entries):
            return None
    if plan.seen is not None:  # a sharing provider serves several anchors: the same candidate may recur
        allocations = merged if merged is not None else tuple(entry for part in pick for entry in part[1])
        key = (tuple(sorted(allocations)), tuple(tuple(part[2]) for part in pick))
        if key in plan.seen:
            return None
        plan.seen.add(key)
    return pick, merged


def _anchors_of_sharing(world: World) -> Dict[int, Set[int]]:
    """{sharing provider: roots of the trees it serves (its own included)}."""
    if not world.sharing:
        return {}
    by_aggregate: Dict[str, Set[int]] = {}
    for rp_id, aggs in world.aggregates.items():
        for agg in aggs:
            by_aggregate.setdefault(agg, set()).add(rp_id)
    result: Dict[int, Set[int]] = {}
    for sharer in world.sharing:
        roots = {world.root[sharer]}
        for agg in world.aggregates.get(sharer, set()):
            roots |= {world.root[rp_id] for rp_id in by_aggregate[agg]}
        result[sharer] = roots
    return result


def _aggregates_ok(world: World, group: Group, rp_id: int, root: Optional[int]) -> bool:
    """The group's member_of on the provider (or, for the unsuffixed group, its root)."""
    wanted = group.aggregates
    if not wanted:
        return True
    own = world.aggregates.get(rp_id, set())
    if root is None:
        return wanted.admits(own)
    of_root = world.aggregates.get(root, set())
    if (own | of_root) & wanted.forbidden:
        return False
    return all(own & any_of for any_of in wanted.required) or all(of_root & any_of for any_of in wanted.required)


def _shared_aggregates_ok(world: World, group: Group, rp_id: int, anchor: int) -> bool:
    """The unsuffixed group's member_of on a sharing provider lending to another tree:
    the sharing provider itself must be in the aggregates (the anchor's membership
    does not carry over to it, as in OpenStack Placement), and neither it nor the
    anchor in a forbidden one."""
    wanted = group.aggregates
    if not wanted:
        return True
    own = world.aggregates.get(rp_id, set())
    if (own | world.aggregates.get(anchor, set())) & wanted.forbidden:
        return False
    return all(own & any_of for any_of in wanted.required)


def _same_provider_parts(world: World, f: _Filters, anchors_of: Dict[int, Set[int]]) -> Dict[int, List[Part]]:
    """A suffixed group: each provider that has all of it, under every anchor it serves."""
    if f.amounts:
        having = set.intersection(*(world.fitting(rc, n) for rc, n in f.amounts.items()))
    else:  # a resourceless group (1.36): any provider with the traits and aggregates
        having = set(world.uuid)
    # Narrow by the required traits with set operations first: a resourceless group
    # would otherwise look at every provider of the cloud one by one.
    for any_of in f.required:
        having &= set().union(*(world.with_trait[trait_id] for trait_id in any_of))
    for trait_id in f.forbidden:
        having -= world.with_trait[trait_id]
    # The trait sets above are exactly the group's required and forbidden traits: what
    # is left needs only the tree, aggregate and anchor checks.
    amounts = tuple(sorted(f.amounts.items()))
    check_aggregates = bool(f.group.aggregates)
    parts: Dict[int, List[Part]] = {}
    for rp_id in sorted(having):
        root = world.root[rp_id]
        if f.tree_root is not None and root != f.tree_root:
            continue
        if check_aggregates and not _aggregates_ok(world, f.group, rp_id, None):
            continue
        part: Part = ((rp_id,), ((rp_id, amounts),) if amounts else (), [rp_id])
        anchors = anchors_of.get(rp_id)
        if anchors is None:
            found = parts.get(root)
            if found is None:
                parts[root] = [part]
            else:
                found.append(part)
        else:
            for anchor in anchors:
                parts.setdefault(anchor, []).append(part)
    return parts


def _tree_parts(world: World, f: _Filters, anchors_of: Dict[int, Set[int]]) -> Dict[int, List[Part]]:
    """The unsuffixed group: per anchor tree, each way to take every class from the
    tree's providers or its sharing providers."""
    # {anchor: {class: [provider, ...]}}
    options: Dict[int, Dict[int, List[int]]] = {}
    for rc_id, amount in f.amounts.items():
        for rp_id in world.fitting(rc_id, amount):
            if f.tree_root is not None and world.root[rp_id] != f.tree_root:
                continue
            if rp_id in world.sharing:
                anchors = anchors_of.get(rp_id, {world.root[rp_id]}) if f.tree_root is None else {world.root[rp_id]}
            else:
                anchors = {world.root[rp_id]}
            own_root = world.root[rp_id]
            for anchor in anchors:
                if anchor == own_root:
                    if not _aggregates_ok(world, f.group, rp_id, own_root):
                        continue
                elif not _shared_aggregates_ok(world, f.group, rp_id, anchor):
                    continue
                options.setdefault(anchor, {}).setdefault(rc_id, []).append(rp_id)
    parts: Dict[int, List[Part]] = {}
    wanted = sorted(f.amounts)
    no_traits: Set[int] = set()
    for anchor, by_class in options.items():
        if len(by_class) != len(wanted):
            continue
        found: List[Part] = []
        for pick in itertools.product(*(sorted(set(by_class[rc])) for rc in wanted)):
            providers = tuple(sorted(set(pick)))
            have: Set[int] = set()
            forbidden = False
            for rp_id in providers:
                own = world.traits.get(rp_id, no_traits)
                if own & f.forbidden:
                    forbidden = True
                    break
                have |= own
            if forbidden or not all(have & any_of for any_of in f.required):
                continue
            taken: Dict[int, List[Tuple[int, int]]] = {}
            for rc, rp_id in zip(wanted, pick):  # by class id, as ``wanted``
                taken.setdefault(rp_id, []).append((rc, f.amounts[rc]))
            mapped = sorted(providers, key=world.uuid.__getitem__)
            found.append((providers, tuple((rp_id, tuple(amounts)) for rp_id, amounts in taken.items()), mapped))
        if found:
            parts[anchor] = found
    return parts


def _same_subtree(commons: Dict[int, FrozenSet[int]], parts: List[Part]) -> bool:
    """One of the parts' providers is an ancestor (or itself) of every other: it is
    in the intersection of their lineages (``commons``: that intersection per part)."""
    common = frozenset.intersection(*[commons[id(part)] for part in parts])
    return any(not common.isdisjoint(part[0]) for part in parts)
