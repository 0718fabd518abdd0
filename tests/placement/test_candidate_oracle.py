"""The candidate search against brute force: on random small provider trees
(at most 6 providers per tree) and random requests (at most 5 groups, both
group policies, resourceless groups, same_subtree), the answer is exactly the set
of picks that checking every combination of every group's options finds; with
``max_allocation_candidates`` or ``limit``, that many distinct members of it.

The oracle is written from OpenStack Placement's documented semantics, not from
devtag's search: a suffixed group is one provider with all of its resources and
traits; the unsuffixed group takes each class from one provider of a tree; all
groups of a candidate in one tree; summed amounts within capacity and max_unit;
isolate keeps suffixed groups on distinct providers; same_subtree wants one of
the groups' providers to be an ancestor (or itself) of all of them.  Aggregates
(``member_of``, each parameter AND'd, ``in:`` any of, ``!in:`` none of): a suffixed
group's provider itself must be a member; in the unsuffixed group, each provider it
takes from, or the root of its tree (an aggregate on a root spans the tree), and for
a forbidden aggregate neither.
``DEVTAG_ORACLE_EXAMPLES=2000 DEVTAG_ORACLE_RANDOM=1`` explores further."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtag_host.placement.app import Placement
from devtag_host.placement.candidate_settings import STRATEGIES, CandidateSettings
from devtag_host.placement.db import Store

from .conftest import DEFAULT_HEADERS, clean
from .test_api import new_provider, set_inventory
from .test_microversions import set_traits

CLASSES = ["VCPU", "CUSTOM_VF"]
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


@dataclass
class Case:
    providers: List[Provider]
    groups: List[Group]
    policy: str
    same_subtree: List[str] = field(default_factory=list)


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
            aggregates = frozenset(draw(st.sets(st.sampled_from(AGGREGATES))))
            providers.append(Provider(f"t{tree}p{index}", tree, parent, inventory, traits, aggregates))
    return providers


# No aggregate filter most of the time; else one to two member_of, or a forbidden one.
aggregate_filters = st.one_of(
    st.just(((), frozenset())),
    st.just(((), frozenset())),
    st.tuples(
        st.lists(st.sets(st.sampled_from(AGGREGATES), min_size=1).map(frozenset), min_size=1, max_size=2).map(tuple),
        st.just(frozenset()),
    ),
    st.tuples(st.just(()), st.sets(st.sampled_from(AGGREGATES), min_size=1).map(frozenset)),
)

some_amounts = st.dictionaries(st.sampled_from(CLASSES), st.sampled_from([1, 1, 2]), min_size=1, max_size=2)
amounts = st.one_of(st.just({}), some_amounts)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    providers = draw(trees())
    count = draw(st.sampled_from([1, 2, 3, 3, 4, 4, 5]))
    groups: List[Group] = []
    if draw(st.booleans()):
        member_of, not_member_of = draw(aggregate_filters)
        groups.append(Group("", draw(some_amounts), member_of=member_of, not_member_of=not_member_of))
    for number in range(1, max(count - len(groups), 0 if groups else 1) + 1):
        required = frozenset(draw(st.sets(st.sampled_from(TRAITS), max_size=1)))
        others = [trait for trait in TRAITS if trait not in required]
        forbidden = frozenset(draw(st.sampled_from([(), (), (), others[:1]])))
        resources = draw(amounts) if required else draw(some_amounts)
        member_of, not_member_of = draw(aggregate_filters)
        groups.append(Group(str(number), resources, required, forbidden, member_of, not_member_of))
    if not any(group.resources for group in groups):
        groups[-1].resources = {"VCPU": 1}
    numbered = [group.suffix for group in groups if group.suffix]
    resourceless = [group.suffix for group in groups if not group.resources]
    subtree: List[str] = []
    if resourceless or (len(numbered) > 1 and draw(st.booleans())):
        subtree = sorted(set(resourceless) | set(draw(st.sets(st.sampled_from(numbered), min_size=1))))
        if len(subtree) < 2 and len(numbered) > 1:
            subtree = sorted(set(subtree) | {next(s for s in numbered if s not in subtree)})
    return Case(providers, groups, draw(st.sampled_from(["none", "isolate"])), subtree)


def fits(provider: Provider, rc: str, amount: int) -> bool:
    if rc not in provider.inventory:
        return False
    total, max_unit, step = provider.inventory[rc]
    return amount <= total and 1 <= amount <= max_unit and amount % step == 0


def member(provider: Provider, group: Group) -> bool:
    """The provider alone meets the group's aggregate filters."""
    return all(provider.aggregates & any_of for any_of in group.member_of) and not (
        provider.aggregates & group.not_member_of
    )


