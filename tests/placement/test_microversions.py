"""Microversions 1.18 and later, each as OpenStack Placement's
rest_api_version_history defines it (the older ones are in test_api.py)."""

from __future__ import annotations

import uuid

import httpx

from .test_api import error_code, new_provider, set_inventory


def at(version: str) -> dict:
    # Admin and service, as a node's report client: upstream's policy keeps POST /reshaper for services.
    return {"openstack-api-version": f"placement {version}", "x-roles": "admin,service"}


def provider_uuids(response: httpx.Response) -> set:
    assert response.status_code == 200, response.text
    return {p["uuid"] for p in response.json()["resource_providers"]}


def set_traits(client: httpx.Client, rp: str, *names: str) -> None:
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    response = client.put(
        f"/resource_providers/{rp}/traits", json={"traits": list(names), "resource_provider_generation": generation}
    )
    assert response.status_code == 200, response.text


def set_aggregates(client: httpx.Client, rp: str, *aggregates: str) -> None:
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    response = client.put(
        f"/resource_providers/{rp}/aggregates",
        json={"aggregates": list(aggregates), "resource_provider_generation": generation},
    )
    assert response.status_code == 200, response.text


def test_1_18_required_traits_on_provider_list(client):
    gold = new_provider(client, "gold")
    plain = new_provider(client, "plain")
    client.put("/traits/CUSTOM_GOLD")
    set_traits(client, gold, "CUSTOM_GOLD", "HW_CPU_X86_AVX2")
    set_traits(client, plain, "HW_CPU_X86_AVX2")
    assert provider_uuids(client.get("/resource_providers?required=CUSTOM_GOLD")) == {gold}
    assert provider_uuids(client.get("/resource_providers?required=CUSTOM_GOLD,HW_CPU_X86_AVX2")) == {gold}
    assert provider_uuids(client.get("/resource_providers?required=HW_CPU_X86_AVX2")) == {gold, plain}
    unknown = client.get("/resource_providers?required=CUSTOM_NOPE")
    assert unknown.status_code == 400 and "No such trait(s): CUSTOM_NOPE" in unknown.text
    assert client.get("/resource_providers?required=", headers=at("1.18")).status_code == 400
    assert client.get("/resource_providers?required=CUSTOM_GOLD", headers=at("1.17")).status_code == 400
    # 1.22: forbidden traits; before it '!' is a malformed value.
    assert provider_uuids(client.get("/resource_providers?required=!CUSTOM_GOLD")) == {plain}
    assert provider_uuids(client.get("/resource_providers?required=HW_CPU_X86_AVX2,!CUSTOM_GOLD")) == {plain}
    assert client.get("/resource_providers?required=!CUSTOM_GOLD", headers=at("1.21")).status_code == 400
    assert client.get("/resource_providers?required=!", headers=at("1.22")).status_code == 400


def test_1_19_aggregates_with_generation(client):
    rp = new_provider(client, "cn1")
    agg = str(uuid.uuid4())
    got = client.get(f"/resource_providers/{rp}/aggregates")
    assert got.json() == {"aggregates": [], "resource_provider_generation": 0}
    plain_list = client.put(f"/resource_providers/{rp}/aggregates", json=[agg])
    assert plain_list.status_code == 400
    response = client.put(
        f"/resource_providers/{rp}/aggregates", json={"aggregates": [agg], "resource_provider_generation": 0}
    )
    assert response.status_code == 200
    assert response.json() == {"aggregates": [agg], "resource_provider_generation": 1}
    assert client.get(f"/resource_providers/{rp}").json()["generation"] == 1
    stale = client.put(
        f"/resource_providers/{rp}/aggregates", json={"aggregates": [], "resource_provider_generation": 0}
    )
    assert stale.status_code == 409 and error_code(stale) == "placement.concurrent_update"
    assert client.get(f"/resource_providers/{rp}/aggregates").json()["aggregates"] == [agg]
    # Before 1.19: a plain list, no generation in the answer and no bump.
    old = client.put(f"/resource_providers/{rp}/aggregates", json=[], headers=at("1.18"))
    assert old.status_code == 200 and old.json() == {"aggregates": []}
    assert client.get(f"/resource_providers/{rp}").json()["generation"] == 1


def test_1_20_create_returns_the_provider(client):
    response = client.post("/resource_providers", json={"name": "cn1"})
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "cn1" and body["generation"] == 0 and body["root_provider_uuid"] == body["uuid"]
    assert response.headers["location"].endswith(f"/resource_providers/{body['uuid']}")
    assert client.get(f"/resource_providers/{body['uuid']}").json() == body
    old = client.post("/resource_providers", json={"name": "cn2"}, headers=at("1.19"))
    assert old.status_code == 201 and old.content == b""


def candidate_uuids(client: httpx.Client, query: str, version: str = "1.24") -> set:
    response = client.get(f"/allocation_candidates?{query}", headers=at(version))
    assert response.status_code == 200, response.text
    return {uuid for request in response.json()["allocation_requests"] for uuid in request["allocations"]}


