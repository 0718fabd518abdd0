"""GET /allocation_candidates, with the design's two sharing scenarios."""

from __future__ import annotations

import uuid

from .test_api import new_provider, set_inventory

V1_18 = {"openstack-api-version": "placement 1.18"}  # aggregates as a plain list (1.19 adds a generation)


def share(client, rp: str, aggregate: str, *traits: str) -> None:
    assert client.put(f"/resource_providers/{rp}/aggregates", json=[aggregate], headers=V1_18).status_code == 200
    generation = client.get(f"/resource_providers/{rp}").json()["generation"]
    body = {"traits": ["MISC_SHARES_VIA_AGGREGATE", *traits], "resource_provider_generation": generation}
    assert client.put(f"/resource_providers/{rp}/traits", json=body).status_code == 200


def candidates(client, query: str, version: str = "1.17") -> dict:
    """The answer at ``version`` (``member_of`` needs 1.21, as upstream)."""
    response = client.get(f"/allocation_candidates?{query}", headers={"openstack-api-version": f"placement {version}"})
    assert response.status_code == 200, response.text
    return response.json()


def as_sets(body: dict) -> set:
    return {
        frozenset((rp, frozenset(entry["resources"].items())) for rp, entry in request["allocations"].items())
        for request in body["allocation_requests"]
    }


def test_single_providers(client):
    cn1, cn2, small = new_provider(client, "cn1"), new_provider(client, "cn2"), new_provider(client, "small")
    for rp in (cn1, cn2):
        set_inventory(client, rp, VCPU={"total": 8}, MEMORY_MB={"total": 4096}, DISK_GB={"total": 100})
    set_inventory(client, small, VCPU={"total": 1}, MEMORY_MB={"total": 4096})
    body = candidates(client, "resources=VCPU:2,MEMORY_MB:1024")
    assert as_sets(body) == {frozenset({(rp, frozenset({("VCPU", 2), ("MEMORY_MB", 1024)}))}) for rp in (cn1, cn2)}
    assert body["provider_summaries"][cn1]["resources"] == {
        "VCPU": {"capacity": 8, "used": 0},
        "MEMORY_MB": {"capacity": 4096, "used": 0},
    }
    assert body["provider_summaries"][cn1]["traits"] == []
    assert len(candidates(client, "resources=VCPU:2&limit=1")["allocation_requests"]) == 1


def test_list_format_before_1_12_and_no_traits_before_1_17(client):
    cn1 = new_provider(client, "cn1")
    set_inventory(client, cn1, VCPU={"total": 8})
    body = candidates(client, "resources=VCPU:1", version="1.10")
    assert body["allocation_requests"] == [
        {"allocations": [{"resource_provider": {"uuid": cn1}, "resources": {"VCPU": 1}}]}
    ]
    assert "traits" not in body["provider_summaries"][cn1]
    too_early = client.get(
        "/allocation_candidates?resources=VCPU:1", headers={"openstack-api-version": "placement 1.9"}
    )
    assert too_early.status_code == 404
    no_limit = client.get(
        "/allocation_candidates?resources=VCPU:1&limit=1", headers={"openstack-api-version": "placement 1.15"}
    )
    assert no_limit.status_code == 400
    no_required = client.get(
        "/allocation_candidates?resources=VCPU:1&required=HW_CPU_X86_AVX2",
        headers={"openstack-api-version": "placement 1.16"},
    )
    assert no_required.status_code == 400