def member_or_root(case: Case, index: int, group: Group) -> bool:
    """The unsuffixed group: the provider or its tree's root is in the aggregates
    asked for (each provider meeting all of them on its own), and neither is in a
    forbidden one."""
    root = index
    while case.providers[root].parent is not None:
        root = case.providers[root].parent  # type: ignore[assignment]
    mine, top = case.providers[index], case.providers[root]
    wanted = all(mine.aggregates & any_of for any_of in group.member_of) or all(
        top.aggregates & any_of for any_of in group.member_of
    )
    return wanted and not ((mine.aggregates | top.aggregates) & group.not_member_of)


# An option of one group: (tree, {provider index: {class: amount}}, provider indexes of its mapping)
Option = Tuple[int, Dict[int, Dict[str, int]], Tuple[int, ...]]


def options(case: Case, group: Group) -> List[Option]:
    found: List[Option] = []
    providers = case.providers
    if group.suffix:
        for index, provider in enumerate(providers):
            if not all(fits(provider, rc, amount) for rc, amount in group.resources.items()):
                continue
            if not group.required <= provider.traits or group.forbidden & provider.traits:
                continue
            if not member(provider, group):
                continue
            found.append((provider.tree, {index: dict(group.resources)} if group.resources else {}, (index,)))
        return found
    classes = sorted(group.resources)
    for tree in {provider.tree for provider in providers}:
        choices = [
            [
                i
                for i, p in enumerate(providers)
                if p.tree == tree and fits(p, rc, group.resources[rc]) and member_or_root(case, i, group)
            ]
            for rc in classes
        ]
        for pick in itertools.product(*choices):
            taken: Dict[int, Dict[str, int]] = {}
            for rc, index in zip(classes, pick):
                taken.setdefault(index, {})[rc] = group.resources[rc]
            found.append((tree, taken, tuple(sorted(set(pick)))))
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
    answers: Set[Key] = set()
    uuid = [provider.uuid for provider in case.providers]
    for pick in itertools.product(*(options(case, group) for group in case.groups)):
        if len({option[0] for option in pick}) != 1:
            continue
        summed: Dict[Tuple[int, str], int] = {}
        for _tree, taken, _mapping in pick:
            for index, resources in taken.items():
                for rc, amount in resources.items():
                    summed[(index, rc)] = summed.get((index, rc), 0) + amount
        if any(
            amount > case.providers[index].inventory[rc][0] or amount > case.providers[index].inventory[rc][1]
            for (index, rc), amount in summed.items()
        ):
            continue
        numbered = [option[2][0] for option, group in zip(pick, case.groups) if group.suffix]
        if case.policy == "isolate" and len(numbered) > 1 and len(set(numbered)) != len(numbered):
            continue
        if case.same_subtree:
            members = {
                i for option, group in zip(pick, case.groups) if group.suffix in case.same_subtree for i in option[2]
            }
            common = set.intersection(*(ancestors(case, i) for i in members))
            if len(members) > 1 and not common & members:
                continue
        allocations: Dict[str, Dict[str, int]] = {}
        for (index, rc), amount in summed.items():
            allocations.setdefault(uuid[index], {})[rc] = amount
        answers.add(
            (
                frozenset((rp, frozenset(resources.items())) for rp, resources in allocations.items()),
                frozenset(
                    (group.suffix, tuple(sorted(uuid[i] for i in option[2])))
                    for option, group in zip(pick, case.groups)
                ),
            )
        )
    return answers


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
        provider.uuid = new_provider(client, provider.name, **parent)
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
    parts.append(f"group_policy={case.policy}")
    if case.same_subtree:
        parts.append("same_subtree=" + ",".join(case.same_subtree))
    if limit is not None:
        parts.append(f"limit={limit}")
    return "/allocation_candidates?" + "&".join(parts)


@pytest.mark.timeout(max(300, EXAMPLES * 3))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("DEVTAG_ORACLE_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    case=cases(),
    cap=st.sampled_from([-1, -1, 1, 3]),
    strategy=st.sampled_from(STRATEGIES),
    limit=st.sampled_from([None, None, 1, 2, 5]),
)
def test_candidates_are_what_brute_force_finds(
    sqlite_store: Store, case: Case, cap: int, strategy: str, limit: Optional[int]
) -> None:
    clean(sqlite_store)
    everything = Placement(sqlite_store)
    capped = Placement(sqlite_store, candidate_settings=CandidateSettings(cap, strategy))
    with httpx.Client(
        transport=httpx.WSGITransport(app=everything.wsgi), base_url="http://p", headers=HEADERS
    ) as client:
        build(client, case)
        response = client.get(query(case))
    assert response.status_code == 200, (query(case), response.text)
    expected = brute_force(case)
    found = keys(response.json())
    assert len(found) == len(set(found)), "a candidate answered twice"
    assert set(found) == expected, query(case)
    with httpx.Client(transport=httpx.WSGITransport(app=capped.wsgi), base_url="http://p", headers=HEADERS) as client:
        cut = keys(client.get(query(case, limit)).json())
    wanted = len(expected)
    for bound in (cap if cap >= 0 else None, limit):
        if bound is not None:
            wanted = min(wanted, bound)
    assert len(cut) == len(set(cut)) == wanted
    assert set(cut) <= expected
