"""Differential test: devtag's placement against OpenStack Placement itself.

Hypothesis draws sequences of API requests over a small universe of providers,
resource classes, traits, aggregates and consumers (small on purpose: names
collide, generations go stale, capacity runs out), at every microversion
devtag supports.  Each request goes to devtag's service and to upstream
(``openstack-placement`` from PyPI, in-process through WSGI), both starting
from empty databases; every answer must have the same status code and, modulo
request ids and timestamps, the same body and the same significant headers.

This is how "behaves exactly as upstream" is checked.  Every test run
includes it with a bounded, derandomised count (``EXAMPLES``, repeatable, a
couple of minutes); ``DEVTAG_DIFF_EXAMPLES=3000 DEVTAG_DIFF_RANDOM=1 pytest -m
differential tests/placement/test_differential.py`` explores further with
fresh seeds (its time limit grows with the count).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from devtag_host.placement import microversion, schema_upgrade
from devtag_host.placement.app import Placement
from devtag_host.placement.db import Store
from tests.support.upstream_placement import forget_empty_consumers, reset, upstream_app

from . import test_candidate_oracle as oracle
from .conftest import clean

PROVIDERS = [
    "11111111-1111-4111-8111-111111111111",
    "22222222-2222-4222-8222-222222222222",
    "33333333-3333-4333-8333-333333333333",
]
CONSUMERS = ["c0000000-0000-4000-8000-000000000001", "c0000000-0000-4000-8000-00000000000a"]
# Other spellings of the same consumers (upstream stores a PUT's path id in the canonical
# form, looks GET/DELETE ids and POST keys up as spelled) and a malformed one.
CONSUMER_SPELLINGS = [
    CONSUMERS[1].upper(),
    CONSUMERS[1].replace("-", ""),
    "{" + CONSUMERS[0] + "}",
    "urn:uuid:" + CONSUMERS[0],
    "c0000000_0000_4000_8000_000000000001",
    "nope",
]
CONSUMER_TYPES = ["INSTANCE", "MIGRATION", "bad type"]
AGGREGATES = ["a0000000-0000-4000-8000-000000000001", "a0000000-0000-4000-8000-000000000002"]
CLASSES = ["VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_GPU", "CUSTOM_NOPE", "BOGUS"]
TRAITS = [
    "CUSTOM_FAST",
    "CUSTOM_SLOW",
    "HW_CPU_X86_AVX2",
    "COMPUTE_STATUS_DISABLED",
    "MISC_SHARES_VIA_AGGREGATE",
    "BOGUS",
]
NAMES = ["cn1", "cn2", "child", ""]
PROJECTS = ["p1", "p2"]


def _max_minor() -> int:
    return int(microversion.max_version_string().split(".")[1])


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class Request:
    """One API request; ``generation_of`` asks the runner to read that
    provider's current generation (on each side) into the body first."""

    method: str
    path: str
    minor: int
    body: Any = None
    generation_of: Optional[str] = None
    raw: Optional[bytes] = None
    # 1.28: read this consumer's generation (on each side) into the body's consumer_generation
    # (EACH_CONSUMER: into that of every consumer of a POST /allocations body).
    consumer_generation_of: Optional[str] = None


EACH_CONSUMER = "each consumer"


# At most one possibly unknown trait per any-of set: upstream names the first unknown one
# of a set, and a set's order is Python's hash order.
TRAIT_QUERIES = ["CUSTOM_FAST", "CUSTOM_FAST,!CUSTOM_SLOW", "!HW_CPU_X86_AVX2", "in:CUSTOM_FAST,HW_CPU_X86_AVX2",
                 "BOGUS", "CUSTOM_SLOW,CUSTOM_FAST"]  # fmt: skip
MEMBER_OF_QUERIES = [AGGREGATES[0], f"in:{AGGREGATES[0]},{AGGREGATES[1]}", f"!{AGGREGATES[1]}", "nope"]

uuids = st.sampled_from(PROVIDERS)
classes = st.sampled_from(CLASSES)
traits = st.sampled_from(TRAITS)
small = st.sampled_from([0, 1, 2, 4, 8, 16, 1024])
odd_int = st.sampled_from([-1, 0, 1, 3, 2**31, 2**63, 10**30])
generation = st.sampled_from(["current", "current", "current", 0, 1, 99])
consumer_ids = st.one_of(st.sampled_from(CONSUMERS), st.sampled_from(CONSUMER_SPELLINGS))
post_consumer_ids = st.sampled_from([*CONSUMERS, CONSUMERS[1].upper()])  # a POST key has 36 characters
consumer_generation = st.sampled_from(["current", "current", None, 0, 1, 7])


def minors(lowest: int = 0) -> st.SearchStrategy[int]:
    return st.integers(min_value=lowest, max_value=_max_minor())


def inventory_record() -> st.SearchStrategy[Dict[str, Any]]:
    return st.fixed_dictionaries(
        {"total": small},
        optional={
            "reserved": st.sampled_from([0, 1, 8, 16]),
            "min_unit": st.sampled_from([0, 1, 2]),
            "max_unit": st.sampled_from([1, 4, 16, 1024]),
            "step_size": st.sampled_from([1, 2, 0]),
            "allocation_ratio": st.sampled_from([1.0, 2.0, 0.5, 0]),
        },
    )