def test_1_21_to_1_24_member_of_and_forbidden_traits_on_candidates(client):
    agg1, agg2, agg3 = (str(uuid.uuid4()) for _ in range(3))
    client.put("/traits/CUSTOM_GOLD")
    a, b, c = (new_provider(client, name) for name in "abc")
    for rp in (a, b, c):
        set_inventory(client, rp, VCPU={"total": 8})
    set_aggregates(client, a, agg1, agg2)
    set_aggregates(client, b, agg2)
    set_aggregates(client, c, agg3)
    set_traits(client, a, "CUSTOM_GOLD")
    assert candidate_uuids(client, f"resources=VCPU:1&member_of={agg1}", "1.21") == {a}
    assert candidate_uuids(client, f"resources=VCPU:1&member_of=in:{agg1},{agg3}", "1.21") == {a, c}
    # Before 1.21 member_of is an unknown parameter of candidates, as upstream's schema has it.
    early = client.get(f"/allocation_candidates?resources=VCPU:1&member_of={agg1}", headers=at("1.20"))
    assert early.status_code == 400, early.text
    assert "Additional properties are not allowed ('member_of' was unexpected)" in early.text
    # 1.22: forbidden traits.
    assert candidate_uuids(client, "resources=VCPU:1&required=!CUSTOM_GOLD", "1.22") == {b, c}
    assert (
        client.get("/allocation_candidates?resources=VCPU:1&required=!CUSTOM_GOLD", headers=at("1.21")).status_code
        == 400
    )
    conflict = client.get("/allocation_candidates?resources=VCPU:1&required=CUSTOM_GOLD,!CUSTOM_GOLD")
    assert conflict.status_code == 400 and "Conflicting required and forbidden traits" in conflict.text
    # 1.24: several member_of are ANDed, on candidates and on the provider list.
    assert candidate_uuids(client, f"resources=VCPU:1&member_of={agg1}&member_of={agg2}") == {a}
    assert candidate_uuids(client, f"resources=VCPU:1&member_of=in:{agg1},{agg3}&member_of={agg2}") == {a}
    assert provider_uuids(client.get(f"/resource_providers?member_of={agg2}&member_of=in:{agg1},{agg3}")) == {a}
    twice = client.get(f"/resource_providers?member_of={agg1}&member_of={agg2}", headers=at("1.23"))
    assert twice.status_code == 400 and "Multiple member_of parameters are not supported" in twice.text


def test_1_23_code_in_errors(client):
    missing = f"/resource_providers/{uuid.uuid4()}"
    assert client.get(missing, headers=at("1.23")).json()["errors"][0]["code"] == "placement.undefined_code"
    old = client.get(missing, headers=at("1.22")).json()["errors"][0]
    assert "code" not in old and old["status"] == 404 and old["request_id"].startswith("req-")


def test_1_26_reserved_may_equal_total(client):
    rp = new_provider(client, "cn1")
    full = {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4, "reserved": 4}}}
    old = client.put(f"/resource_providers/{rp}/inventories", json=full, headers=at("1.25"))
    assert old.status_code == 400 and "greater than or equal to total" in old.text
    response = client.put(f"/resource_providers/{rp}/inventories", json=full, headers=at("1.26"))
    assert response.status_code == 200, response.text
    over = {"resource_provider_generation": 1, "inventories": {"VCPU": {"total": 4, "reserved": 5}}}
    assert client.put(f"/resource_providers/{rp}/inventories", json=over, headers=at("1.26")).status_code == 400
    one = client.put(
        f"/resource_providers/{rp}/inventories/VCPU",
        json={"resource_provider_generation": 1, "total": 2, "reserved": 2},
        headers=at("1.26"),
    )
    assert one.status_code == 200
    assert candidate_uuids(client, "resources=VCPU:1", "1.26") == set()


def candidates(client: httpx.Client, query: str, version: str) -> dict:
    response = client.get(f"/allocation_candidates?{query}", headers=at(version))
    assert response.status_code == 200, response.text
    return response.json()


def test_1_25_granular_groups_and_1_27_all_classes_in_summaries(client):
    a, b = new_provider(client, "a"), new_provider(client, "b")
    set_inventory(client, a, VCPU={"total": 8}, DISK_GB={"total": 100})
    set_inventory(client, b, VCPU={"total": 1})
    client.put("/traits/CUSTOM_GOLD")
    set_traits(client, a, "CUSTOM_GOLD")
    both = "resources1=VCPU:1&resources2=VCPU:1"
    missing_policy = client.get(f"/allocation_candidates?{both}", headers=at("1.25"))
    assert missing_policy.status_code == 400 and "parameter is required" in missing_policy.json()["errors"][0]["detail"]
    found = candidates(client, f"{both}&group_policy=none", "1.25")
    assert found["allocation_requests"] == [{"allocations": {a: {"resources": {"VCPU": 2}}}}]
    # Flat providers: isolating the two groups needs two providers in one tree.
    assert candidates(client, f"{both}&group_policy=isolate", "1.25")["allocation_requests"] == []
    gold = candidates(client, "resources=VCPU:1&resources1=DISK_GB:10&required1=!CUSTOM_GOLD&group_policy=none", "1.25")
    assert gold["allocation_requests"] == []
    mixed = candidates(client, "resources=VCPU:1&resources1=DISK_GB:10&required1=CUSTOM_GOLD", "1.25")
    assert mixed["allocation_requests"] == [{"allocations": {a: {"resources": {"VCPU": 1, "DISK_GB": 10}}}}]
    assert client.get("/allocation_candidates?resources1=VCPU:1", headers=at("1.24")).status_code == 400
    orphan = client.get("/allocation_candidates?resources=VCPU:1&required1=CUSTOM_GOLD", headers=at("1.25"))
    assert orphan.status_code == 400 and "orphaned traits keys: required1" in orphan.json()["errors"][0]["detail"]
    # A group with only forbidden traits is not an orphan in upstream's words (the random differential run found it).
    forbidden_only = client.get("/allocation_candidates?resources=VCPU:1&required1=!CUSTOM_GOLD", headers=at("1.25"))
    assert forbidden_only.status_code == 400
    assert forbidden_only.json()["errors"][0]["detail"].endswith("All request groups must specify resources.")
    assert client.get("/allocation_candidates?resources_X=VCPU:1", headers=at("1.25")).status_code == 400
    # 1.27: provider summaries show every class of the provider, before only the requested ones.
    old = candidates(client, "resources=VCPU:1", "1.26")["provider_summaries"]
    assert set(old[a]["resources"]) == {"VCPU"}
    new = candidates(client, "resources=VCPU:1", "1.27")["provider_summaries"]
    assert new[a]["resources"] == {"DISK_GB": {"capacity": 100, "used": 0}, "VCPU": {"capacity": 8, "used": 0}}
    assert new[b]["resources"] == {"VCPU": {"capacity": 1, "used": 0}}
    granular = candidates(client, "resources1=VCPU:1", "1.27")["provider_summaries"]
    assert set(granular[a]["resources"]) == {"VCPU", "DISK_GB"}


