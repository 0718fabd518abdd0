"""Microversions 1.18 and later, each as OpenStack Placement's
rest_api_version_history defines it (the older ones are in test_api.py)."""

from __future__ import annotations

import uuid

import httpx

from .test_api import error_code, new_provider, set_inventory


def at(version: str) -> dict:
    return {"openstack-api-version": f"placement {version}"}


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
    assert client.get(missing, headers=at("1.23")).json()["errors"][0]["code"] == (
        "placement.resource_provider.not_found"
    )
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
    assert client.get("/allocation_candidates?resources_X=VCPU:1", headers=at("1.25")).status_code == 400
    # 1.27: provider summaries show every class of the provider, before only the requested ones.
    old = candidates(client, "resources=VCPU:1", "1.26")["provider_summaries"]
    assert set(old[a]["resources"]) == {"VCPU"}
    new = candidates(client, "resources=VCPU:1", "1.27")["provider_summaries"]
    assert new[a]["resources"] == {"DISK_GB": {"capacity": 100, "used": 0}, "VCPU": {"capacity": 8, "used": 0}}
    assert new[b]["resources"] == {"VCPU": {"capacity": 1, "used": 0}}
    granular = candidates(client, "resources1=VCPU:1", "1.27")["provider_summaries"]
    assert set(granular[a]["resources"]) == {"VCPU", "DISK_GB"}