@st.composite
def provider_requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["create", "create", "update", "delete", "get", "list"]))
    minor = draw(minors())
    rp = draw(uuids)
    if kind == "create":
        body: Dict[str, Any] = {"name": draw(st.sampled_from(NAMES))}
        if draw(st.booleans()):
            body["uuid"] = rp
        if draw(st.booleans()):
            body["parent_provider_uuid"] = draw(uuids)
        return Request("POST", "/resource_providers", minor, body)
    if kind == "update":
        body = {"name": draw(st.sampled_from(NAMES))}
        if draw(st.booleans()):
            body["parent_provider_uuid"] = draw(st.one_of(uuids, st.none()))
        return Request("PUT", f"/resource_providers/{rp}", minor, body)
    if kind == "delete":
        return Request("DELETE", f"/resource_providers/{rp}", minor)
    if kind == "get":
        return Request("GET", f"/resource_providers/{draw(st.one_of(uuids, st.just('nope')))}", minor)
    query = draw(
        st.sampled_from(
            [
                "",
                "?name=cn1",
                f"?uuid={PROVIDERS[0]}",
                "?uuid=nope",
                f"?member_of={AGGREGATES[0]}",
                f"?member_of=in:{AGGREGATES[0]},{AGGREGATES[1]}",
                "?member_of=nope",
                "?resources=VCPU:1",
                "?resources=VCPU:1,DISK_GB:4",
                "?resources=VCPU:0",
                "?resources=BOGUS:1",
                "?resources=VCPU:x",
                f"?in_tree={PROVIDERS[0]}",
                "?in_tree=nope",
                "?required=CUSTOM_FAST",
                "?required=CUSTOM_FAST,!CUSTOM_SLOW",
                "?required=!CUSTOM_FAST",
                "?required=BOGUS",
                "?bogus=1",
            ]
        )
    )
    if query and draw(st.integers(0, 2)) == 0:  # two filters: which one upstream looks at first shows
        second = ["required=!CUSTOM_SLOW", "resources=BOGUS:1", "required=CUSTOM_FAST", f"member_of={AGGREGATES[1]}",
                  f"in_tree={PROVIDERS[1]}", "zzz=1"]  # fmt: skip
        query += "&" + draw(st.sampled_from(second))
    return Request("GET", f"/resource_providers{query}", minor)


@st.composite
def inventory_requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["put_all", "put_all", "post", "put_one", "delete_one", "delete_all", "get"]))
    minor = draw(minors())
    rp = draw(uuids)
    base = f"/resource_providers/{rp}/inventories"
    gen = draw(generation)
    if kind == "put_all":
        inventories = draw(st.dictionaries(classes, inventory_record(), max_size=3))
        if gen == "current":
            return Request("PUT", base, minor, {"inventories": inventories}, generation_of=rp)
        return Request("PUT", base, minor, {"resource_provider_generation": gen, "inventories": inventories})
    if kind == "post":
        return Request("POST", base, minor, {"resource_class": draw(classes), **draw(inventory_record())})
    if kind == "put_one":
        body = {"total": draw(small)}
        if gen != "current":
            body["resource_provider_generation"] = gen
        return Request("PUT", f"{base}/{draw(classes)}", minor, body, generation_of=rp if gen == "current" else None)
    if kind == "delete_one":
        return Request("DELETE", f"{base}/{draw(classes)}", minor)
    if kind == "delete_all":
        return Request("DELETE", base, minor)
    return Request("GET", draw(st.sampled_from([base, f"{base}/{draw(classes)}"])), minor)


@st.composite
def association_requests(draw: st.DrawFn) -> Request:
    """Aggregates and traits of providers; traits and resource classes themselves."""
    kind = draw(st.sampled_from(["aggregates", "get_aggregates", "traits", "del_traits", "get_traits",
                                 "trait", "rc"]))  # fmt: skip
    minor = draw(minors(1))
    rp = draw(uuids)
    if kind == "aggregates":
        chosen = draw(st.lists(st.sampled_from([*AGGREGATES, "nope"]), max_size=3))
        if minor >= 19:
            gen = draw(generation)
            if gen == "current":
                return Request("PUT", f"/resource_providers/{rp}/aggregates", minor, {"aggregates": chosen},
                               generation_of=rp)  # fmt: skip
            return Request("PUT", f"/resource_providers/{rp}/aggregates", minor,
                           {"aggregates": chosen, "resource_provider_generation": gen})  # fmt: skip
        return Request("PUT", f"/resource_providers/{rp}/aggregates", minor, chosen)
    if kind == "get_aggregates":
        return Request("GET", f"/resource_providers/{rp}/aggregates", minor)
    minor = draw(minors(6)) if kind != "rc" else draw(minors(2))
    if kind == "traits":
        chosen = draw(st.lists(traits, max_size=3))
        gen = draw(generation)
        if gen == "current":
            return Request("PUT", f"/resource_providers/{rp}/traits", minor, {"traits": chosen}, generation_of=rp)
        return Request("PUT", f"/resource_providers/{rp}/traits", minor,
                       {"traits": chosen, "resource_provider_generation": gen})  # fmt: skip
    if kind == "del_traits":
        return Request("DELETE", f"/resource_providers/{rp}/traits", minor)
    if kind == "get_traits":
        return Request("GET", f"/resource_providers/{rp}/traits", minor)
    if kind == "trait":
        method = draw(st.sampled_from(["PUT", "PUT", "GET", "DELETE", "LIST"]))
        if method == "LIST":
            query = draw(
                st.sampled_from(
                    [
                        "",
                        "?name=in:CUSTOM_FAST,CUSTOM_SLOW",
                        "?name=startswith:CUSTOM",
                        "?associated=true",
                        "?associated=false",
                        "?associated=x",
                        "?name=x",
                    ]
                )
            )
            return Request("GET", f"/traits{query}", minor)  # fmt: skip
        return Request(method, f"/traits/{draw(traits)}", minor)
    method = draw(st.sampled_from(["POST", "PUT", "GET", "DELETE", "LIST"]))
    name = draw(classes)
    if method == "POST":
        return Request("POST", "/resource_classes", minor, {"name": name})
    if method == "PUT":
        body = None if minor >= 7 else {"name": draw(classes)}
        return Request("PUT", f"/resource_classes/{name}", minor, body)
    if method == "LIST":
        return Request("GET", "/resource_classes", minor)
    return Request(method, f"/resource_classes/{name}", minor)


