"""Fuzz every route with hypothesis: random versions, paths, queries, headers
and bodies (random JSON and mutations of valid ones).  Nothing may answer 5xx,
and every error must be Placement's JSON error document."""

from __future__ import annotations

import json
import re
import uuid
from urllib.parse import quote

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from devtag_host.placement import schema_upgrade
from devtag_host.placement.app import ROUTES
from devtag_host.placement.db import Store

from .conftest import make_client

RP = str(uuid.uuid4())
CONSUMER = str(uuid.uuid4())
AGG = str(uuid.uuid4())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
resource_classes = st.sampled_from(["VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_X", "vcpu", "", "IPV4_ADDRESS"])
amounts = st.one_of(st.integers(-5, 2**40), st.text(max_size=5), st.none(), st.floats(allow_nan=False))
valid_bodies = st.sampled_from(
    [
        {"name": "fuzz", "uuid": RP},
        {"name": "x", "parent_provider_uuid": RP},
        {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4}}},
        {"resource_class": "VCPU", "total": 4},
        {"resource_provider_generation": 0, "total": 4},
        [AGG],
        {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 0},
        {"allocations": {RP: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"},
        {"allocations": [{"resource_provider": {"uuid": RP}, "resources": {"VCPU": 1}}]},
        {CONSUMER: {"allocations": {RP: {"resources": {"VCPU": 1}}}, "project_id": "p", "user_id": "u"}},
        {"name": "CUSTOM_FUZZ"},
    ]
)

V1_18 = {"openstack-api-version": "placement 1.18"}  # aggregates as a plain list (1.19 adds a generation)


@st.composite
def mutated(draw):
    body = json.loads(json.dumps(draw(valid_bodies)))
    if isinstance(body, dict) and body and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(body)))
        body[key] = draw(st.one_of(json_values, amounts))
    if isinstance(body, dict) and draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(json_values)
    return body


path_values = st.one_of(st.just(RP), st.just(CONSUMER), resource_classes, st.text(max_size=40), st.just("CUSTOM_FUZZ"))
query_values = st.one_of(
    st.just(f"in:{AGG},{RP}"),
    st.just(AGG),
    st.builds(lambda rc, n: f"{rc}:{n}", resource_classes, amounts),
    st.text(max_size=30),
    st.just("true"),
    st.just("startswith:CUSTOM_"),
    st.just(f"!in:{AGG}"),
    st.just("in:HW_CPU_X86_AVX2,!CUSTOM_FUZZ"),
    st.just("!HW_CPU_X86_AVX2"),
    st.just("1,2"),
    st.just("isolate"),
    st.just(str(2**70)),
)
query_keys = st.sampled_from(
    [
        "name",
        "uuid",
        "member_of",
        "resources",
        "in_tree",
        "required",
        "limit",
        "project_id",
        "user_id",
        "associated",
        "x",
        "resources1",
        "required1",
        "member_of1",
        "in_tree1",
        "resources_A",
        "required_A",
        "group_policy",
        "root_required",
        "same_subtree",
        "consumer_type",
    ]
)


@st.composite
def requests(draw):
    template = draw(st.sampled_from(sorted(ROUTES)))
    path = re.sub(r"\{\w+\}", lambda _m: quote(draw(path_values), safe="") or "x", template)
    method = draw(st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"]))
    minor = draw(st.integers(0, 39))
    version = draw(st.sampled_from([f"placement 1.{minor}", "placement latest", "placement 2.0", "compute 1.1", "x"]))
    params = draw(st.lists(st.tuples(query_keys, query_values), max_size=3))
    body = draw(st.one_of(mutated(), json_values))
    raw = draw(st.sampled_from(["json", "json", "garbage", "empty"]))
    return method, path, params, version, body, raw


def test_no_500s(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'fuzz.sqlite'}")
    schema_upgrade.upgrade(store)
    client = make_client(store)
    # Something to hit: a provider with inventory, a trait and an aggregate.
    client.post("/resource_providers", json={"name": "seed", "uuid": RP})
    client.put(
        f"/resource_providers/{RP}/inventories",
        json={"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 8}}},
    )
    client.put(f"/resource_providers/{RP}/aggregates", json=[AGG], headers=V1_18)

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(requests())
    def fuzz(request):
        method, path, params, version, body, raw = request
        content = {"json": json.dumps(body).encode(), "garbage": b"\xff{not json", "empty": b""}[raw]
        response = client.request(
            method,
            path,
            params=params,
            content=content,
            headers={"openstack-api-version": version, "content-type": "application/json"},
        )
        assert response.status_code < 500, (method, path, params, version, body, response.text)
        if response.status_code >= 400 and method != "HEAD":
            (error,) = response.json()["errors"]
            assert error.get("code", "placement.").startswith("placement.")  # 1.23+ always has one

    try:
        fuzz()
    finally:
        client.close()
        store.dispose()
