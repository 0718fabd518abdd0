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
  none of them; its aggregates on each provider or that provider's root;
* every group of a candidate is anchored on the same tree; with
  ``group_policy=isolate`` the suffixed groups use distinct providers;
* before 1.29 a candidate never uses two providers of one tree.

The flat case without sharing providers never comes here: ``allocation_candidate``
answers it with one cached SQL statement.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

import os_traits
from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import Select

from ..candidate_request import CandidateRequest, Group
from ..db import provider_traits
from ..exception import ResourceClassNotFound
from . import resource_class, static_world, trait
from .raw_rows import fetch_all, joined_ids, split_ids

# A guard against combinatorial explosion: a request that would build more
# combinations than this is answered with what was found so far.
MAX_COMBINATIONS = 200_000


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
    connection: Connection, request: CandidateRequest, nested_aware: bool
) -> Tuple[Found, Dict[str, int], Dict[str, int]]:
    """(found, class ids by name, trait ids by name); 400 for unknown classes or traits."""
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
    return Found(_combine(world, request, filters, per_group, nested_aware), world, suffixes), class_ids, trait_ids


def _combine(
    world: World,
    request: CandidateRequest,
    filters: List[_Filters],
    per_group: List[Dict[int, List[Part]]],
    nested_aware: bool,
) -> List[Candidate]:
    """Every pick of one part per group, anchored on the same tree, that meets
    ``group_policy``, ``same_subtree`` and the capacity of what several groups take
    from one provider; in anchor order, at most ``MAX_COMBINATIONS`` picks looked at."""
    numbered = [index for index, f in enumerate(filters) if f.group.same_provider]
    isolate = request.group_policy == "isolate" and len(numbered) > 1
    suffix_index = {f.group.suffix: index for index, f in enumerate(filters)}
    subtrees = [[suffix_index[s] for s in subtree] for subtree in request.same_subtrees]
    # The parts of a pick take from distinct providers when at most one group takes
    # anything, or when every group is numbered and isolated (each part is one
    # provider, and isolate keeps them apart): then nothing needs merging.
    taking = [index for index, f in enumerate(filters) if f.amounts]
    apart = len(taking) < 2 or (isolate and len(numbered) == len(filters))
    root = world.root
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
    candidates: List[Candidate] = []
    seen: Set[Any] = set()
    anchors = set.intersection(*(set(parts) for parts in per_group))
    budget = MAX_COMBINATIONS
    for anchor in sorted(anchors):
        for pick in itertools.product(*[parts[anchor] for parts in per_group]):
            budget -= 1
            if budget < 0:
                break
            if isolate and len({pick[index][0][0] for index in numbered}) != len(numbered):
                continue
            if subtrees and not all(_same_subtree(commons, [pick[i] for i in subtree]) for subtree in subtrees):
                continue
            merged: Optional[Allocations] = None
            if not apart:
                merged = _merged(world, pick)
                if merged == ():  # two groups took more of one provider than it has
                    continue
            if not nested_aware:  # before 1.29, never two providers of one tree
                entries = merged if merged is not None else [entry for part in pick for entry in part[1]]
                if len({root[rp_id] for rp_id, _amounts in entries}) != len(entries):
                    continue
            if world.sharing:  # a sharing provider serves several anchors: the same candidate may recur
                allocations = merged if merged is not None else tuple(entry for part in pick for entry in part[1])
                key = (tuple(sorted(allocations)), tuple(tuple(part[2]) for part in pick))
                if key in seen:
                    continue
                seen.add(key)
            candidates.append((pick, merged))
        if budget < 0:
            break
    return candidates


def _merged(world: World, pick: Tuple[Part, ...]) -> Optional[Allocations]:
    """The allocations of ``pick``'s parts, summed per provider and class; None when
    the parts take from distinct providers (nothing to merge), () when a sum exceeds
    what the provider can give."""
    entries = [entry for part in pick for entry in part[1]]
    if len({rp_id for rp_id, _amounts in entries}) == len(entries):
        return None
    allocations: Dict[int, Dict[int, int]] = {}
    shared = False  # several groups take the same class of one provider: check the sum
    for rp_id, amounts in entries:
        per = allocations.get(rp_id)
        if per is None:
            allocations[rp_id] = dict(amounts)
            continue
        for rc_id, amount in amounts:
            if rc_id in per:
                per[rc_id] += amount
                shared = True
            else:
                per[rc_id] = amount
    # A part's own amounts fit (each was checked on its row): only sums can exceed.
    if shared and _exceeds(world, allocations):
        return ()
    return tuple((rp_id, tuple(sorted(per.items()))) for rp_id, per in allocations.items())


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
            for anchor in anchors:
                root_for_aggregates = anchor if rp_id in world.sharing else world.root[rp_id]
                if not _aggregates_ok(world, f.group, rp_id, root_for_aggregates):
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


def _exceeds(world: World, allocations: Dict[int, Dict[int, int]]) -> bool:
    for rp_id, per in allocations.items():
        for rc_id, amount in per.items():
            _rp, _rc, capacity, used, _min_unit, max_unit, _step = world.rows[rc_id][rp_id]
            if used + amount > int(capacity) or amount > max_unit:
                return True
    return False