@st.composite
def allocation_requests(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["put", "put", "post", "delete", "get", "usages", "rp_allocations"]))
    minor = draw(minors())
    consumer = draw(consumer_ids)
    resources = st.dictionaries(classes, st.one_of(small, odd_int), min_size=1, max_size=2)
    project = draw(st.sampled_from(PROJECTS))
    if kind == "put":
        if minor < 12:
            body: Any = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": draw(resources)}
                                         for rp in draw(st.lists(uuids, max_size=2, unique=True))]}  # fmt: skip
        else:
            body = {"allocations": {rp: {"resources": draw(resources)}
                                    for rp in draw(st.lists(uuids, max_size=2, unique=True))}}  # fmt: skip
        if minor >= 8 and draw(st.integers(0, 4)):
            body.update(project_id=project, user_id="u1")
        return _with_consumer_fields(draw, Request("PUT", f"/allocations/{consumer}", minor, body), consumer)
    if kind == "post":
        minor = draw(minors(13))
        body = {
            c: {"allocations": {rp: {"resources": draw(resources)} for rp in draw(st.lists(uuids, max_size=2,
                                                                                          unique=True))},
                "project_id": project, "user_id": "u1"}
            for c in draw(st.lists(post_consumer_ids, min_size=1, max_size=2, unique=True))
        }  # fmt: skip
        for one in body.values():
            if minor >= 28:
                one["consumer_generation"] = draw(st.sampled_from([None, 0, 1, 2]))
            if minor >= 38 and draw(st.integers(0, 5)):
                one["consumer_type"] = draw(st.sampled_from(CONSUMER_TYPES))
        return Request("POST", "/allocations", minor, body)
    if kind == "delete":
        return Request("DELETE", f"/allocations/{consumer}", minor)
    if kind == "get":
        return Request("GET", f"/allocations/{consumer}", minor)
    if kind == "usages":
        if draw(st.booleans()):
            return Request("GET", f"/resource_providers/{draw(uuids)}/usages", minor)
        minor = draw(minors(9))
        extra = ""
        if minor >= 38 and draw(st.booleans()):
            extra = "&consumer_type=" + draw(st.sampled_from(["INSTANCE", "all", "unknown", "bad type", "allx", ""]))
        if draw(st.integers(0, 5)) == 0:
            extra += draw(st.sampled_from(["&bogus=1", "&user_id=", "&user_id=u1"]))
        return Request("GET", f"/usages?project_id={project}{extra}", minor)
    return Request("GET", f"/resource_providers/{draw(uuids)}/allocations", minor)


def _with_consumer_fields(draw: st.DrawFn, request: Request, consumer: str) -> Request:
    """1.28's consumer generation (mostly the current one) and 1.38's consumer type."""
    if request.minor < 28 or not isinstance(request.body, dict) or "project_id" not in request.body:
        return request
    body = dict(request.body)
    if request.minor >= 38 and draw(st.integers(0, 5)):
        body["consumer_type"] = draw(st.sampled_from(CONSUMER_TYPES))
    chosen = draw(consumer_generation)
    if chosen == "current":
        return Request(request.method, request.path, request.minor, body, consumer_generation_of=consumer)
    body["consumer_generation"] = chosen
    return Request(request.method, request.path, request.minor, body)


@st.composite
def tree_requests(draw: st.DrawFn) -> List[Request]:
    """A small nested tree in one go (root, two children with inventories and a
    trait), so that candidates at 1.29+ meet nested providers more often."""
    minor = draw(minors(29))
    root, left, right = PROVIDERS
    created = [
        Request("POST", "/resource_providers", minor, {"name": "cn1", "uuid": root}),
        Request("POST", "/resource_providers", minor, {"name": "numa0", "uuid": left, "parent_provider_uuid": root}),
        Request("POST", "/resource_providers", minor, {"name": "nic0", "uuid": right, "parent_provider_uuid": root}),
    ]
    for rp, name in ((root, "DISK_GB"), (left, "VCPU"), (right, "CUSTOM_GPU")):
        if name == "CUSTOM_GPU":
            created.append(Request("PUT", "/resource_classes/CUSTOM_GPU", minor))
        record = {"total": draw(st.sampled_from([4, 8, 16]))}
        created.append(Request("PUT", f"/resource_providers/{rp}/inventories", minor, {"inventories": {name: record}},
                               generation_of=rp))  # fmt: skip
    if draw(st.booleans()):
        created.append(Request("PUT", "/traits/CUSTOM_FAST", minor))
        created.append(Request("PUT", f"/resource_providers/{right}/traits", minor, {"traits": ["CUSTOM_FAST"]},
                               generation_of=right))  # fmt: skip
    return created


@st.composite
def sharing_requests(draw: st.DrawFn) -> List[Request]:
    """Two compute nodes and a sharing provider (``MISC_SHARES_VIA_AGGREGATE``) of
    disk in one aggregate, so that candidates meet sharing providers."""
    minor = draw(minors(19))
    first, second, sharer = PROVIDERS
    created = []
    for rp, name, inventories in ((first, "cn1", {"VCPU": {"total": 8}}),
                                  (second, "cn2", {"VCPU": {"total": 4}, "DISK_GB": {"total": 8}}),
                                  (sharer, "ss", {"DISK_GB": {"total": draw(st.sampled_from([4, 16]))}})):  # fmt: skip
        created.append(Request("POST", "/resource_providers", minor, {"name": name, "uuid": rp}))
        created.append(Request("PUT", f"/resource_providers/{rp}/inventories", minor, {"inventories": inventories},
                               generation_of=rp))  # fmt: skip
        if rp != second or draw(st.booleans()):
            body = {"aggregates": [AGGREGATES[0]]}
            created.append(Request("PUT", f"/resource_providers/{rp}/aggregates", minor, body, generation_of=rp))
    created.append(Request("PUT", f"/resource_providers/{sharer}/traits", minor,
                           {"traits": ["MISC_SHARES_VIA_AGGREGATE"]}, generation_of=sharer))  # fmt: skip
    return created