def test_1_28_consumer_generations(client):
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, VCPU={"total": 8})
    consumer = str(uuid.uuid4())
    v = at("1.28")

    def put(generation, vcpus=1, **extra):
        allocations = {rp: {"resources": {"VCPU": vcpus}}} if vcpus else {}
        body = {"allocations": allocations, "project_id": "p", "user_id": "u", "consumer_generation": generation}
        return client.put(f"/allocations/{consumer}", json={**body, **extra}, headers=v)

    without = client.put(
        f"/allocations/{consumer}", json={"allocations": {}, "project_id": "p", "user_id": "u"}, headers=v
    )
    assert without.status_code == 400
    stale_new = put(0)
    assert stale_new.status_code == 409 and error_code(stale_new) == "placement.concurrent_update"
    assert "expected null but got 0" in stale_new.json()["errors"][0]["detail"]
    assert put(None).status_code == 204
    got = client.get(f"/allocations/{consumer}", headers=v).json()
    assert got["consumer_generation"] == 1 and got["project_id"] == "p"
    assert "consumer_generation" not in client.get(f"/allocations/{consumer}", headers=at("1.27")).json()
    conflict = put(None, 2)
    assert conflict.status_code == 409 and "expected 1 but got None" in conflict.json()["errors"][0]["detail"]
    assert put(1, 2).status_code == 204
    assert client.get(f"/allocations/{consumer}", headers=v).json()["consumer_generation"] == 2
    by_provider = client.get(f"/resource_providers/{rp}/allocations", headers=v).json()["allocations"]
    assert by_provider == {consumer: {"resources": {"VCPU": 2}, "consumer_generation": 2}}
    # A write at an older version still moves the generation: a 1.28 client notices.
    old = {"allocations": {rp: {"resources": {"VCPU": 3}}}, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=old, headers=at("1.27")).status_code == 204
    assert put(2, 1).status_code == 409
    # Empty allocations with the right generation: a safe delete; the consumer is gone.
    assert put(3, 0).status_code == 204
    assert client.get(f"/allocations/{consumer}", headers=v).json() == {"allocations": {}}
    assert put(None).status_code == 204
    # POST /allocations: a generation per consumer, all or nothing.
    other = str(uuid.uuid4())
    body = {
        consumer: {"allocations": {}, "project_id": "p", "user_id": "u", "consumer_generation": 1},
        other: {
            "allocations": {rp: {"resources": {"VCPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": 5,
        },
    }
    assert client.post("/allocations", json=body, headers=v).status_code == 409
    assert client.get(f"/allocations/{consumer}", headers=v).json()["consumer_generation"] == 1
    body[other]["consumer_generation"] = None
    assert client.post("/allocations", json=body, headers=v).status_code == 204
    assert client.get(f"/allocations/{consumer}", headers=v).json() == {"allocations": {}}
    assert client.get(f"/allocations/{other}", headers=v).json()["consumer_generation"] == 1


def nested_host(client: httpx.Client, name: str = "cn") -> dict:
    """cn (CUSTOM_ROOT) -> numa0 -> pf0 (bandwidth, CUSTOM_PHYSNET_A); cn -> numa1."""
    client.put("/traits/CUSTOM_ROOT")
    client.put("/traits/CUSTOM_PHYSNET_A")
    cn = new_provider(client, name)
    numa0 = new_provider(client, f"{name}-numa0", parent_provider_uuid=cn)
    numa1 = new_provider(client, f"{name}-numa1", parent_provider_uuid=cn)
    pf0 = new_provider(client, f"{name}-pf0", parent_provider_uuid=numa0)
    set_traits(client, cn, "CUSTOM_ROOT")
    for numa in (numa0, numa1):
        set_inventory(client, numa, VCPU={"total": 4}, MEMORY_MB={"total": 1024})
    set_inventory(client, pf0, NET_BW_EGR_KILOBIT_PER_SEC={"total": 1000})
    set_traits(client, pf0, "CUSTOM_PHYSNET_A")
    return {"cn": cn, "numa0": numa0, "numa1": numa1, "pf0": pf0}


def allocation_sets(found: dict) -> list:
    return sorted(
        sorted((rp, tuple(sorted(item["resources"].items()))) for rp, item in request["allocations"].items())
        for request in found["allocation_requests"]
    )


def test_1_29_candidates_across_a_nested_tree(client):
    host = nested_host(client)
    numa0, numa1, pf0, cn = host["numa0"], host["numa1"], host["pf0"], host["cn"]
    query = "resources=VCPU:1,MEMORY_MB:512"
    # Before 1.29 one provider of a tree per candidate.
    old = candidates(client, query, "1.28")
    assert allocation_sets(old) == sorted([[(numa, (("MEMORY_MB", 512), ("VCPU", 1)))] for numa in (numa0, numa1)])
    assert set(old["provider_summaries"]) == {numa0, numa1}
    new = candidates(client, query, "1.29")
    assert len(new["allocation_requests"]) == 4  # VCPU and MEMORY_MB from either NUMA node
    assert sorted([(numa0, (("VCPU", 1),)), (numa1, (("MEMORY_MB", 512),))]) in allocation_sets(new)
    summaries = new["provider_summaries"]
    assert set(summaries) == {cn, numa0, numa1, pf0}  # the whole tree
    assert summaries[pf0]["parent_provider_uuid"] == numa0 and summaries[pf0]["root_provider_uuid"] == cn
    assert summaries[cn]["parent_provider_uuid"] is None and summaries[cn]["traits"] == ["CUSTOM_ROOT"]
    # Granular: compute from one NUMA node, bandwidth from the PF with the physnet, isolated.
    granular = (
        "resources1=VCPU:1,MEMORY_MB:512&resources2=NET_BW_EGR_KILOBIT_PER_SEC:100"
        "&required2=CUSTOM_PHYSNET_A&group_policy=isolate"
    )
    found = candidates(client, granular, "1.29")
    assert allocation_sets(found) == sorted(
        [
            sorted([(numa, (("MEMORY_MB", 512), ("VCPU", 1))), (pf0, (("NET_BW_EGR_KILOBIT_PER_SEC", 100),))])
            for numa in (numa0, numa1)
        ]
    )
    # The traits of the unsuffixed group are checked on the providers it uses.
    physnet = candidates(client, "resources=VCPU:1&required=CUSTOM_PHYSNET_A", "1.29")
    assert physnet["allocation_requests"] == []
    spread = candidates(client, "resources=VCPU:1,NET_BW_EGR_KILOBIT_PER_SEC:10&required=CUSTOM_PHYSNET_A", "1.29")
    assert len(spread["allocation_requests"]) == 2
    # Capacity across groups: both groups on one NUMA node must fit together.  The two
    # ways to place the groups differ in their mappings (1.34), so both are kept, as upstream.
    tight = candidates(client, "resources1=VCPU:3&resources2=VCPU:3&group_policy=none", "1.29")
    assert allocation_sets(tight) == 2 * [sorted([(numa0, (("VCPU", 3),)), (numa1, (("VCPU", 3),))])]


def test_1_30_reshaper_moves_inventory_and_allocations_into_a_child(client):
    cn = new_provider(client, "cn1")
    generation = set_inventory(client, cn, VCPU={"total": 8}, VGPU={"total": 4})
    consumer = str(uuid.uuid4())
    v = at("1.30")
    body = {
        "allocations": {cn: {"resources": {"VCPU": 2, "VGPU": 1}}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": None,
    }
    assert client.put(f"/allocations/{consumer}", json=body, headers=v).status_code == 204
    bystander = str(uuid.uuid4())
    body = {**body, "allocations": {cn: {"resources": {"VCPU": 1}}}}
    assert client.put(f"/allocations/{bystander}", json=body, headers=v).status_code == 204
    gpu = new_provider(client, "cn1-gpu", parent_provider_uuid=cn)
    generation = client.get(f"/resource_providers/{cn}").json()["generation"]
    reshape = {
        "inventories": {
            cn: {"resource_provider_generation": generation, "inventories": {"VCPU": {"total": 8}}},
            gpu: {"resource_provider_generation": 0, "inventories": {"VGPU": {"total": 4}}},
        },
        "allocations": {
            consumer: {
                "allocations": {cn: {"resources": {"VCPU": 2}}, gpu: {"resources": {"VGPU": 1}}},
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": 1,
            }
        },
    }
    assert client.post("/reshaper", json=reshape, headers=at("1.29")).status_code == 404
    stale = {**reshape, "inventories": {**reshape["inventories"], gpu: {**reshape["inventories"][gpu]}}}
    stale["inventories"][gpu]["resource_provider_generation"] = 7
    refused = client.post("/reshaper", json=stale, headers=v)
    assert refused.status_code == 409 and error_code(refused) == "placement.concurrent_update"
    response = client.post("/reshaper", json=reshape, headers=v)
    assert response.status_code == 204, response.text
    got = client.get(f"/allocations/{consumer}", headers=v).json()
    assert got["allocations"][gpu]["resources"] == {"VGPU": 1} and got["consumer_generation"] == 2
    assert client.get(f"/resource_providers/{cn}/usages").json()["usages"] == {"VCPU": 3}
    assert client.get(f"/resource_providers/{gpu}/usages").json()["usages"] == {"VGPU": 1}
    assert client.get(f"/resource_providers/{gpu}/inventories/VGPU").json()["total"] == 4
    # Removing the VCPU inventory that the bystander still uses is refused, and nothing changes.
    generation = client.get(f"/resource_providers/{cn}").json()["generation"]
    drop = {
        "inventories": {cn: {"resource_provider_generation": generation, "inventories": {}}},
        "allocations": {},
    }
    busy = client.post("/reshaper", json=drop, headers=v)
    assert busy.status_code == 409 and error_code(busy) == "placement.inventory.inuse"
    assert client.get(f"/resource_providers/{cn}/inventories/VCPU").status_code == 200
    missing = str(uuid.uuid4())
    unknown = {"inventories": {missing: {"resource_provider_generation": 0, "inventories": {}}}, "allocations": {}}
    assert client.post("/reshaper", json=unknown, headers=v).status_code == 400
    assert client.post("/reshaper", json={"inventories": {}, "allocations": {}}, headers=v).status_code == 400


def test_1_31_to_1_36_tree_filters_mappings_and_subtrees(client):
    host = nested_host(client)
    other = nested_host(client, "cn2")
    numa0, numa1, pf0, cn = host["numa0"], host["numa1"], host["pf0"], host["cn"]
    compute = "resources1=VCPU:1,MEMORY_MB:512"
    network = "resources2=NET_BW_EGR_KILOBIT_PER_SEC:100&required2=CUSTOM_PHYSNET_A"
    both = f"{compute}&{network}&group_policy=isolate"
    assert len(candidates(client, both, "1.30")["allocation_requests"]) == 4  # two hosts, two NUMA nodes each
    # 1.31: in_tree (any provider of the tree names it) and in_treeN.
    assert client.get(f"/allocation_candidates?{both}&in_tree={numa1}", headers=at("1.30")).status_code == 400
    mine = candidates(client, f"{both}&in_tree1={numa1}", "1.31")
    assert {rp for request in mine["allocation_requests"] for rp in request["allocations"]} == {numa0, numa1, pf0}
    assert candidates(client, f"resources=VCPU:1&in_tree={other['pf0']}", "1.31")["allocation_requests"] != []
    assert candidates(client, f"{compute}&in_tree1={uuid.uuid4()}", "1.31")["allocation_requests"] == []
    # 1.32: forbidden aggregates on candidates and providers.
    agg = str(uuid.uuid4())
    set_aggregates(client, other["cn"], agg)
    assert (
        client.get(f"/allocation_candidates?resources=VCPU:1&member_of=!{agg}", headers=at("1.31")).status_code == 400
    )
    kept = candidates(client, f"resources=VCPU:1&member_of=!{agg}", "1.32")  # the root's aggregate spans its tree
    assert {rp for request in kept["allocation_requests"] for rp in request["allocations"]} == {numa0, numa1}
    assert other["cn"] not in provider_uuids(client.get(f"/resource_providers?member_of=!in:{agg}", headers=at("1.32")))
    # 1.33: string suffixes.
    named = "resources_COMPUTE=VCPU:1&resources_NET=NET_BW_EGR_KILOBIT_PER_SEC:1&group_policy=none"
    assert client.get(f"/allocation_candidates?{named}", headers=at("1.32")).status_code == 400
    assert len(candidates(client, named, "1.33")["allocation_requests"]) == 4
    # 1.34: mappings from request group suffix to the providers that satisfy it.
    mapped = candidates(client, f"{both}&in_tree1={cn}&in_tree2={cn}", "1.34")["allocation_requests"]
    assert sorted(request["mappings"]["1"][0] for request in mapped) == sorted([numa0, numa1])
    assert all(request["mappings"]["2"] == [pf0] for request in mapped)
    assert "mappings" not in candidates(client, both, "1.33")["allocation_requests"][0]
    flat_mapping = candidates(client, f"resources=VCPU:1&in_tree={cn}", "1.34")["allocation_requests"]
    assert {tuple(request["mappings"][""]) for request in flat_mapping} == {(numa0,), (numa1,)}
    consumer = str(uuid.uuid4())
    claim = {**mapped[0], "project_id": "p", "user_id": "u", "consumer_generation": None}
    assert client.put(f"/allocations/{consumer}", json=claim, headers=at("1.33")).status_code == 400
    assert client.put(f"/allocations/{consumer}", json=claim, headers=at("1.34")).status_code == 204
    # 1.35: root_required.
    client.put("/traits/CUSTOM_OTHER")
    set_traits(client, other["cn"], "CUSTOM_OTHER")
    rooted = candidates(client, f"{both}&root_required=CUSTOM_OTHER", "1.35")["allocation_requests"]
    assert {rp for request in rooted for rp in request["allocations"]} == {other["numa0"], other["numa1"], other["pf0"]}
    unrooted = candidates(client, f"{both}&root_required=!CUSTOM_OTHER", "1.35")["allocation_requests"]
    assert {rp for request in unrooted for rp in request["allocations"]} == {numa0, numa1, pf0}
    assert candidates(client, f"{both}&root_required=CUSTOM_ROOT,CUSTOM_OTHER", "1.35")["allocation_requests"] == []
    assert client.get(f"/allocation_candidates?{both}&root_required=CUSTOM_ROOT", headers=at("1.34")).status_code == 400
    # 1.36: same_subtree (the PF under the NUMA node), and resourceless groups.
    subtree = candidates(client, f"{both}&same_subtree=1,2&in_tree1={cn}", "1.36")["allocation_requests"]
    assert [sorted(request["allocations"]) for request in subtree] == [sorted([numa0, pf0])]
    resourceless = f"{network}&required3=CUSTOM_ROOT&same_subtree=2,3&group_policy=none&in_tree2={cn}"
    found = candidates(client, resourceless, "1.36")["allocation_requests"]
    assert len(found) == 1 and found[0]["mappings"]["3"] == [cn] and list(found[0]["allocations"]) == [pf0]
    bad = client.get(f"/allocation_candidates?{network}&required3=CUSTOM_ROOT&group_policy=none", headers=at("1.36"))
    assert bad.status_code == 400 and "same_subtree" in bad.json()["errors"][0]["detail"]


def test_1_37_reparenting_and_unparenting(client):
    a, b = new_provider(client, "a"), new_provider(client, "b")
    child = new_provider(client, "child", parent_provider_uuid=a)
    grandchild = new_provider(client, "grandchild", parent_provider_uuid=child)
    old = client.put(
        f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": b}, headers=at("1.36")
    )
    assert old.status_code == 400 and "re-parenting" in old.json()["errors"][0]["detail"]
    moved = client.put(
        f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": b}, headers=at("1.37")
    )
    assert moved.status_code == 200 and moved.json()["root_provider_uuid"] == b
    assert client.get(f"/resource_providers/{grandchild}").json()["root_provider_uuid"] == b
    loop = client.put(
        f"/resource_providers/{b}", json={"name": "b", "parent_provider_uuid": grandchild}, headers=at("1.37")
    )
    assert loop.status_code == 400 and "loop" in loop.json()["errors"][0]["detail"]
    root = client.put(
        f"/resource_providers/{child}", json={"name": "child", "parent_provider_uuid": None}, headers=at("1.37")
    )
    assert root.status_code == 200 and root.json()["root_provider_uuid"] == child
    assert root.json()["parent_provider_uuid"] is None
    assert client.get(f"/resource_providers/{grandchild}").json()["root_provider_uuid"] == child
    assert provider_uuids(client.get(f"/resource_providers?in_tree={child}")) == {child, grandchild}


def test_1_38_consumer_types_in_allocations_and_usages(client):
    rp = new_provider(client, "cn1")
    set_inventory(client, rp, VCPU={"total": 16}, MEMORY_MB={"total": 4096})
    v = at("1.38")
    instance, migration, legacy = (str(uuid.uuid4()) for _ in range(3))

    def body(vcpus, **extra):
        base = {
            "allocations": {rp: {"resources": {"VCPU": vcpus, "MEMORY_MB": 256}}},
            "project_id": "p",
            "user_id": "u",
        }
        return {**base, **extra}

    assert client.put(f"/allocations/{instance}", json=body(2, consumer_generation=None), headers=v).status_code == 400
    assert (
        client.put(
            f"/allocations/{instance}", json=body(2, consumer_generation=None, consumer_type="INSTANCE"), headers=v
        ).status_code
        == 204
    )
    assert (
        client.post(
            "/allocations", json={migration: body(1, consumer_generation=None, consumer_type="MIGRATION")}, headers=v
        ).status_code
        == 204
    )
    assert client.put(f"/allocations/{legacy}", json=body(4), headers=at("1.27")).status_code == 204
    assert client.get(f"/allocations/{instance}", headers=v).json()["consumer_type"] == "INSTANCE"
    assert client.get(f"/allocations/{legacy}", headers=v).json()["consumer_type"] == "unknown"
    assert "consumer_type" not in client.get(f"/allocations/{instance}", headers=at("1.37")).json()
    usages = client.get("/usages?project_id=p", headers=v).json()["usages"]
    assert usages == {
        "INSTANCE": {"VCPU": 2, "MEMORY_MB": 256, "consumer_count": 1},
        "MIGRATION": {"VCPU": 1, "MEMORY_MB": 256, "consumer_count": 1},
        "unknown": {"VCPU": 4, "MEMORY_MB": 256, "consumer_count": 1},
    }
    assert client.get("/usages?project_id=p&consumer_type=all", headers=v).json()["usages"] == {
        "all": {"VCPU": 7, "MEMORY_MB": 768, "consumer_count": 3}
    }
    assert client.get("/usages?project_id=p&consumer_type=MIGRATION", headers=v).json()["usages"] == {
        "MIGRATION": {"VCPU": 1, "MEMORY_MB": 256, "consumer_count": 1}
    }
    assert client.get("/usages?project_id=p&consumer_type=unknown", headers=v).json()["usages"] == {
        "unknown": {"VCPU": 4, "MEMORY_MB": 256, "consumer_count": 1}
    }
    assert client.get("/usages?project_id=p&consumer_type=bad-type", headers=v).status_code == 400
    assert client.get("/usages?project_id=p", headers=at("1.37")).json()["usages"] == {"VCPU": 7, "MEMORY_MB": 768}
    # A write at an older version keeps the type.
    assert client.put(f"/allocations/{instance}", json=body(3), headers=at("1.27")).status_code == 204
    assert client.get(f"/allocations/{instance}", headers=v).json()["consumer_type"] == "INSTANCE"


def test_1_39_any_of_traits(client):
    a, b, c = (new_provider(client, name) for name in "abc")
    for rp in (a, b, c):
        set_inventory(client, rp, VCPU={"total": 4})
    set_traits(client, a, "HW_CPU_X86_AVX2")
    set_traits(client, b, "HW_CPU_X86_AVX512F")
    query = "required=in:HW_CPU_X86_AVX2,HW_CPU_X86_AVX512F"
    assert client.get(f"/resource_providers?{query}", headers=at("1.38")).status_code == 400
    assert provider_uuids(client.get(f"/resource_providers?{query}", headers=at("1.39"))) == {a, b}
    assert candidate_uuids(client, f"resources=VCPU:1&{query}", "1.39") == {a, b}
    both = f"resources=VCPU:1&{query}&required=!HW_CPU_X86_AVX512F"
    assert candidate_uuids(client, both, "1.39") == {a}
    bad = client.get("/allocation_candidates?resources=VCPU:1&required=in:A,!B", headers=at("1.39"))
    assert bad.status_code == 400


def test_hostile_candidate_queries_never_500(client):
    host = nested_host(client)
    big = str(2**70)
    queries = [
        f"resources=VCPU:{big}",
        f"resources1=VCPU:1&limit={big}&group_policy=isolate",
        "resources=VCPU:1&same_subtree=1",
        "resources=VCPU:1&same_subtree=,",
        "resources1=VCPU:1&resources2=VCPU:1&group_policy=isolate&same_subtree=1,2,3",
        "required1=CUSTOM_ROOT&same_subtree=1",
        "resources=VCPU:1&root_required=in:A,B",
        "resources=VCPU:1&root_required=!",
        "resources=VCPU:1&root_required=CUSTOM_ROOT&root_required=CUSTOM_ROOT",
        f"resources=VCPU:1&in_tree={host['cn']}&in_tree=nope",
        "resources=VCPU:1&member_of=!in:",
        "resources=VCPU:1&member_of=in:,",
        "resources=VCPU:1&required=in:",
        "resources=VCPU:1&required=!!!",
        "resources_" + "A" * 65 + "=VCPU:1",
        "resources%00=VCPU:1",
        "resources=VCPU:1&group_policy=nope",
        "resources=%ED%A0%80:1",  # a lone surrogate, UTF-8 encoded
        "resources=" + ",".join(f"CUSTOM_{i}:1" for i in range(50)),
    ]
    for query in queries:
        response = client.get(f"/allocation_candidates?{query}", headers=at("1.39"))
        assert response.status_code in (200, 400), (query, response.text)


def test_reshaper_and_traits_answers_as_upstream(client):
    """Found by the differential test: upstream's reshaper checks no inventory
    capacity (reserved above total passes), its PUT .../traits answer carries the
    1.15 cache headers, and member_of on candidates starts at 1.21."""
    cn = new_provider(client, "cn1")
    v = at("1.30")
    reshape = {
        "inventories": {cn: {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4, "reserved": 8}}}},
        "allocations": {},
    }
    response = client.post("/reshaper", json=reshape, headers=v)
    assert response.status_code == 204, response.text
    assert client.get(f"/resource_providers/{cn}/inventories").json()["inventories"]["VCPU"]["reserved"] == 8
    traits = client.put(f"/resource_providers/{cn}/traits", json={"traits": [], "resource_provider_generation": 2})
    assert traits.status_code == 200 and traits.headers["cache-control"] == "no-cache"
    assert "last-modified" in traits.headers
    early = client.put(
        f"/resource_providers/{cn}/traits", json={"traits": [], "resource_provider_generation": 2}, headers=at("1.14")
    )
    assert early.status_code == 200 and "cache-control" not in early.headers


def test_reshaper_checks_in_upstream_order_and_words(client):
    """The inventories' providers in body order, then consumer generations, then the
    allocations' providers, then classes: each refusal worded as upstream's."""
    cn = new_provider(client, "cn1", uuid="aaaaaaaa-1111-4111-8111-111111111111")
    missing = "bbbbbbbb-1111-4111-8111-111111111111"
    consumer = str(uuid.uuid4())
    v = at("1.30")

    def reshape(inventories: dict, allocations: dict) -> httpx.Response:
        return client.post("/reshaper", json={"inventories": inventories, "allocations": allocations}, headers=v)

    def moved(rp: str, resources: dict, generation: object = None) -> dict:
        one = {"allocations": {rp: {"resources": resources}}, "project_id": "p", "user_id": "u"}
        return {consumer: {**one, "consumer_generation": generation}}

    ours = {cn: {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4}}}}
    nowhere = {missing: {"resource_provider_generation": 0, "inventories": {}}}
    first = reshape({**nowhere, **ours}, moved(cn, {"VCPU": 1}, generation=3))
    assert first.status_code == 400 and error_code(first) == "placement.resource_provider.not_found"
    stale_consumer = reshape(ours, moved(missing, {"VCPU": 1}, generation=3))
    assert stale_consumer.status_code == 409 and "expected null but got 3" in stale_consumer.text
    unknown_rp = reshape(ours, moved(missing, {"BOGUS": 1}))
    assert unknown_rp.status_code == 400
    assert f"Allocation for resource provider '{missing}' that does not exist." in unknown_rp.text
    bogus = {cn: {"resource_provider_generation": 0, "inventories": {"BOGUS": {"total": 4}}}}
    unknown_class = reshape(bogus, moved(cn, {"VCPU": 1}))
    assert unknown_class.status_code == 400
    assert unknown_class.json()["errors"][0]["detail"] == "malformed reshaper data: No such resource class BOGUS."
    put = client.put(
        f"/allocations/{consumer}",
        json={"allocations": {cn: {"resources": {"BOGUS": 1}}}, "project_id": "p", "user_id": "u"},
    )
    assert put.json()["errors"][0]["detail"] == (
        f"Unable to allocate inventory for consumer {consumer}: No such resource class BOGUS."
    )
    posted = client.post(
        "/allocations",
        json={consumer: {"allocations": {cn: {"resources": {"BOGUS": 1}}}, "project_id": "p", "user_id": "u"}},
    )
    assert posted.json()["errors"][0]["detail"] == "Unable to allocate inventory No such resource class BOGUS."
    inventory = client.put(
        f"/resource_providers/{cn}/inventories",
        json={"resource_provider_generation": 0, "inventories": bogus[cn]["inventories"]},
    )
    assert inventory.json()["errors"][0]["detail"] == (
        f"Unknown resource class in inventory for resource provider {cn}: No such resource class BOGUS."
    )


