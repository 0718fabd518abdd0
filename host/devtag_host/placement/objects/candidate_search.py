"""The general path of ``GET /allocation_candidates``: sharing providers,
nested trees (1.29), granular groups (1.25), ``group_policy``, ``in_tree``,
``root_required``, ``same_subtree`` and ``mappings`` (1.34).

It reads the providers, their relevant traits and aggregates and the inventory
rows of the requested classes once, then combines in Python, following
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

import itertools
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

import os_traits
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from .. import errors
from ..candidate_request import CandidateRequest, Group
from ..db import inventories, provider_aggregates, provider_traits, resource_providers
from . import resource_class, trait

# A guard against combinatorial explosion: a request that would build more
# combinations than this is answered with what was found so far.
MAX_COMBINATIONS = 200_000


@dataclass
class Row:
    capacity: int
    used: int
    min_unit: int
    max_unit: int
    step_size: int

    def fits(self, amount: int) -> bool:
        return (
            self.capacity - self.used >= amount
            and self.min_unit <= amount <= self.max_unit
            and amount % self.step_size == 0
        )


@dataclass
class World:
    """What the search needs of the database, read once per request."""

    uuid: Dict[int, str]
    parent: Dict[int, Optional[int]]
    root: Dict[int, int]
    traits: Dict[int, Set[int]]
    aggregates: Dict[int, Set[str]]
    rows: Dict[Tuple[int, int], Row]
    sharing: Set[int]
    by_class: Dict[int, Set[int]] = field(default_factory=dict)  # class id -> providers with a row of it
    _lineage: Dict[int, FrozenSet[int]] = field(default_factory=dict)

    def lineage(self, rp: int) -> FrozenSet[int]:
        """``rp`` and its ancestors, remembered (same_subtree asks for them per candidate)."""
        found = self._lineage.get(rp)
        if found is None:
            found = self._lineage[rp] = frozenset(self.ancestors(rp))
        return found

    def ancestors(self, rp: int) -> List[int]:
        """``rp`` and its ancestors up to the root."""
        chain = [rp]
        seen = {rp}
        while self.parent.get(chain[-1]) is not None:
            up = self.parent[chain[-1]]
            if up in seen:  # pragma: no cover - loops are refused on write
                break
            seen.add(up)  # type: ignore[arg-type]
            chain.append(up)  # type: ignore[arg-type]
        return chain


# One part of a candidate: the provider ids a group uses and {provider: {class: amount}}.
Part = Tuple[Tuple[int, ...], Tuple[Tuple[int, int, int], ...]]


@dataclass
class Found:
    """Candidates as (allocations {rp: {rc: amount}}, mappings {suffix: [rp]}), and the
    providers whose summaries the answer carries."""

    candidates: List[Tuple[Dict[int, Dict[int, int]], Dict[str, List[int]]]]
    world: World


def load(connection: Connection, class_ids: Iterable[int], trait_ids: Iterable[int], shares_id: Optional[int]) -> World:
    rp = resource_providers
    uuid: Dict[int, str] = {}
    parent: Dict[int, Optional[int]] = {}
    root: Dict[int, int] = {}
    for rp_id, rp_uuid, parent_id, root_id in connection.execute(
        select(rp.c.id, rp.c.uuid, rp.c.parent_provider_id, func.coalesce(rp.c.root_provider_id, rp.c.id))
    ):
        uuid[rp_id], parent[rp_id], root[rp_id] = rp_uuid, parent_id, root_id
    wanted_traits = set(trait_ids) | ({shares_id} if shares_id is not None else set())
    traits: Dict[int, Set[int]] = {}
    if wanted_traits:
        for rp_id, trait_id in connection.execute(
            select(provider_traits.c.resource_provider_id, provider_traits.c.trait_id).where(
                provider_traits.c.trait_id.in_(sorted(wanted_traits))
            )
        ):
            traits.setdefault(rp_id, set()).add(trait_id)
    aggregates: Dict[int, Set[str]] = {}
    for rp_id, agg in connection.execute(
        select(provider_aggregates.c.resource_provider_id, provider_aggregates.c.aggregate_uuid)
    ):
        aggregates.setdefault(rp_id, set()).add(agg)
    rows: Dict[Tuple[int, int], Row] = {}
    class_ids = sorted(set(class_ids))
    if class_ids:
        inv = inventories
        for rp_id, rc_id, total, reserved, ratio, used, min_unit, max_unit, step in connection.execute(
            select(
                inv.c.resource_provider_id,
                inv.c.resource_class_id,
                inv.c.total,
                inv.c.reserved,
                inv.c.allocation_ratio,
                inv.c.used,
                inv.c.min_unit,
                inv.c.max_unit,
                inv.c.step_size,
            ).where(inv.c.resource_class_id.in_(class_ids))
        ):
            rows[(rp_id, rc_id)] = Row(int((total - reserved) * ratio), int(used), min_unit, max_unit, step)
    sharing = {rp_id for rp_id, have in traits.items() if shares_id is not None and shares_id in have}
    by_class: Dict[int, Set[int]] = {}
    for rp_id, rc_id in rows:
        by_class.setdefault(rc_id, set()).add(rp_id)
    return World(uuid, parent, root, traits, aggregates, rows, sharing, by_class)


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
        raise errors.bad_request(f"Invalid resource class in resources parameter: No such resource class {unknown[0]}.")
    trait_ids = trait.require_ids(connection, sorted(request.trait_names())) if request.trait_names() else {}
    shares_id = trait.ids_by_name(connection, [os_traits.MISC_SHARES_VIA_AGGREGATE]).get(
        os_traits.MISC_SHARES_VIA_AGGREGATE
    )
    world = load(connection, class_ids.values(), trait_ids.values(), shares_id)
    by_uuid = {uuid: rp_id for rp_id, uuid in world.uuid.items()}
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

    def root_ok(root: int) -> bool:
        have = world.traits.get(root, set())
        return all(have & any_of for any_of in root_required) and not have & root_forbidden

    anchors_of = _anchors_of_sharing(world)
    # Per group: {anchor root: [part, ...]}
    per_group: List[Dict[int, List[Part]]] = []
    for f in filters:
        search_parts = _same_provider_parts if f.group.same_provider else _tree_parts
        parts = search_parts(world, f, anchors_of)
        parts = {anchor: found for anchor, found in parts.items() if root_ok(anchor)}
        if not parts:
            return Found([], world), class_ids, trait_ids
        per_group.append(parts)

    numbered = [index for index, f in enumerate(filters) if f.group.same_provider]
    suffix_index = {f.group.suffix: index for index, f in enumerate(filters)}
    candidates: List[Tuple[Dict[int, Dict[int, int]], Dict[str, List[int]]]] = []
    seen: Set[Any] = set()
    anchors = set.intersection(*(set(parts) for parts in per_group))
    budget = MAX_COMBINATIONS
    for anchor in sorted(anchors):
        for pick in itertools.product(*(parts[anchor] for parts in per_group)):
            budget -= 1
            if budget < 0:
                break
            if request.group_policy == "isolate" and len(numbered) > 1:
                if len({pick[index][0][0] for index in numbered}) != len(numbered):
                    continue
            if not all(
                _same_subtree(world, [pick[suffix_index[s]][0] for s in subtree]) for subtree in request.same_subtrees
            ):
                continue
            allocations: Dict[int, Dict[int, int]] = {}
            for _providers, amounts in pick:
                for rp_id, rc_id, amount in amounts:
                    per = allocations.setdefault(rp_id, {})
                    per[rc_id] = per.get(rc_id, 0) + amount
            if _exceeds(world, allocations):
                continue
            if not nested_aware and len({world.root[rp_id] for rp_id in allocations}) != len(allocations):
                continue
            mappings = {
                f.group.suffix: sorted(set(pick[index][0]), key=lambda rp: world.uuid[rp])
                for index, f in enumerate(filters)
            }
            if world.sharing:  # a sharing provider serves several anchors: the same candidate may recur
                key = (
                    tuple(sorted((rp, tuple(sorted(per.items()))) for rp, per in allocations.items())),
                    tuple(sorted((s, tuple(v)) for s, v in mappings.items())),
                )
                if key in seen:
                    continue
                seen.add(key)
            candidates.append((allocations, mappings))
        if budget < 0:
            break
    return Found(candidates, world), class_ids, trait_ids


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
    parts: Dict[int, List[Part]] = {}
    if f.amounts:
        having = set.intersection(*(world.by_class.get(rc, set()) for rc in f.amounts))
    else:  # a resourceless group (1.36): any provider with the traits and aggregates
        having = set(world.uuid)
    for rp_id in sorted(having):
        if f.tree_root is not None and world.root[rp_id] != f.tree_root:
            continue
        if not all((rp_id, rc) in world.rows and world.rows[(rp_id, rc)].fits(n) for rc, n in f.amounts.items()):
            continue
        have = world.traits.get(rp_id, set())
        if not all(have & any_of for any_of in f.required) or have & f.forbidden:
            continue
        if not _aggregates_ok(world, f.group, rp_id, None):
            continue
        part: Part = ((rp_id,), tuple((rp_id, rc, n) for rc, n in sorted(f.amounts.items())))
        for anchor in anchors_of.get(rp_id, {world.root[rp_id]}):
            parts.setdefault(anchor, []).append(part)
    return parts


def _tree_parts(world: World, f: _Filters, anchors_of: Dict[int, Set[int]]) -> Dict[int, List[Part]]:
    """The unsuffixed group: per anchor tree, each way to take every class from the
    tree's providers or its sharing providers."""
    # {anchor: {class: [provider, ...]}}
    options: Dict[int, Dict[int, List[int]]] = {}
    for (rp_id, rc_id), row in world.rows.items():
        amount = f.amounts.get(rc_id)
        if amount is None or not row.fits(amount):
            continue
        if rp_id in world.sharing:
            if f.tree_root is not None and world.root[rp_id] != f.tree_root:
                continue
            anchors = anchors_of.get(rp_id, {world.root[rp_id]}) if f.tree_root is None else {world.root[rp_id]}
        else:
            if f.tree_root is not None and world.root[rp_id] != f.tree_root:
                continue
            anchors = {world.root[rp_id]}
        for anchor in anchors:
            root_for_aggregates = anchor if rp_id in world.sharing else world.root[rp_id]
            if not _aggregates_ok(world, f.group, rp_id, root_for_aggregates):
                continue
            options.setdefault(anchor, {}).setdefault(rc_id, []).append(rp_id)
    parts: Dict[int, List[Part]] = {}
    wanted = sorted(f.amounts)
    for anchor, by_class in options.items():
        if len(by_class) != len(wanted):
            continue
        found: List[Part] = []
        for pick in itertools.product(*(sorted(set(by_class[rc])) for rc in wanted)):
            providers = tuple(sorted(set(pick)))
            have: Set[int] = set()
            forbidden = False
            for rp_id in providers:
                own = world.traits.get(rp_id, set())
                if own & f.forbidden:
                    forbidden = True
                    break
                have |= own
            if forbidden or not all(have & any_of for any_of in f.required):
                continue
            found.append((providers, tuple((rp_id, rc, f.amounts[rc]) for rc, rp_id in zip(wanted, pick))))
        if found:
            parts[anchor] = found
    return parts


def _same_subtree(world: World, providers_of_groups: List[Tuple[int, ...]]) -> bool:
    """One of the providers is an ancestor (or itself) of every other."""
    everyone = {rp for providers in providers_of_groups for rp in providers}
    for top in everyone:
        if all(top in world.lineage(rp) for rp in everyone):
            return True
    return False


def _exceeds(world: World, allocations: Dict[int, Dict[int, int]]) -> bool:
    for rp_id, per in allocations.items():
        for rc_id, amount in per.items():
            row = world.rows[(rp_id, rc_id)]
            if row.used + amount > row.capacity or amount > row.max_unit:
                return True
    return False