def allocation_put(consumer: str, minor: int, allocations: Dict[str, Dict[str, int]]) -> Request:
    """PUT /allocations/{consumer} of ``allocations`` in the body format of ``minor``
    (1.12+: 1.28's current consumer generation, read by the runner; 1.38's type)."""
    body: Dict[str, Any] = {"project_id": "p1", "user_id": "u1"}
    if minor < 12:
        body["allocations"] = [{"resource_provider": {"uuid": rp}, "resources": resources}
                               for rp, resources in allocations.items()]  # fmt: skip
    else:
        body["allocations"] = {rp: {"resources": resources} for rp, resources in allocations.items()}
    if minor >= 38:
        body["consumer_type"] = "INSTANCE"
    return Request(
        "PUT", f"/allocations/{consumer}", minor, body, consumer_generation_of=consumer if minor >= 28 else None
    )


def allocation_post(minor: int, by_consumer: Dict[str, Dict[str, Dict[str, int]]]) -> Request:
    """POST /allocations (1.13+) of {consumer: {provider: {class: amount}}}; from 1.28
    with each consumer's current generation (read by the runner)."""
    body: Dict[str, Any] = {}
    for consumer, allocations in by_consumer.items():
        one: Dict[str, Any] = {"allocations": {rp: {"resources": resources} for rp, resources in allocations.items()},
                               "project_id": "p1", "user_id": "u1"}  # fmt: skip
        if minor >= 38:
            one["consumer_type"] = "INSTANCE"
        body[consumer] = one
    return Request("POST", "/allocations", minor, body, consumer_generation_of=EACH_CONSUMER if minor >= 28 else None)


def provider_with_inventory(rp: str, minor: int, inventories: Dict[str, Dict[str, Any]]) -> List[Request]:
    return [
        Request("POST", "/resource_providers", minor, {"name": f"cn-{rp[:4]}", "uuid": rp}),
        Request("PUT", f"/resource_providers/{rp}/inventories", minor, {"inventories": inventories}, generation_of=rp),
    ]


@st.composite
def overcapacity_requests(draw: st.DrawFn) -> List[Request]:
    """A provider whose inventory shrinks under its allocations (total, reserved or
    allocation_ratio: upstream allows it), then writes of its consumers that keep,
    lower or raise their usage, or a POST that spreads it otherwise.  Upstream lets
    a write that asks no more than its consumers held pass, over capacity too."""
    minor = draw(minors(12))
    rp, mine, other = PROVIDERS[0], CONSUMERS[0], CONSUMERS[1]
    created = provider_with_inventory(rp, minor, {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 64}})
    held = draw(st.integers(3, 6))
    created.append(allocation_put(mine, minor, {rp: {"VCPU": held, "MEMORY_MB": 8}}))
    others = draw(st.sampled_from([0, 1, 2]))
    if others:
        created.append(allocation_put(other, minor, {rp: {"VCPU": others}}))
    shrunk = draw(st.sampled_from([{"total": 2}, {"total": 4}, {"total": 6}, {"total": 8, "reserved": 5},
                                   {"total": 8, "allocation_ratio": 0.5}]))  # fmt: skip
    body = {"inventories": {"VCPU": shrunk, "MEMORY_MB": {"total": 64}}}
    created.append(Request("PUT", f"/resource_providers/{rp}/inventories", minor, body, generation_of=rp))
    for _ in range(draw(st.integers(1, 2))):
        amount = draw(st.sampled_from([held - 1, held, held + 1, 1]))
        if minor >= 13 and others and draw(st.integers(0, 2)) == 0:  # a move between the two consumers
            spread = {mine: {rp: {"VCPU": amount}}, other: {rp: {"VCPU": held + others - amount}}}
            created.append(allocation_post(minor, spread))
        else:
            consumer = draw(st.sampled_from([mine, mine, other]))
            created.append(allocation_put(consumer, minor, {rp: {"VCPU": amount}}))
        created.append(Request("GET", f"/resource_providers/{rp}/usages", minor))
    return created


# One allocation of a multi-allocation request: (provider, class, amount) and what is
# wrong with it in the set-up of `multi_allocation_requests`.
ALLOCATION_CASES = [
    (PROVIDERS[0], "VCPU", 1),  # fits
    (PROVIDERS[0], "VCPU", 3),  # above max_unit 2
    (PROVIDERS[0], "MEMORY_MB", 100),  # not a multiple of step_size 256
    (PROVIDERS[0], "MEMORY_MB", 256),  # fits
    (PROVIDERS[1], "VCPU", 3),  # beyond the capacity of 2
    (PROVIDERS[1], "VCPU", 1),  # fits alone; with the one above, beyond
    (PROVIDERS[1], "DISK_GB", 1),  # below min_unit 2
    (PROVIDERS[1], "MEMORY_MB", 256),  # no inventory of the class
    (PROVIDERS[1], "CUSTOM_NOPE", 1),  # no such class
    (PROVIDERS[2], "VCPU", 1),  # no such provider
]