def test_candidates_checks_in_upstream_order(client):
    """Group by group as upstream: unknown class (400), no provider in member_of
    (no candidate, the group's unknown traits unseen), unknown trait (400); the
    query schema (group_policy, limit) before any group."""
    agg = str(uuid.uuid4())
    empty = {"allocation_requests": [], "provider_summaries": {}}
    nobody = client.get(f"/allocation_candidates?resources=VCPU:1&member_of={agg}&required=CUSTOM_NOPE")
    assert nobody.status_code == 200 and nobody.json() == empty
    query = f"resources=VCPU:1&member_of={agg}&root_required=CUSTOM_NOPE"
    root = client.get(f"/allocation_candidates?{query}", headers=at("1.35"))
    assert root.status_code == 400 and "No such trait(s): CUSTOM_NOPE." in root.text
    bogus = client.get(f"/allocation_candidates?resources=BOGUS:1&member_of={agg}")
    assert bogus.status_code == 400
    assert "Invalid resource class in resources parameter: No such resource class BOGUS." in bogus.text
    rp = new_provider(client, "cn1")
    set_aggregates(client, rp, agg)
    unknown = client.get(f"/allocation_candidates?resources=VCPU:1&member_of={agg}&required=CUSTOM_NOPE")
    assert unknown.status_code == 400 and "No such trait(s): CUSTOM_NOPE." in unknown.text
    policy = client.get(f"/allocation_candidates?resources=VCPU:1&member_of1=!{agg}&resources1=VCPU:1&group_policy=x")
    assert policy.status_code == 400 and "'x' is not one of ['none', 'isolate']" in policy.text


