"""The parts of candidates: what one request group can take, tree by tree.

Decides, per group, which providers (or, for the unsuffixed group, which combinations
of a tree's providers and the sharing providers tied to it) meet the group's
resources, traits and aggregates, keyed by the anchor tree (root) they serve:

* a suffixed group is met by one provider that has all of its resources, traits
  (its own) and aggregates (its own);
* the unsuffixed group may spread its classes over the providers of one tree and
  the sharing providers tied to that tree by an aggregate; its required traits must
  be on the union of those providers and its forbidden traits on none of them; its
  aggregates on each provider of the tree or that provider's root, and on each
  sharing provider itself.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from ..candidate_request import Group
from .candidate_world import World

# What one part of a candidate takes from each of its providers: (provider,
# ((class, amount), ...) by class id), one entry per provider.
Allocations = Tuple[Tuple[int, Tuple[Tuple[int, int], ...]], ...]

# One part of a candidate: the provider ids a group uses (sorted by id), what it
# takes from them, and the providers sorted by uuid (the group's ``mappings``
# entry, worked out once per part, not per candidate).  Parts are shared by every
# candidate that uses them.
Part = Tuple[Tuple[int, ...], Allocations, List[int]]

# What a part takes, as ((provider, class), amount) pairs.
Need = Tuple[Tuple[Tuple[int, int], int], ...]
# A part as the search tries it: (part, what it takes, the providers it takes from).
Entry = Tuple[Part, Need, Tuple[int, ...]]


@dataclass
class Filters:
    """A group with names resolved to ids."""

    group: Group
    amounts: Dict[int, int]
    required: List[FrozenSet[int]]
    forbidden: Set[int]
    tree_root: Optional[int]


def anchors_of_sharing(world: World) -> Dict[int, Set[int]]:
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


def same_provider_parts(world: World, f: Filters, anchors_of: Dict[int, Set[int]]) -> Dict[int, List[Part]]:
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


def tree_parts(world: World, f: Filters, anchors_of: Dict[int, Set[int]]) -> Dict[int, List[Part]]:
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