@st.composite
def multi_allocation_requests(draw: st.DrawFn) -> List[Request]:
    """Two providers with constrained inventories, then a write whose allocations
    are wrong in several ways at once, in a drawn order: which error upstream names
    (unknown provider, unknown class, absent inventory, min/max/step, capacity)
    follows its order of checks."""
    minor = draw(minors(8))
    first, second = PROVIDERS[0], PROVIDERS[1]
    created = provider_with_inventory(first, minor, {"VCPU": {"total": 4, "max_unit": 2},
                                                     "MEMORY_MB": {"total": 1024, "step_size": 256}})  # fmt: skip
    created += provider_with_inventory(second, minor, {"VCPU": {"total": 2}, "DISK_GB": {"total": 8, "min_unit": 2}})
    chosen = draw(st.lists(st.sampled_from(ALLOCATION_CASES), min_size=2, max_size=5,
                           unique_by=lambda case: (case[0], case[1])))  # fmt: skip

    def grouped(cases: List[Tuple[str, str, int]]) -> Dict[str, Dict[str, int]]:
        allocations: Dict[str, Dict[str, int]] = {}
        for rp, name, amount in cases:
            allocations.setdefault(rp, {})[name] = amount
        return allocations

    if minor < 12:  # the list format: one entry per allocation, so a provider may come twice (the last one counts)
        body = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {name: amount}}
                                for rp, name, amount in chosen], "project_id": "p1", "user_id": "u1"}  # fmt: skip
        created.append(Request("PUT", f"/allocations/{CONSUMERS[0]}", minor, body))
    elif minor >= 13 and draw(st.booleans()):
        cut = draw(st.integers(1, len(chosen) - 1))
        created.append(
            allocation_post(minor, {CONSUMERS[0]: grouped(chosen[:cut]), CONSUMERS[1]: grouped(chosen[cut:])})
        )
    else:
        created.append(allocation_put(CONSUMERS[0], minor, grouped(chosen)))
    created += [Request("GET", f"/resource_providers/{rp}/usages", minor) for rp in (first, second)]
    return created


@st.composite
def reshaper_requests(draw: st.DrawFn) -> Request:
    """POST /reshaper (1.30): a provider's inventory moved, allocations rewritten."""
    minor = draw(minors(30))
    source, target = draw(st.lists(uuids, min_size=2, max_size=2, unique=True))
    stale = draw(generation)
    inventories = {
        rp: {"inventories": draw(st.dictionaries(classes, inventory_record(), min_size=size, max_size=size + 1)),
             "resource_provider_generation": stale if stale != "current" else 0}
        for rp, size in ((source, 0), (target, 1))
    }  # fmt: skip
    allocations: Dict[str, Any] = {}
    for consumer in draw(st.lists(post_consumer_ids, max_size=2, unique=True)):
        one: Dict[str, Any] = {
            "allocations": {target: {"resources": draw(st.dictionaries(classes, small, min_size=1, max_size=1))}},
            "project_id": draw(st.sampled_from(PROJECTS)),
            "user_id": "u1",
            "consumer_generation": draw(st.sampled_from([None, 0, 1])),
        }
        if minor >= 38:
            one["consumer_type"] = draw(st.sampled_from(CONSUMER_TYPES))
        allocations[consumer] = one
    body = {"inventories": inventories, "allocations": allocations}
    # Mostly the current generations (the runner reads them), sometimes a stale one.
    return Request("POST", "/reshaper", minor, body, generation_of="reshaper" if stale == "current" else None)


@st.composite
def candidate_requests(draw: st.DrawFn) -> Request:
    minor = draw(minors(10))
    query = draw(st.sampled_from(["VCPU:1", "VCPU:2,DISK_GB:4", "DISK_GB:8", "CUSTOM_GPU:1", "VCPU:1,MEMORY_MB:16",
                                  "BOGUS:1", "VCPU:0"]))  # fmt: skip
    parts = [f"resources={query}"]
    if minor >= 16 and draw(st.booleans()):
        parts.append(f"limit={draw(st.sampled_from(['1', '2', '0', 'x']))}")
    if minor >= 17 and draw(st.booleans()):
        parts.append(f"required={draw(st.sampled_from(TRAIT_QUERIES))}")
    if minor >= 15 and draw(st.integers(0, 3)) == 0:  # also before 1.21: upstream refuses it there
        parts.append(f"member_of={draw(st.sampled_from(MEMBER_OF_QUERIES))}")
    if minor >= 25 and draw(st.booleans()):
        suffixes = ["1", "2"] if minor < 33 or draw(st.booleans()) else ["_NIC", "_CPU"]
        for suffix in draw(st.lists(st.sampled_from(suffixes), min_size=1, max_size=2, unique=True)):
            if draw(st.integers(0, 5)):
                parts.append(f"resources{suffix}={draw(st.sampled_from(['VCPU:1', 'CUSTOM_GPU:1', 'DISK_GB:2']))}")
            if draw(st.integers(0, 2)) == 0:
                parts.append(f"required{suffix}={draw(st.sampled_from(TRAIT_QUERIES))}")
            if draw(st.integers(0, 3)) == 0:
                parts.append(f"member_of{suffix}={draw(st.sampled_from(MEMBER_OF_QUERIES))}")
            if minor >= 31 and draw(st.integers(0, 3)) == 0:
                parts.append(f"in_tree{suffix}={draw(st.sampled_from(PROVIDERS[:2]))}")
        if draw(st.integers(0, 4)):
            parts.append(f"group_policy={draw(st.sampled_from(['none', 'isolate', 'isolate', 'bogus']))}")
        if minor >= 36 and draw(st.booleans()):
            parts.append(f"same_subtree={','.join(draw(st.lists(st.sampled_from(suffixes), min_size=1)))}")
    if minor >= 31 and draw(st.integers(0, 3)) == 0:
        parts.append(f"in_tree={draw(st.sampled_from([*PROVIDERS, 'nope']))}")
    if minor >= 35 and draw(st.integers(0, 3)) == 0:
        parts.append(f"root_required={draw(st.sampled_from(['CUSTOM_FAST', '!CUSTOM_FAST', 'HW_CPU_X86_AVX2']))}")
    if draw(st.integers(0, 5)) == 0:  # a key upstream does not know, a repeated or odd group key
        parts.append(draw(st.sampled_from(["bogus=1", "zzz=1", "resources=VCPU:x", "resources=:1", "required=,",
                                           "resources1=VCPU:1"])))  # fmt: skip
    return Request("GET", "/allocation_candidates?" + "&".join(draw(st.permutations(parts))), minor)


