"""The search of one anchor tree: every pick of one part per group that fits.

Decides which combinations of the groups' parts under one anchor are candidates: what
several groups take from one provider must fit its capacity, ``group_policy=isolate``
keeps the suffixed groups on distinct providers, ``same_subtree`` needs one part's
provider to be an ancestor of the others', and before 1.29 a candidate never uses two
providers of one tree.  A branch is cut as soon as its prefix breaks one of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from .candidate_parts import Allocations, Entry, Need, Part
from .candidate_world import World

# Below this many arrangements of an anchor's parts, the search runs without its quick
# feasibility checks (they cost more than trying the few arrangements).
_FEW_ARRANGEMENTS = 64


# A candidate: one part per group (in group order), and, only when two of its parts
# take from the same provider, their allocations merged (else None: the parts'
# allocations side by side are the candidate's).
Candidate = Tuple[Tuple[Part, ...], Optional[Allocations]]


class SearchExhausted(Exception):
    """The search looked at as many picks as its ``Plan.steps`` allowed before it could finish."""


@dataclass
class Plan:
    """What every anchor's search shares: the request-wide constraints."""

    world: World
    nested_aware: bool
    numbered: List[bool]  # per group: a suffixed group (group_policy=isolate keeps them apart when ``isolate``)
    isolate: bool
    track: bool  # several groups take resources: what they take from one provider must be summed
    subtrees: List[List[int]]  # same_subtree: group indexes
    commons: Dict[int, FrozenSet[int]]  # id(part) -> the common lineage of its providers (with ``subtrees``)
    seen: Optional[Set[Any]]  # with sharing providers: the candidates answered (one may recur under another anchor)
    steps: int  # picks it may still look at (candidate_search.MAX_SEARCH_STEPS at the start)


def anchor_candidates(plan: Plan, lists: List[List[Part]]) -> Iterator[Candidate]:
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
    levels: List[List[Entry]] = []
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
    # Levels whose every part takes from one (provider, class): (that key, the amount,
    # the entry) each, for the check most searches repeat most (one VF per group).
    single: List[Optional[List[Tuple[Tuple[int, int], int, Entry]]]] = [
        [(entry[1][0][0], entry[1][0][1], entry) for entry in level]
        if track and all(len(entry[1]) == 1 for entry in level)
        else None
        for level in levels
    ]

    def viable(depth: int) -> List[Entry]:
        """The level's parts that fit beside the levels above: what they hold does not
        change while this level tries its parts (each is released before the next)."""
        level = levels[depth]
        if track:
            keyed = single[depth]
            if keyed is not None:
                level = [entry for key, amount, entry in keyed if room[key] >= amount]
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
    trying: List[List[Entry]] = [[] for _ in range(count)]
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


def _room(plan: Plan, lists: List[List[Part]], check: bool) -> Optional[Dict[Tuple[int, int], int]]:
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


def _isolation_may_fit(plan: Plan, lists: List[List[Part]]) -> bool:
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


def _candidate(plan: Plan, pick: Tuple[Part, ...], merge: bool) -> Optional[Candidate]:
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


def _same_subtree(commons: Dict[int, FrozenSet[int]], parts: List[Part]) -> bool:
    """One of the parts' providers is an ancestor (or itself) of every other: it is
    in the intersection of their lineages (``commons``: that intersection per part)."""
    common = frozenset.intersection(*[commons[id(part)] for part in parts])
    return any(not common.isdisjoint(part[0]) for part in parts)
