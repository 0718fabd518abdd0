"""The candidate search against brute force: on random small provider trees
(at most 6 providers per tree) with up to two sharing providers, and random
requests (at most 5 groups, both group policies, resourceless groups,
same_subtree, in_tree, root_required), the answer is exactly the set of picks
that checking every combination of every group's options finds; with
``max_allocation_candidates`` or ``limit``, that many distinct members of it; and
the provider summaries cover the trees the answer allocates from.

The oracle is written from OpenStack Placement's semantics (its
``objects/allocation_candidate.py``, ``research_context.py`` and
``rp_candidates.py``), not from devtag's search; each check names the rule it
mirrors.  A suffixed group is one provider with all of its resources and traits;
the unsuffixed group takes each class from one provider of a tree or from a
sharing provider tied to that tree, its required traits on the union of the
providers it takes from and its forbidden ones on none; all groups of a candidate
share one anchor; summed amounts within capacity and max_unit; isolate keeps
suffixed groups on distinct providers; same_subtree wants one of the groups'
providers to be an ancestor (or itself) of all of them.  Aggregates (``member_of``,
each parameter AND'd, ``in:`` any of, ``!in:`` none of): a suffixed group's
provider itself must be a member; in the unsuffixed group, each provider it takes
from, or the root of its tree (an aggregate on a root spans the tree), and for a
forbidden aggregate neither; a sharing provider lending to another tree must be a
member itself, and neither it nor the anchor in a forbidden aggregate.
``DEVTAG_ORACLE_EXAMPLES=3000 DEVTAG_ORACLE_RANDOM=1`` explores further."""

from __future__ import annotations

import itertools
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

import httpx
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from devtag_host.placement.app import Placement
from devtag_host.placement.candidate_settings import STRATEGIES, CandidateSettings
from devtag_host.placement.db import Store

from .conftest import DEFAULT_HEADERS, clean
from .test_api import new_provider, set_inventory
from .test_microversions import set_traits

CLASSES = ["VCPU", "CUSTOM_VF"]
SHARED_CLASS = "DISK_GB"  # only sharing providers have it
SHARES = "MISC_SHARES_VIA_AGGREGATE"
TRAITS = ["CUSTOM_A", "CUSTOM_B"]
AGGREGATES = ["a0000000-0000-4000-8000-00000000000a", "b0000000-0000-4000-8000-00000000000b"]
HEADERS = {**DEFAULT_HEADERS, "openstack-api-version": "placement 1.36"}
EXAMPLES = int(os.environ.get("DEVTAG_ORACLE_EXAMPLES", "150"))


@dataclass
class Provider:
    name: str
    tree: int
    parent: Optional[int]  # index in the world's list
    inventory: Dict[str, Tuple[int, int, int]]  # class -> (total, max_unit, step_size)
    traits: FrozenSet[str]
    aggregates: FrozenSet[str] = frozenset()
    uuid: str = ""


@dataclass
class Group:
    suffix: str
    resources: Dict[str, int]
    required: FrozenSet[str] = frozenset()
    forbidden: FrozenSet[str] = frozenset()
    member_of: Tuple[FrozenSet[str], ...] = ()  # each: any of these aggregates
    not_member_of: FrozenSet[str] = frozenset()
    in_tree: Optional[int] = None  # index of a provider


@dataclass
class Case:
    providers: List[Provider]
    groups: List[Group]
    policy: str
    same_subtree: List[str] = field(default_factory=list)
    root_required: FrozenSet[str] = frozenset()
    root_forbidden: FrozenSet[str] = frozenset()