def test_required_traits_and_member_of(client):
    avx, plain = new_provider(client, "avx"), new_provider(client, "plain")
    for rp in (avx, plain):
        set_inventory(client, rp, VCPU={"total": 8})
    assert (
        client.put(
            f"/resource_providers/{avx}/traits", json={"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 1}
        ).status_code
        == 200
    )
    body = candidates(client, "resources=VCPU:1&required=HW_CPU_X86_AVX2")
    assert list(body["provider_summaries"]) == [avx]
    assert body["provider_summaries"][avx]["traits"] == ["HW_CPU_X86_AVX2"]
    agg = str(uuid.uuid4())
    client.put(f"/resource_providers/{plain}/aggregates", json=[agg], headers=V1_18)
    assert list(candidates(client, f"resources=VCPU:1&member_of={agg}", "1.21")["provider_summaries"]) == [plain]
    assert (
        candidates(client, f"resources=VCPU:1&member_of={agg}&required=HW_CPU_X86_AVX2", "1.21")["allocation_requests"]
        == []
    )
    assert client.get("/allocation_candidates?resources=VCPU:1&required=CUSTOM_NOPE").status_code == 400
    assert client.get("/allocation_candidates?resources=CUSTOM_NOPE:1").status_code == 400
    assert client.get("/allocation_candidates").status_code == 400


def test_shared_nfs_pool_scenario(client):
    """Scenario 1: an NFS share provides DISK_GB to the compute nodes of racks 6-10."""
    aggregate = str(uuid.uuid4())
    nodes = [new_provider(client, f"r1rck0{rack}") for rack in (6, 7)]
    outside = new_provider(client, "r2rck01")
    for rp in (*nodes, outside):
        set_inventory(client, rp, VCPU={"total": 16}, MEMORY_MB={"total": 32768})
        if rp != outside:
            client.put(f"/resource_providers/{rp}/aggregates", json=[aggregate], headers=V1_18)
    nfs = new_provider(client, "/mnt/nfs/row1racks0610/")
    set_inventory(
        client,
        nfs,
        DISK_GB={"total": 100000, "reserved": 1000, "min_unit": 50, "max_unit": 10000, "step_size": 10},
    )
    share(client, nfs, aggregate)
    body = candidates(client, "resources=VCPU:2,MEMORY_MB:2048,DISK_GB:100")
    assert as_sets(body) == {
        frozenset({(rp, frozenset({("VCPU", 2), ("MEMORY_MB", 2048)})), (nfs, frozenset({("DISK_GB", 100)}))})
        for rp in nodes
    }
    assert body["provider_summaries"][nfs]["resources"]["DISK_GB"] == {"capacity": 99000, "used": 0}
    assert "MISC_SHARES_VIA_AGGREGATE" in body["provider_summaries"][nfs]["traits"]
    # step_size 10: 105 GB cannot be allocated from the share.
    assert candidates(client, "resources=VCPU:2,DISK_GB:105")["allocation_requests"] == []
    # Claim one candidate: the usage lands on the share.
    request = body["allocation_requests"][0]
    consumer = str(uuid.uuid4())
    claim = {**request, "project_id": "p", "user_id": "u"}
    assert client.put(f"/allocations/{consumer}", json=claim).status_code == 204
    assert client.get(f"/resource_providers/{nfs}/usages").json()["usages"] == {"DISK_GB": 100}
    # A node with local disk gets both options: local and shared.
    set_inventory(client, nodes[1], VCPU={"total": 16}, MEMORY_MB={"total": 32768}, DISK_GB={"total": 500})
    body = candidates(client, "resources=VCPU:1,DISK_GB:100")
    with_node1 = [r for r in body["allocation_requests"] if nodes[1] in r["allocations"]]
    assert len(with_node1) == 2
    # The share alone satisfies a disk-only request.
    only_disk = candidates(client, "resources=DISK_GB:100")
    assert frozenset({(nfs, frozenset({("DISK_GB", 100)}))}) in as_sets(only_disk)


def test_routed_network_segment_scenario(client):
    """Scenario 2a: a routed segment's IPv4 pool serves the hosts of row 3, rack 1."""
    rack = str(uuid.uuid4())
    hosts = [new_provider(client, f"r3rck1-{i}") for i in range(2)]
    elsewhere = new_provider(client, "r4rck1-0")
    for rp in (*hosts, elsewhere):
        set_inventory(client, rp, VCPU={"total": 4}, MEMORY_MB={"total": 8192})
    for rp in hosts:
        client.put(f"/resource_providers/{rp}/aggregates", json=[rack], headers=V1_18)
    subnet = str(uuid.uuid4())
    segment = new_provider(client, "routed network rack 1 row 3", uuid=subnet)
    set_inventory(
        client,
        segment,
        IPV4_ADDRESS={"total": 254, "reserved": 5, "min_unit": 1, "max_unit": 1, "step_size": 1},
    )
    share(client, segment, rack)
    body = candidates(client, "resources=VCPU:1,MEMORY_MB:512,IPV4_ADDRESS:1")
    anchors = {rp for request in body["allocation_requests"] for rp in request["allocations"]} - {subnet}
    assert anchors == set(hosts)
    assert body["provider_summaries"][subnet]["resources"]["IPV4_ADDRESS"]["capacity"] == 249
    # max_unit 1: nobody gets two addresses at once.
    assert candidates(client, "resources=VCPU:1,IPV4_ADDRESS:2")["allocation_requests"] == []
    # member_of narrows the compute nodes, the share still comes along.
    narrowed = candidates(client, f"resources=VCPU:1,IPV4_ADDRESS:1&member_of={rack}", "1.21")
    assert len(narrowed["allocation_requests"]) == 2


def test_required_traits_still_apply_when_a_sharing_provider_cannot_help(client):
    """Regression: with a sharing provider in the database that offers none of the
    requested classes, the required traits were ignored for the compute nodes."""
    avx, plain = new_provider(client, "avx"), new_provider(client, "plain")
    for rp in (avx, plain):
        set_inventory(client, rp, VCPU={"total": 8}, MEMORY_MB={"total": 1024})
    generation = client.get(f"/resource_providers/{avx}").json()["generation"]
    body = {"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": generation}
    assert client.put(f"/resource_providers/{avx}/traits", json=body).status_code == 200
    segment = new_provider(client, "segment")
    set_inventory(client, segment, IPV4_ADDRESS={"total": 254})
    share(client, segment, str(uuid.uuid4()))
    found = candidates(client, "resources=VCPU:1,MEMORY_MB:512&required=HW_CPU_X86_AVX2")
    assert as_sets(found) == {frozenset({(avx, frozenset({("VCPU", 1), ("MEMORY_MB", 512)}))})}
    assert list(found["provider_summaries"]) == [avx]


def test_limit_on_the_single_provider_path_is_the_first_of_the_whole_answer(client):
    """With ``limit`` the single-provider path picks its providers walking them in order
    (the work stops at the limit); the answer is still the first ``limit`` candidates
    of the answer without it, whatever the traits, aggregates and capacity say."""
    import random

    rnd = random.Random(7)  # noqa: S311 - a reproducible cloud
    aggregates = [str(uuid.UUID(int=i + 1)) for i in range(3)]
    for trait in ("CUSTOM_A", "CUSTOM_B"):
        assert client.put(f"/traits/{trait}").status_code in (201, 204)
    for index in range(40):
        rp = new_provider(client, f"p{index}")
        inventory = {"VCPU": {"total": rnd.choice([1, 2, 4])}, "MEMORY_MB": {"total": rnd.choice([256, 1024])}}
        if rnd.random() < 0.2:
            inventory["DISK_GB"] = {"total": 10}  # a class nobody asks for: 1.27 summaries show it
        set_inventory(client, rp, **inventory)
        chosen = rnd.sample(aggregates, rnd.randint(0, 2))
        if chosen:
            client.put(f"/resource_providers/{rp}/aggregates", json=chosen, headers=V1_18)
        traits = rnd.sample(["CUSTOM_A", "CUSTOM_B"], rnd.randint(0, 2))
        if traits:
            generation = client.get(f"/resource_providers/{rp}").json()["generation"]
            body = {"traits": traits, "resource_provider_generation": generation}
            assert client.put(f"/resource_providers/{rp}/traits", json=body).status_code == 200
    queries = [
        "resources=VCPU:2",
        "resources=VCPU:1,MEMORY_MB:512",
        "resources=VCPU:1&required=CUSTOM_A",
        "resources=VCPU:1&required=CUSTOM_A,!CUSTOM_B",
        "resources=VCPU:1&required=in:CUSTOM_A,CUSTOM_B",
        f"resources=VCPU:1&member_of={aggregates[0]}",
        f"resources=VCPU:1&member_of=in:{aggregates[0]},{aggregates[1]}&member_of={aggregates[2]}",
        f"resources=MEMORY_MB:1024&member_of=!{aggregates[1]}&required=!CUSTOM_A",
    ]
    for version in ("1.24", "1.27", "1.39"):
        for query in queries:
            if version != "1.39" and ("in:CUSTOM" in query or "member_of=!" in query):
                continue
            whole = candidates(client, query, version)
            for limit in (1, 3, 1000):
                cut = candidates(client, f"{query}&limit={limit}", version)
                assert cut["allocation_requests"] == whole["allocation_requests"][:limit], (version, query, limit)
                kept = {rp for request in cut["allocation_requests"] for rp in request["allocations"]}
                assert cut["provider_summaries"] == {rp: whole["provider_summaries"][rp] for rp in kept}


def test_member_of_applies_to_a_sharing_provider_itself(client):
    """A sharing provider lends to a tree only when it is in the requested aggregates
    itself: the anchor's membership does not carry over to it (as upstream answers
    its gabbit for bug 1792503)."""
    agg_a, agg_c = str(uuid.uuid4()), str(uuid.uuid4())
    node = new_provider(client, "cn1")
    set_inventory(client, node, VCPU={"total": 8})
    client.put(f"/resource_providers/{node}/aggregates", json=[agg_a, agg_c], headers=V1_18)
    in_a, in_c = new_provider(client, "ss1"), new_provider(client, "ss2")
    for rp, aggregate in ((in_a, agg_a), (in_c, agg_c)):
        set_inventory(client, rp, DISK_GB={"total": 2000})
        share(client, rp, aggregate)
    query = "resources=VCPU:1,DISK_GB:100"

    def answer(member_of: str) -> set:
        return as_sets(candidates(client, f"{query}&member_of={member_of}", "1.32"))

    def pair(share_rp: str) -> frozenset:
        return frozenset({(node, frozenset({("VCPU", 1)})), (share_rp, frozenset({("DISK_GB", 100)}))})

    assert as_sets(candidates(client, query, "1.32")) == {pair(in_a), pair(in_c)}
    assert answer(agg_a) == {pair(in_a)}
    assert answer(agg_c) == {pair(in_c)}
    assert answer(f"in:{agg_a},{agg_c}") == {pair(in_a), pair(in_c)}
    assert answer(f"{agg_a}&member_of={agg_c}") == set()
    # A forbidden aggregate on the anchor rules out every share it would borrow.
    assert answer(f"!{agg_c}") == set()


def test_summaries_list_traits_in_trait_id_order(client):
    """Standard traits first, custom ones in the order they were created, as upstream
    lists them: on the one-provider path and with a sharing provider alike."""
    for name in ("CUSTOM_ZEBRA", "CUSTOM_APPLE"):
        assert client.put(f"/traits/{name}").status_code == 201
    node = new_provider(client, "cn1")
    set_inventory(client, node, VCPU={"total": 8})
    generation = client.get(f"/resource_providers/{node}").json()["generation"]
    body = {"traits": ["CUSTOM_APPLE", "HW_CPU_X86_AVX2", "CUSTOM_ZEBRA"], "resource_provider_generation": generation}
    assert client.put(f"/resource_providers/{node}/traits", json=body).status_code == 200
    listed = ["HW_CPU_X86_AVX2", "CUSTOM_ZEBRA", "CUSTOM_APPLE"]
    assert candidates(client, "resources=VCPU:1")["provider_summaries"][node]["traits"] == listed
    aggregate = str(uuid.uuid4())
    client.put(f"/resource_providers/{node}/aggregates", json=[aggregate], headers=V1_18)
    disk = new_provider(client, "ss1")
    set_inventory(client, disk, DISK_GB={"total": 100})
    share(client, disk, aggregate, "CUSTOM_APPLE", "STORAGE_DISK_SSD")
    summaries = candidates(client, "resources=VCPU:1,DISK_GB:10")["provider_summaries"]
    assert summaries[node]["traits"] == listed
    assert summaries[disk]["traits"] in (
        ["MISC_SHARES_VIA_AGGREGATE", "STORAGE_DISK_SSD", "CUSTOM_APPLE"],
        ["STORAGE_DISK_SSD", "MISC_SHARES_VIA_AGGREGATE", "CUSTOM_APPLE"],
    )


def test_isolate_sums_each_candidate_on_its_own(client):
    """The unsuffixed group and two isolated numbered groups, one class, one tree:
    each candidate takes 1 per group.  Upstream adds a numbered group's amount into
    the unsuffixed group's own entry, shared by other candidates, and answers 14
    candidates with amounts up to 5 where 18 candidates of 1 + 1 (+ 1) fit."""
    node = new_provider(client, "cn")
    children = [new_provider(client, f"numa{n}", parent_provider_uuid=node) for n in (1, 2)]
    for rp in (node, *children):
        set_inventory(client, rp, VCPU={"total": 4})
    query = "resources=VCPU:1&resources1=VCPU:1&resources2=VCPU:1&group_policy=isolate"
    requests = candidates(client, query, "1.34")["allocation_requests"]
    assert len(requests) == 18
    for request in requests:
        taken = {rp: entry["resources"]["VCPU"] for rp, entry in request["allocations"].items()}
        mapped = [rp for rps in request["mappings"].values() for rp in rps]
        assert taken == {rp: mapped.count(rp) for rp in set(mapped)}
        assert request["mappings"]["1"] != request["mappings"]["2"]