@st.composite
def junk_requests(draw: st.DrawFn) -> Request:
    """Bodies that are not what the route wants, methods and paths that do not exist."""
    minor = draw(minors())
    target = draw(
        st.sampled_from(
            [
                ("POST", "/resource_providers"),
                ("PUT", f"/resource_providers/{PROVIDERS[0]}/inventories"),
                ("PUT", f"/allocations/{CONSUMERS[0]}"),
                ("PATCH", "/resource_providers"),
                ("DELETE", "/resource_providers"),
                ("POST", f"/resource_providers/{PROVIDERS[0]}"),
                ("GET", "/nope"),
                ("GET", f"/resource_providers/{PROVIDERS[0]}/nope"),
            ]
        )
    )
    raw = draw(st.sampled_from([b"", b"{", b"[]", b'{"name": 1}', b"null", b'"x"', b"{}"]))
    return Request(target[0], target[1], minor, raw=raw)


any_request = st.one_of(
    provider_requests(),
    inventory_requests(),
    association_requests(),
    allocation_requests(),
    candidate_requests(),
    reshaper_requests(),
    junk_requests(),
)
# A sequence: single requests, now and then a whole small tree or sharing set-up built in one step.
request_sequences = st.lists(
    st.one_of(
        any_request.map(lambda one: [one]),
        st.one_of(tree_requests(), sharing_requests(), overcapacity_requests(), multi_allocation_requests()),
    ),
    min_size=1,
    max_size=10,
).map(lambda steps: [request for step in steps for request in step])


# ---------------------------------------------------------------- running


def _generation(client: httpx.Client, rp: str, headers: Dict[str, str]) -> int:
    current = client.get(f"/resource_providers/{rp}", headers=headers)
    return current.json().get("generation") if current.status_code == 200 else 0


def send(client: httpx.Client, request: Request) -> Tuple[int, Dict[str, str], Any]:
    # The service role: upstream's policy wants it for POST /reshaper.
    headers = {"openstack-api-version": f"placement 1.{request.minor}", "x-auth-token": "admin",
               "x-roles": "admin,service", "accept": "application/json"}  # fmt: skip
    body = request.body
    if request.generation_of == "reshaper":
        body = json.loads(json.dumps(body))
        for rp, item in body["inventories"].items():
            item["resource_provider_generation"] = _generation(client, rp, headers)
    elif request.generation_of is not None:
        body = dict(body)
        body["resource_provider_generation"] = _generation(client, request.generation_of, headers)
    if request.consumer_generation_of == EACH_CONSUMER:
        body = json.loads(json.dumps(body))
        for consumer, one in body.items():
            current = client.get(f"/allocations/{consumer}", headers=headers)
            one["consumer_generation"] = (
                current.json().get("consumer_generation") if current.status_code == 200 else None
            )
    elif request.consumer_generation_of is not None:
        body = dict(body)
        current = client.get(f"/allocations/{request.consumer_generation_of}", headers=headers)
        body["consumer_generation"] = current.json().get("consumer_generation") if current.status_code == 200 else None
    if request.raw is not None:
        content = request.raw
        headers["content-type"] = "application/json"
    elif body is not None:
        content = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    else:
        content = b""
    response = client.request(request.method, request.path, content=content, headers=headers)
    parsed = response.json() if response.content and "json" in response.headers.get("content-type", "") else None
    return response.status_code, dict(response.headers), parsed


_REQUEST_ID = re.compile(r"req-[0-9a-f-]{36}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_KNOWN = set(PROVIDERS) | set(CONSUMERS) | set(AGGREGATES)


class Generated:
    """Names the UUIDs a server made up (a provider created without one) by
    order of first appearance, so the two servers' answers compare."""

    def __init__(self) -> None:
        self.names: Dict[str, str] = {}

    def __call__(self, text: str) -> str:
        def name(match: re.Match) -> str:
            found = match.group(0)
            if found in _KNOWN:
                return found
            return self.names.setdefault(found, f"generated-{len(self.names)}")

        return _UUID.sub(name, _REQUEST_ID.sub("req-*", text))


def normalise(value: Any, generated: Generated) -> Any:
    """Ids of requests and made-up UUIDs, timestamps and list order are not
    part of the contract; error details are compared by :func:`details`."""
    if isinstance(value, dict):
        return {
            generated(key): normalise(item, generated)
            for key, item in value.items()
            if key not in ("request_id", "created_at", "updated_at", "detail")
        }
    if isinstance(value, list):
        items = [normalise(item, generated) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, str):
        return generated(value)
    return value


_ALL_UNKNOWN_TRAITS = re.compile(r"No such trait ([A-Za-z0-9_, ]+)")
_PROVIDERS_WITHOUT_INVENTORY = re.compile(r"(?<=on resource provider ')([0-9a-fA-F, -]+)(?=' invalid\.)")


def _sorted_list(match: re.Match[str]) -> str:
    return ", ".join(sorted(match.group(1).strip().split(", ")))


def details(body: Any) -> List[str]:
    """Error messages, whitespace folded; PUT .../traits names every unknown trait
    and "Inventory for ... invalid." every provider without inventory in Python's
    set order of strings (random per process): sorted here."""
    if not isinstance(body, dict) or not isinstance(body.get("errors"), list):
        return []
    found = [" ".join(str(error.get("detail", "")).split()) for error in body["errors"]]
    return [
        _PROVIDERS_WITHOUT_INVENTORY.sub(
            _sorted_list, _ALL_UNKNOWN_TRAITS.sub(lambda m: "No such trait " + _sorted_list(m), text)
        )
        for text in found
    ]


def significant_headers(headers: Dict[str, str], generated: Generated) -> Dict[str, Any]:
    """Headers clients read: the version, where a new thing is, caching, allowed methods."""
    lowered = {key.lower(): value for key, value in headers.items()}
    picked: Dict[str, Any] = {
        "openstack-api-version": lowered.get("openstack-api-version"),
        "location": generated((lowered.get("location") or "").replace("http://placement", "")) or None,
        "last-modified": "last-modified" in lowered,
        "cache-control": lowered.get("cache-control"),
        "allow": ",".join(sorted(m.strip() for m in lowered["allow"].split(","))) if "allow" in lowered else None,
    }
    return picked


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[httpx.Client, httpx.Client, Path, Store]]:
    tmp = tmp_path_factory.mktemp("differential")
    upstream_db = tmp / "upstream.sqlite"
    upstream = httpx.Client(transport=httpx.WSGITransport(app=upstream_app(upstream_db)), base_url="http://placement")
    store = Store(f"sqlite:///{tmp / 'ours.sqlite'}")
    schema_upgrade.upgrade(store)
    ours = httpx.Client(transport=httpx.WSGITransport(app=Placement(store).wsgi), base_url="http://placement")
    yield ours, upstream, upstream_db, store
    ours.close()
    upstream.close()
    store.dispose()