def stable_uuid(name: str) -> str:
    """The same on every service: two services' answers compare as they are."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"oracle/{name}"))


@st.composite
def trees(draw: st.DrawFn) -> List[Provider]:
    providers: List[Provider] = []
    for tree in range(draw(st.integers(1, 2))):
        first = len(providers)
        for index in range(draw(st.integers(1, 6))):
            parent = None if index == 0 else first + draw(st.integers(0, index - 1))
            inventory: Dict[str, Tuple[int, int, int]] = {}
            for rc in CLASSES:
                total = draw(st.sampled_from([0, 1, 2, 3, 3]))
                if total:
                    inventory[rc] = (
                        total,
                        draw(st.sampled_from([total, total, 1])),
                        draw(st.sampled_from([1, 1, 1, 2])),
                    )
            traits = frozenset(draw(st.sets(st.sampled_from(TRAITS))))
            if index == 0 and draw(st.sampled_from([False] * 9 + [True])):
                traits |= {SHARES}  # a tree's root that shares its inventory with other trees too
            aggregates = frozenset(draw(st.sets(st.sampled_from(AGGREGATES))))
            providers.append(Provider(f"t{tree}p{index}", tree, parent, inventory, traits, aggregates))
    return providers


@st.composite
def sharing_providers(draw: st.DrawFn, first_tree: int, linked: bool) -> List[Provider]:
    """Up to two providers of their own with MISC_SHARES_VIA_AGGREGATE: inventory of a
    class only they have or of a class the trees have too, in some aggregates (or
    none: then they serve no tree but can still take a whole request alone).
    ``linked``: at least one, the first in the first aggregate with room for the
    class only they have."""
    shares: List[Provider] = []
    for number in range(draw(st.sampled_from([1, 2] if linked else [0, 1, 1, 2]))):
        inventory: Dict[str, Tuple[int, int, int]] = {}
        mix = [[SHARED_CLASS], [SHARED_CLASS], [SHARED_CLASS, "VCPU"], ["CUSTOM_VF"], [SHARED_CLASS, "CUSTOM_VF"]]
        for rc in draw(st.sampled_from(mix)):
            total = draw(st.sampled_from([2, 3, 4]))
            inventory[rc] = (total, draw(st.sampled_from([total, total, 1])), draw(st.sampled_from([1, 1, 1, 2])))
        traits = frozenset({SHARES, *draw(st.sets(st.sampled_from(TRAITS), max_size=1))})
        aggregates = frozenset(draw(st.sampled_from([AGGREGATES[:1], AGGREGATES[:1], AGGREGATES[1:], AGGREGATES, []])))
        if linked and not number:
            inventory[SHARED_CLASS] = (4, 4, 1)
            aggregates |= {AGGREGATES[0]}
        shares.append(Provider(f"s{number}", first_tree + number, None, inventory, traits, aggregates))
    return shares


# No aggregate filter most of the time; else one to two member_of, or a forbidden one.
aggregate_filters: st.SearchStrategy[Tuple[Tuple[FrozenSet[str], ...], FrozenSet[str]]] = st.one_of(
    st.just(((), frozenset())),
    st.just(((), frozenset())),
    st.tuples(
        st.lists(st.sets(st.sampled_from(AGGREGATES), min_size=1).map(frozenset), min_size=1, max_size=2).map(tuple),
        st.just(frozenset()),
    ),
    st.tuples(st.just(()), st.sets(st.sampled_from(AGGREGATES), min_size=1).map(frozenset)),
)


def some_amounts(classes: List[str]) -> st.SearchStrategy[Dict[str, int]]:
    return st.dictionaries(st.sampled_from(classes), st.sampled_from([1, 1, 2]), min_size=1, max_size=2)


@st.composite
def trait_filters(draw: st.DrawFn, pool: List[str]) -> Tuple[FrozenSet[str], FrozenSet[str]]:
    """Half the time one required trait, and sometimes one forbidden other."""
    required = frozenset(draw(st.sampled_from([(), *[(trait,) for trait in pool]] + [()] * (len(pool) - 1))))
    others = [trait for trait in pool if trait not in required]
    forbidden = frozenset(draw(st.sampled_from([(), (), (), (draw(st.sampled_from(others)),)])))
    return required, forbidden


@st.composite
def cases(draw: st.DrawFn) -> Case:
    providers = draw(trees())
    # A third of the cases: every tree's root in the first aggregate, with a share there.
    linked = draw(st.sampled_from([False, False, True]))
    if linked:
        for provider in providers:
            if provider.parent is None:
                provider.aggregates |= {AGGREGATES[0]}
    providers += draw(sharing_providers(providers[-1].tree + 1, linked))
    shared = any(SHARES in provider.traits for provider in providers)
    classes = [*CLASSES, SHARED_CLASS, SHARED_CLASS] if shared else CLASSES
    pool = [*TRAITS, SHARES] if shared else TRAITS
    count = draw(st.sampled_from([1, 2, 3, 3, 4, 4, 5]))

    def in_tree() -> Optional[int]:
        return (
            draw(st.sampled_from(list(range(len(providers))))) if draw(st.sampled_from([False] * 9 + [True])) else None
        )

    groups: List[Group] = []
    if draw(st.booleans()):
        member_of, not_member_of = draw(aggregate_filters)
        required, forbidden = draw(st.sampled_from([(frozenset(), frozenset())] * 2) | trait_filters(pool))
        groups.append(Group("", draw(some_amounts(classes)), required, forbidden, member_of, not_member_of, in_tree()))
    for number in range(1, max(count - len(groups), 0 if groups else 1) + 1):
        required, forbidden = draw(trait_filters(pool))
        resources = draw(st.just({}) | some_amounts(classes)) if required else draw(some_amounts(classes))
        member_of, not_member_of = draw(aggregate_filters)
        groups.append(Group(str(number), resources, required, forbidden, member_of, not_member_of, in_tree()))
    if not any(group.resources for group in groups):
        groups[-1].resources = {"VCPU": 1}
    numbered = [group.suffix for group in groups if group.suffix]
    resourceless = [group.suffix for group in groups if not group.resources]
    subtree: List[str] = []
    if resourceless or (len(numbered) > 1 and draw(st.booleans())):
        subtree = sorted(set(resourceless) | set(draw(st.sets(st.sampled_from(numbered), min_size=1))))
        if len(subtree) < 2 and len(numbered) > 1:
            subtree = sorted(set(subtree) | {next(s for s in numbered if s not in subtree)})
    root_traits = draw(st.sampled_from([()] * 9 + [("CUSTOM_A",), ("!CUSTOM_A",), (f"!{SHARES}",)]))
    for provider in providers:
        provider.uuid = stable_uuid(provider.name)
    return Case(
        providers,
        groups,
        draw(st.sampled_from(["none", "isolate"])),
        subtree,
        frozenset(t for t in root_traits if not t.startswith("!")),
        frozenset(t[1:] for t in root_traits if t.startswith("!")),
    )


def fits(provider: Provider, rc: str, amount: int) -> bool:
    if rc not in provider.inventory:
        return False
    total, max_unit, step = provider.inventory[rc]
    return amount <= total and 1 <= amount <= max_unit and amount % step == 0


def root_of(case: Case, index: int) -> int:
    while case.providers[index].parent is not None:
        index = case.providers[index].parent  # type: ignore[assignment]
    return index


def member(provider: Provider, group: Group) -> bool:
    """The provider alone meets the group's aggregate filters (upstream's
    ``provider_ids_matching_aggregates``: each member_of any-of, none of !in:)."""
    return all(provider.aggregates & any_of for any_of in group.member_of) and not (
        provider.aggregates & group.not_member_of
    )


def member_or_root(case: Case, index: int, group: Group) -> bool:
    """The unsuffixed group: the provider or its tree's root is in the aggregates
    asked for (each provider meeting all of them on its own), and neither is in a
    forbidden one (upstream's ``filter_by_rp_or_tree`` and ``filter_by_rp_nor_tree``)."""
    mine, top = case.providers[index], case.providers[root_of(case, index)]
    wanted = all(mine.aggregates & any_of for any_of in group.member_of) or all(
        top.aggregates & any_of for any_of in group.member_of
    )
    return wanted and not ((mine.aggregates | top.aggregates) & group.not_member_of)


def shared_member(case: Case, index: int, anchor: int, group: Group) -> bool:
    """The unsuffixed group on a sharing provider lending to another tree: upstream's
    ``get_rps_with_shared_capacity`` keeps only sharing providers that are members
    themselves; ``filter_by_rp_nor_tree`` on (sharing provider, anchor) drops the pair
    when either is in a forbidden aggregate."""
    mine, top = case.providers[index], case.providers[anchor]
    wanted = all(mine.aggregates & any_of for any_of in group.member_of)
    return wanted and not ((mine.aggregates | top.aggregates) & group.not_member_of)


def anchors(case: Case, index: int) -> Set[int]:
    """The roots a provider's resources can be anchored on: its own, and for a sharing
    provider the root of every provider sharing an aggregate with it (upstream's
    ``anchors_for_sharing_providers``; a sharing provider in no aggregate serves no
    other tree)."""
    found = {root_of(case, index)}
    provider = case.providers[index]
    if SHARES in provider.traits:
        found |= {root_of(case, i) for i, other in enumerate(case.providers) if other.aggregates & provider.aggregates}
    return found


def root_ok(case: Case, anchor: int) -> bool:
    """root_required on the anchor (upstream's ``in_filtered_anchors``)."""
    traits = case.providers[anchor].traits
    return case.root_required <= traits and not traits & case.root_forbidden


# An option of one group: ({provider index: {class: amount}}, provider indexes of its mapping)
Option = Tuple[Dict[int, Dict[str, int]], Tuple[int, ...]]


def options(case: Case, group: Group) -> Dict[int, List[Option]]:
    """{anchor root: the group's options there}."""
    found: Dict[int, List[Option]] = {}
    providers = case.providers
    tree = None if group.in_tree is None else root_of(case, group.in_tree)
    if group.suffix:
        # upstream's get_provider_ids_matching (all resources, traits and aggregates on
        # one provider, in the in_tree tree), then _alloc_candidates_single_provider
        # (anchored on its root, and a sharing provider on each of its anchors).
        for index, provider in enumerate(providers):
            if tree is not None and root_of(case, index) != tree:
                continue
            if not all(fits(provider, rc, amount) for rc, amount in group.resources.items()):
                continue
            if not group.required <= provider.traits or group.forbidden & provider.traits:
                continue
            if not member(provider, group):
                continue
            for anchor in anchors(case, index):
                if root_ok(case, anchor):
                    found.setdefault(anchor, []).append(
                        ({index: dict(group.resources)} if group.resources else {}, (index,))
                    )
        return found
    # upstream's get_trees_matching_all: per class, the tree's providers with room and
    # (without in_tree) the sharing providers with room paired with each of their
    # anchors; then _alloc_candidates_multiple_providers takes one provider per class
    # and _check_traits_for_alloc_request wants the required traits on the union of
    # those providers and the forbidden ones on none of them.
    classes = sorted(group.resources)
    for anchor in [i for i, provider in enumerate(providers) if provider.parent is None]:
        if (tree is not None and anchor != tree) or not root_ok(case, anchor):
            continue
        choices = []
        for rc in classes:
            amount = group.resources[rc]
            own = [
                i
                for i, p in enumerate(providers)
                if root_of(case, i) == anchor and fits(p, rc, amount) and member_or_root(case, i, group)
            ]
            lent = [
                i
                for i, p in enumerate(providers)
                if tree is None
                and SHARES in p.traits
                and root_of(case, i) != anchor
                and anchor in anchors(case, i)
                and fits(p, rc, amount)
                and shared_member(case, i, anchor, group)
            ]
            choices.append(own + lent)
        for pick in itertools.product(*choices):
            used = set(pick)
            have: Set[str] = set().union(*(providers[i].traits for i in used))
            if any(providers[i].traits & group.forbidden for i in used) or not group.required <= have:
                continue
            taken: Dict[int, Dict[str, int]] = {}
            for rc, index in zip(classes, pick):
                taken.setdefault(index, {})[rc] = group.resources[rc]
            found.setdefault(anchor, []).append((taken, tuple(sorted(used))))
    return found


def ancestors(case: Case, index: int) -> Set[int]:
    seen = {index}
    parent = case.providers[index].parent
    while parent is not None:
        seen.add(parent)
        parent = case.providers[parent].parent
    return seen


Key = Tuple[FrozenSet, FrozenSet]


def brute_force(case: Case) -> Set[Key]:
    """Every pick of one option per group under one anchor (upstream's
    _merge_candidates, by anchor), checked as upstream checks the merged pick; a set,
    as upstream's (the same allocations reached from two anchors are one candidate)."""
    return set(candidates_with_flags(case))


def _frozen(option: Option) -> Tuple[Any, ...]:
    return (tuple(sorted((i, tuple(sorted(r.items()))) for i, r in option[0].items())), option[1])


def candidates_with_flags(case: Case) -> Dict[Key, bool]:
    """``brute_force``'s candidates, each with whether upstream may leave it out: its
    unsuffixed group takes everything from sharing providers that serve several
    trees, and every pick that makes it does.  Upstream's
    ``_alloc_candidates_multiple_providers`` gathers the unsuffixed group's options
    of all anchors in one set whose members compare without their anchor: such an
    option survives under one of its anchors only (which one follows its set's order)."""
    answers: Dict[Key, bool] = {}
    uuid = [provider.uuid for provider in case.providers]
    per_group = [options(case, group) for group in case.groups]
    anchors_of_option: Dict[Tuple[Any, ...], int] = {}
    for index, group in enumerate(case.groups):
        if not group.suffix:
            for listed in per_group[index].values():
                for option in listed:
                    anchors_of_option[_frozen(option)] = anchors_of_option.get(_frozen(option), 0) + 1
    for anchor in set.intersection(*(set(found) for found in per_group)):
        for pick in itertools.product(*(found[anchor] for found in per_group)):
            # exceeds_capacity: summed per (provider, class) within capacity and max_unit
            summed: Dict[Tuple[int, str], int] = {}
            for taken, _mapping in pick:
                for index, resources in taken.items():
                    for rc, amount in resources.items():
                        summed[(index, rc)] = summed.get((index, rc), 0) + amount
            if any(
                amount > case.providers[index].inventory[rc][0] or amount > case.providers[index].inventory[rc][1]
                for (index, rc), amount in summed.items()
            ):
                continue
            # _satisfies_group_policy: isolate wants distinct providers for the suffixed groups
            numbered = [option[1][0] for option, group in zip(pick, case.groups) if group.suffix]
            if case.policy == "isolate" and len(numbered) > 1 and len(set(numbered)) != len(numbered):
                continue
            # _satisfies_same_subtree: one of the providers is an ancestor (or itself) of all
            if case.same_subtree:
                members = {
                    i
                    for option, group in zip(pick, case.groups)
                    if group.suffix in case.same_subtree
                    for i in option[1]
                }
                common = set.intersection(*(ancestors(case, i) for i in members))
                if len(members) > 1 and not common & members:
                    continue
            allocations: Dict[str, Dict[str, int]] = {}
            for (index, rc), amount in summed.items():
                allocations.setdefault(uuid[index], {})[rc] = amount
            key = (
                frozenset((rp, frozenset(resources.items())) for rp, resources in allocations.items()),
                frozenset(
                    (group.suffix, tuple(sorted(uuid[i] for i in option[1])))
                    for option, group in zip(pick, case.groups)
                ),
            )
            lost = any(
                not group.suffix and anchors_of_option[_frozen(option)] > 1 for option, group in zip(pick, case.groups)
            )
            answers[key] = answers.get(key, True) and lost
    return answers


def lent(case: Case, candidates: Iterable[Key]) -> int:
    """How many sharing providers the candidates allocate from (for the test's statistics)."""
    sharing = {provider.uuid for provider in case.providers if SHARES in provider.traits}
    return len({rp for allocations, _mappings in candidates for rp, _taken in allocations} & sharing)


def summaries_ok(case: Case, body: dict) -> None:
    """Upstream's provider summaries: every provider of each tree that the answer
    allocates from (_merge_candidates and limit_results filter them by the roots of
    the allocated providers), each with its traits and whole inventory."""
    by_uuid = {provider.uuid: index for index, provider in enumerate(case.providers)}
    roots = {root_of(case, by_uuid[rp]) for request in body["allocation_requests"] for rp in request["allocations"]}
    expected = {provider.uuid for index, provider in enumerate(case.providers) if root_of(case, index) in roots}
    summaries = body["provider_summaries"]
    assert set(summaries) == expected
    for rp, summary in summaries.items():
        provider = case.providers[by_uuid[rp]]
        assert set(summary["traits"]) == provider.traits, rp
        assert {rc: entry["capacity"] for rc, entry in summary["resources"].items()} == {
            rc: total for rc, (total, _max_unit, _step) in provider.inventory.items()
        }, rp


def keys(body: dict) -> List[Key]:
    return [
        (
            frozenset((rp, frozenset(entry["resources"].items())) for rp, entry in request["allocations"].items()),
            frozenset((suffix, tuple(sorted(uuids))) for suffix, uuids in request["mappings"].items()),
        )
        for request in body["allocation_requests"]
    ]


def build(client: httpx.Client, case: Case) -> None:
    for name in ("/resource_classes/CUSTOM_VF", *(f"/traits/{trait}" for trait in TRAITS)):
        assert client.put(name).status_code in (201, 204)
    for provider in case.providers:
        parent = {"parent_provider_uuid": case.providers[provider.parent].uuid} if provider.parent is not None else {}
        provider.uuid = provider.uuid or stable_uuid(provider.name)
        assert new_provider(client, provider.name, uuid=provider.uuid, **parent) == provider.uuid
        if provider.inventory:
            set_inventory(
                client,
                provider.uuid,
                **{rc: {"total": t, "max_unit": m, "step_size": s} for rc, (t, m, s) in provider.inventory.items()},
            )
        if provider.traits:
            set_traits(client, provider.uuid, *sorted(provider.traits))
        if provider.aggregates:
            generation = client.get(f"/resource_providers/{provider.uuid}").json()["generation"]
            body = {"aggregates": sorted(provider.aggregates), "resource_provider_generation": generation}
            assert client.put(f"/resource_providers/{provider.uuid}/aggregates", json=body).status_code == 200


def query(case: Case, limit: Optional[int] = None) -> str:
    parts: List[str] = []
    for group in case.groups:
        if group.resources:
            parts.append(
                f"resources{group.suffix}=" + ",".join(f"{rc}:{n}" for rc, n in sorted(group.resources.items()))
            )
        traits = sorted(group.required) + [f"!{t}" for t in sorted(group.forbidden)]
        if traits:
            parts.append(f"required{group.suffix}=" + ",".join(traits))
        for any_of in group.member_of:
            parts.append(f"member_of{group.suffix}=in:" + ",".join(sorted(any_of)))
        if group.not_member_of:
            parts.append(f"member_of{group.suffix}=!in:" + ",".join(sorted(group.not_member_of)))
        if group.in_tree is not None:
            parts.append(f"in_tree{group.suffix}={case.providers[group.in_tree].uuid}")
    parts.append(f"group_policy={case.policy}")
    if case.same_subtree:
        parts.append("same_subtree=" + ",".join(case.same_subtree))
    root_traits = sorted(case.root_required) + [f"!{t}" for t in sorted(case.root_forbidden)]
    if root_traits:
        parts.append("root_required=" + ",".join(root_traits))
    if limit is not None:
        parts.append(f"limit={limit}")
    return "/allocation_candidates?" + "&".join(parts)


@pytest.mark.timeout(max(300, EXAMPLES * 3))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("DEVTAG_ORACLE_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(
    case=cases(),
    cap=st.sampled_from([-1, -1, 1, 3]),
    strategy=st.sampled_from(STRATEGIES),
    limit=st.sampled_from([None, None, 1, 2, 5]),
    keep_empty=st.sampled_from([True, False, False, False]),
)
def test_candidates_are_what_brute_force_finds(
    sqlite_store: Store, case: Case, cap: int, strategy: str, limit: Optional[int], keep_empty: bool
) -> None:
    expected = brute_force(case)
    assume(expected or keep_empty)  # most random requests fit nowhere: keep a quarter of those
    clean(sqlite_store)
    everything = Placement(sqlite_store)
    capped = Placement(sqlite_store, candidate_settings=CandidateSettings(cap, strategy))
    with httpx.Client(
        transport=httpx.WSGITransport(app=everything.wsgi), base_url="http://p", headers=HEADERS
    ) as client:
        build(client, case)
        response = client.get(query(case))
    assert response.status_code == 200, (query(case), response.text)
    found = keys(response.json())
    assert len(found) == len(set(found)), "a candidate answered twice"
    assert set(found) == expected, query(case)
    summaries_ok(case, response.json())
    sharing = sum(SHARES in provider.traits for provider in case.providers)
    event(f"sharing providers: {sharing}, candidates: {min(len(expected), 3)}+, lent by: {lent(case, expected)}")
    with httpx.Client(transport=httpx.WSGITransport(app=capped.wsgi), base_url="http://p", headers=HEADERS) as client:
        answer = client.get(query(case, limit)).json()
    cut = keys(answer)
    wanted = len(expected)
    for bound in (cap if cap >= 0 else None, limit):
        if bound is not None:
            wanted = min(wanted, bound)
    assert len(cut) == len(set(cut)) == wanted
    assert set(cut) <= expected
    summaries_ok(case, answer)