def test_stale_generations_worded_per_route_as_upstream(client):
    """Found by the random differential run: upstream words a stale generation per
    route, without the provider's uuid."""
    rp = new_provider(client, "cn1")
    stale = client.put(
        f"/resource_providers/{rp}/inventories", json={"resource_provider_generation": 5, "inventories": {}}
    )
    assert stale.status_code == 409 and error_code(stale) == "placement.concurrent_update"
    assert stale.json()["errors"][0]["detail"] == "resource provider generation conflict"
    one = client.put(f"/resource_providers/{rp}/inventories/VCPU", json={"resource_provider_generation": 5, "total": 1})
    assert one.json()["errors"][0]["detail"] == "resource provider generation conflict"
    aggregates = client.put(
        f"/resource_providers/{rp}/aggregates", json={"aggregates": [], "resource_provider_generation": 5}
    )
    assert aggregates.status_code == 409 and aggregates.json()["errors"][0]["detail"] == (
        "Resource provider's generation already changed. Please update the generation and try again."
    )


def test_candidates_stop_at_the_first_group_without_candidates(client):
    """Upstream searches the groups in the order of their first key in the query and
    stops at the first group without candidates, before it looks up the next group's
    names: a later group's unknown class or trait is then an empty answer, not a 400
    (the random differential run found it)."""
    empty = {"allocation_requests": [], "provider_summaries": {}}
    query = "resources=VCPU:1&resources1=CUSTOM_GPU:1&group_policy=none"
    nothing = client.get(f"/allocation_candidates?{query}", headers=at("1.25"))
    assert nothing.status_code == 200 and nothing.json() == empty
    # The first group in the query comes first, whatever its suffix.
    first = client.get("/allocation_candidates?resources1=CUSTOM_GPU:1&resources=VCPU:1&group_policy=none",
                       headers=at("1.25"))  # fmt: skip
    assert first.status_code == 400 and "No such resource class CUSTOM_GPU." in first.text
    traits = client.get("/allocation_candidates?resources=VCPU:1&resources1=VCPU:1&required1=CUSTOM_NOPE"
                        "&group_policy=none", headers=at("1.25"))  # fmt: skip
    assert traits.status_code == 200 and traits.json() == empty
    cn = new_provider(client, "cn1")
    set_inventory(client, cn, VCPU={"total": 8})
    # The first group has candidates now: the second group's unknown class is looked up.
    found = client.get(f"/allocation_candidates?{query}", headers=at("1.25"))
    assert found.status_code == 400 and "No such resource class CUSTOM_GPU." in found.text
    # No root has root_required's trait: upstream stops before any group.
    client.put("/traits/CUSTOM_FAST")
    rooted = client.get("/allocation_candidates?resources=BOGUS:1&root_required=CUSTOM_FAST", headers=at("1.35"))
    assert rooted.status_code == 200 and rooted.json() == empty
    set_traits(client, cn, "CUSTOM_FAST")
    rooted = client.get("/allocation_candidates?resources=BOGUS:1&root_required=CUSTOM_FAST", headers=at("1.35"))
    assert rooted.status_code == 400 and "No such resource class BOGUS." in rooted.text