_LIMITED = re.compile(r"(?<=[?&])limit=[0-9]+(&|$)")


def _assert_some_of(ours: Dict[str, Any], theirs: Dict[str, Any], everything: Dict[str, Any], where: str) -> None:
    """``ours`` has as many candidates as ``theirs``, each one of ``everything`` (the
    unlimited answer), and their providers' summaries as there."""
    chosen = ours["allocation_requests"]
    assert len(chosen) == len(theirs["allocation_requests"]), f"{where}\nours     {ours}\nupstream {theirs}"
    assert all(one in everything["allocation_requests"] for one in chosen), f"{where}\nours {ours}\nall {everything}"
    summaries = everything["provider_summaries"]
    assert all(summaries.get(rp) == summary for rp, summary in ours["provider_summaries"].items()), (
        f"{where}\nours {ours}\nall  {everything}"
    )


def compare(services: Any, requests: List[Request]) -> None:
    ours, upstream, upstream_db, store = services
    clean(store)
    reset(upstream_db)
    our_ids, their_ids = Generated(), Generated()
    for index, request in enumerate(requests):
        got = send(ours, request)
        want = send(upstream, request)
        if (
            want[0] >= 400
            and request.method in ("PUT", "POST")
            and request.path.startswith(("/allocations", "/reshaper"))
        ):
            forget_empty_consumers(upstream_db)  # upstream keeps a failed write's new consumers: not a contract
        where = f"request {index}: {request.method} {request.path} at 1.{request.minor} body={request.body!r}"
        assert got[0] == want[0], f"{where}\nstatus {got[0]} != upstream {want[0]}\nours {got[2]}\nupstream {want[2]}"
        if got[0] == 200 and _LIMITED.search(request.path):
            # Which `limit` candidates upstream returns depends on its set order (the
            # process's hash seed): any of its candidates will do, as many as it returns.
            full = send(upstream, Request("GET", _LIMITED.sub("", request.path), request.minor))
            _assert_some_of(normalise(got[2], our_ids), normalise(want[2], their_ids),
                            normalise(full[2], their_ids), where)  # fmt: skip
        else:
            assert normalise(got[2], our_ids) == normalise(want[2], their_ids), (
                f"{where}\nours     {got[2]}\nupstream {want[2]}"
            )
        # Upstream wraps its message in webob's text (and a schema dump); the
        # message itself must be upstream's, word for word.
        for mine, theirs in zip(details(got[2]), details(want[2])):
            if "IntegrityError)" in theirs:  # upstream shows its database's own text (SQLite's, here): not a contract
                mine, theirs = mine.split(":", 1)[0], theirs.split("(", 1)[0]
            assert our_ids(mine) in their_ids(theirs), f"{where}\nours     {mine!r}\nupstream {theirs!r}"
        assert significant_headers(got[1], our_ids) == significant_headers(want[1], their_ids), (
            f"{where}\nours     {significant_headers(got[1], our_ids)}\n"
            f"upstream {significant_headers(want[1], their_ids)}"
        )


EXAMPLES = int(os.environ.get("DEVTAG_DIFF_EXAMPLES", "90"))