def test_candidate_query_checked_as_upstream_validates_it(client):
    """Upstream validates the query with jsonschema (each key's last value; a missing
    ``resources`` before unexpected keys, every unexpected key named, worded per
    microversion), then takes the first ``limit``/``group_policy``, then parses the
    group keys one occurrence after the other (found by the differential test)."""

    def detail(query: str, version: str) -> str:
        response = client.get(f"/allocation_candidates?{query}", headers=at(version))
        assert response.status_code == 400, response.text
        return response.json()["errors"][0]["detail"]

    prefix = "Invalid query string parameters: "
    assert detail("foo=1", "1.16") == f"{prefix}'resources' is a required property"
    assert detail("resources1=VCPU:1", "1.24") == f"{prefix}'resources' is a required property"
    both = detail("resources=VCPU:1&foo=1&bar=1&limit=0", "1.16")
    assert both == f"{prefix}Additional properties are not allowed ('bar', 'foo' were unexpected)"
    assert detail("foo=1&resources=VCPU:1", "1.25") == (
        f"{prefix}'foo' does not match any of the regexes: "
        "'^member_of([1-9][0-9]*)?$', '^required([1-9][0-9]*)?$', '^resources([1-9][0-9]*)?$'"
    )
    assert "'foo', 'in_tree!' do not match any of the regexes: '^in_tree([a-zA-Z0-9_-]{1,64})?$'" in detail(
        "foo=1&in_tree!=x&resources=VCPU:1", "1.33"
    )
    # Every occurrence is parsed, in query order.
    assert detail("resources=VCPU:x&resources=VCPU:1", "1.16").startswith("Requested resource VCPU expected")
    assert "Got an empty trait in: ," in detail("resources=VCPU:1&required=,&resources=VCPU:x", "1.17")
    in_tree = f"in_tree=nope&in_tree={uuid.uuid4()}&resources=VCPU:1"
    assert "'in_tree' parameter to be a format of uuid. Got: nope" in detail(in_tree, "1.31")
    # The request-wide parameters before the groups.
    assert "Got an empty trait in: ," in detail("resources=VCPU:x&root_required=,", "1.35")
    # An empty class name is a class that does not exist.
    assert detail("resources=:1", "1.16") == "Invalid resource class in resources parameter: No such resource class ."
    # The schema checks the last group_policy, the first one counts ("bogus" does not isolate).
    policy = client.get("/allocation_candidates?group_policy=bogus&group_policy=none&resources=VCPU:1",
                        headers=at("1.25"))  # fmt: skip
    assert policy.status_code == 200, policy.text


def test_provider_list_and_usages_checked_in_upstream_order(client):
    """GET /resource_providers as upstream: an unknown in_tree provider, the required
    traits (no provider has them: an empty list before the forbidden traits and the
    classes are looked up), the forbidden traits, member_of, the classes; the query
    schema names every unexpected key; /usages checks project_id before unexpected keys
    and consumer_type with upstream's own pattern (found by the differential test)."""
    client.put("/traits/CUSTOM_FAST")
    nobody = {"resource_providers": []}

    def listed(query: str) -> httpx.Response:
        return client.get(f"/resource_providers?{query}", headers=at("1.32"))

    assert listed("required=CUSTOM_FAST,!CUSTOM_SLOW").json() == nobody
    assert listed("required=CUSTOM_FAST&resources=BOGUS:1").json() == nobody
    assert listed(f"member_of={uuid.uuid4()}&resources=BOGUS:1").json() == nobody
    assert listed(f"in_tree={uuid.uuid4()}&required=BOGUS").json() == nobody
    unknown = listed(f"member_of={uuid.uuid4()}&required=BOGUS").json()["errors"][0]["detail"]
    assert unknown == 'Invalid trait(s) in "required" parameter: No such trait(s): BOGUS.'
    rp = new_provider(client, "cn1")
    set_traits(client, rp, "CUSTOM_FAST")
    slow = listed("required=CUSTOM_FAST,!CUSTOM_SLOW")
    assert slow.status_code == 400 and "No such trait(s): CUSTOM_SLOW." in slow.text
    bogus = listed("required=CUSTOM_FAST&resources=BOGUS:1")
    assert bogus.status_code == 400 and "No such resource class BOGUS." in bogus.text
    extras = listed("foo=1&bar=2")
    assert extras.json()["errors"][0]["detail"] == (
        "Invalid query string parameters: Additional properties are not allowed ('bar', 'foo' were unexpected)"
    )

    def usages(query: str) -> httpx.Response:
        return client.get(f"/usages?{query}", headers=at("1.38"))

    assert "'project_id' is a required property" in usages("foo=1").text
    assert "'bar', 'foo' were unexpected" in usages("project_id=p1&foo=1&bar=2").text
    assert "'x' does not match '^[A-Z0-9_]+$|^all|^unknown$'" in usages("project_id=p&consumer_type=x").text
    # The error of the property whose name sorts last: project_id's before consumer_type's.
    assert "'' should be non-empty" in usages("project_id=&consumer_type=x").text
    assert usages("project_id=p1&consumer_type=allx").json() == {"usages": {}}


def test_reshaper_counts_generations_as_upstream(client):
    """Upstream sets a non-empty new inventory twice (an interim union of old and new
    before the allocations move, then the new one): two generations; an empty one once
    (found by the differential test)."""
    cn = new_provider(client, "cn1")
    child = new_provider(client, "numa0", parent_provider_uuid=cn)
    body = {
        "inventories": {
            cn: {"resource_provider_generation": 0, "inventories": {}},
            child: {"resource_provider_generation": 0, "inventories": {"VCPU": {"total": 4}}},
        },
        "allocations": {},
    }
    assert client.post("/reshaper", json=body, headers=at("1.30")).status_code == 204
    assert client.get(f"/resource_providers/{child}").json()["generation"] == 2
    assert client.get(f"/resource_providers/{cn}").json()["generation"] == 1