@pytest.mark.differential
@pytest.mark.timeout(max(300, EXAMPLES * 4))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("DEVTAG_DIFF_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(requests=request_sequences)
def test_same_answers_as_upstream(services, requests):
    compare(services, requests)


def _fixed(minor: int) -> Dict[str, List[Request]]:
    """The cases of :func:`overcapacity_requests` and :func:`multi_allocation_requests`
    that upstream answered otherwise before, spelled out: each run checks them,
    whatever hypothesis draws."""
    first, second = PROVIDERS[0], PROVIDERS[1]
    mine, other = CONSUMERS
    shrinking = provider_with_inventory(first, minor, {"VCPU": {"total": 8}, "MEMORY_MB": {"total": 64}})
    shrinking += [allocation_put(mine, minor, {first: {"VCPU": 5, "MEMORY_MB": 8}}),
                  allocation_put(other, minor, {first: {"VCPU": 1}})]  # fmt: skip
    shrinking.append(Request("PUT", f"/resource_providers/{first}/inventories", minor,
                             {"inventories": {"VCPU": {"total": 4}, "MEMORY_MB": {"total": 64}}},
                             generation_of=first))  # fmt: skip
    for consumer, amount in ((mine, 6), (mine, 5), (mine, 4), (other, 2), (other, 1)):
        shrinking += [allocation_put(consumer, minor, {first: {"VCPU": amount}}),
                      Request("GET", f"/resource_providers/{first}/usages", minor)]  # fmt: skip
    shrinking.append(allocation_post(minor, {mine: {first: {"VCPU": 2}}, other: {first: {"VCPU": 3}}}))
    shrinking.append(Request("GET", f"/resource_providers/{first}/usages", minor))
    shrinking.append(Request("PUT", f"/resource_providers/{first}/inventories", minor,
                             {"inventories": {"DISK_GB": {"total": 4}}}, generation_of=first))  # fmt: skip
    constrained = provider_with_inventory(first, minor, {"VCPU": {"total": 2},
                                                         "MEMORY_MB": {"total": 1024, "step_size": 256}})  # fmt: skip
    constrained += provider_with_inventory(second, minor, {"VCPU": {"total": 8, "max_unit": 2}})
    for allocations in (
        {first: {"VCPU": 3, "MEMORY_MB": 100}},
        {first: {"MEMORY_MB": 100, "VCPU": 3}},
        {first: {"VCPU": 3}, second: {"VCPU": 4}},
        {second: {"VCPU": 4}, first: {"VCPU": 3}},
        {second: {"MEMORY_MB": 256}, first: {"VCPU": 3}},
        {first: {"VCPU": 3}, second: {"MEMORY_MB": 256}},
        {first: {"VCPU": 1}, second: {"CUSTOM_NOPE": 1}, PROVIDERS[2]: {"VCPU": 1}},
    ):
        constrained.append(allocation_put(mine, minor, allocations))
    constrained.append(
        allocation_post(minor, {mine: {first: {"VCPU": 2, "MEMORY_MB": 100}}, other: {first: {"VCPU": 1}}})
    )
    constrained.append(
        allocation_post(minor, {mine: {first: {"VCPU": 2}}, other: {first: {"VCPU": 1, "MEMORY_MB": 100}}})
    )
    listed = provider_with_inventory(second, 8, {"VCPU": {"total": 8, "max_unit": 2}})
    twice = [{"resource_provider": {"uuid": second}, "resources": {"VCPU": amount}} for amount in (1, 2)]
    listed.append(
        Request("PUT", f"/allocations/{mine}", 8, {"allocations": twice, "project_id": "p1", "user_id": "u1"})
    )
    listed.append(Request("GET", f"/allocations/{mine}", 8))
    return {"over capacity": shrinking, "order of checks": constrained, "provider twice in a list": listed}


@pytest.mark.differential
@pytest.mark.parametrize("minor", [27, 39])
@pytest.mark.parametrize("case", sorted(_fixed(27)))
def test_allocation_checks_as_upstream(services, case, minor):
    compare(services, _fixed(minor)[case])


ORACLE_EXAMPLES = int(os.environ.get("DEVTAG_DIFF_ORACLE_EXAMPLES", "10"))


@contextlib.contextmanager
def _headers(client: httpx.Client, headers: Dict[str, str]) -> Iterator[httpx.Client]:
    kept = client.headers.copy()
    client.headers.update(headers)
    try:
        yield client
    finally:
        client.headers = kept


@pytest.mark.differential
@pytest.mark.timeout(max(300, ORACLE_EXAMPLES * 4))
@settings(
    max_examples=ORACLE_EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("DEVTAG_DIFF_RANDOM"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(case=oracle.cases(), keep_empty=st.sampled_from([True, False, False, False]))
def test_candidates_as_upstream_and_the_oracle(services, case, keep_empty):
    """The candidate oracle's worlds and requests (trees, sharing providers, every group
    option) sent to upstream too: its candidates are the oracle's brute force, and
    devtag's answer is upstream's, provider summaries included, but for upstream's
    two known faults (docs/placement.md): an unsuffixed group taken wholly from
    sharing providers kept under one tree only, and amounts added up across
    candidates with ``group_policy=isolate`` when the unsuffixed group and a numbered
    group ask for one class (such requests are sent with ``group_policy=none``)."""
    unsuffixed = {rc for group in case.groups if not group.suffix for rc in group.resources}
    if any(unsuffixed & set(group.resources) for group in case.groups if group.suffix):
        # With isolate, upstream's _consolidate_allocation_requests adds a numbered
        # group's amount into the unsuffixed group's own entry (it copies entries only
        # with group_policy=none): only devtag's answer would be worth comparing.
        case.policy = "none"
    flagged = oracle.candidates_with_flags(case)
    assume(flagged or keep_empty)  # most random requests fit nowhere: keep a quarter of those
    ours, upstream, upstream_db, store = services
    clean(store)
    reset(upstream_db)
    answers = []
    for client in (ours, upstream):
        with _headers(client, oracle.HEADERS):
            oracle.build(client, case)
            response = client.get(oracle.query(case))
        assert response.status_code == 200, (oracle.query(case), response.text)
        answers.append(response.json())
    mine, theirs = answers
    upstream_found = set(oracle.keys(theirs))
    found = oracle.keys(mine)
    assert len(found) == len(set(found)) and set(found) == set(flagged), oracle.query(case)
    oracle.summaries_ok(case, mine)
    event(f"upstream lost {min(len(flagged) - len(upstream_found), 1)}+ candidates; sharing providers allocating: "
          f"{oracle.lent(case, flagged)}")  # fmt: skip
    # Upstream keeps an unsuffixed group taken wholly from sharing providers under one
    # of the trees they serve (a known difference: devtag answers every tree).
    assert upstream_found <= set(flagged), oracle.query(case)
    assert {key for key, lost in flagged.items() if not lost} <= upstream_found, oracle.query(case)
    oracle.summaries_ok(case, theirs)
    if upstream_found == set(found):
        assert mine["provider_summaries"] == theirs["provider_summaries"], oracle.query(case)
    else:
        for rp, summary in theirs["provider_summaries"].items():
            assert mine["provider_summaries"][rp] == summary, oracle.query(case)
